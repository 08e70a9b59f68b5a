"""Fidelity: does a short trial measure what a 10x longer run of the same config measures?

For each worker count, runs ``tunekit trial`` three times through the real CLI, back to back: the short trial as
configured, the reference (``trial.window_s`` multiplied by ``--factor``, exactly ``trial.measure_windows``
windows), and the short trial again. The ratio is the mean of the two short trials over the long one: a host whose
CPUs drift between runs (the GPU machines' shared hosts move ±5 % over minutes) shifts the short trial before and
after the long one in opposite directions around it, so drift that is steady over the three cancels, and the
column ``drift`` (second short over first, minus one) shows how far the host moved. The table (also written as
CSV) carries the trial's other figures too (data wait, GPU busy, NVML utilization, memory, warm-up).

    python benchmarks/trial_fidelity.py configs/resnet.yaml --workers 0 16 --batch 256 --out results/fidelity

Target: |ratio - 1| <= 3 %. The table is rewritten after each worker count; rerun with the same --out, the
command reuses the worker counts whose three trials it completed and measures the rest (all three again for a
count cut in the middle: they must run back to back).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml
from _common import merged_sets, run_trial, write_csv

from tunekit._files import read_json
from tunekit.contract import Measurement


def _row(workers: int, short: Measurement, long: Measurement, after: Measurement) -> dict:
    """One row of fidelity.csv (its columns keep the names of the committed tables: samples_per_s is the rate)."""
    gib = 2**30
    ok = short.status == long.status == after.status == "ok"
    return {
        "workers": workers,
        "status": f"{short.status}/{long.status}/{after.status}",
        "samples_per_s": short.rate,
        "samples_per_s_long": long.rate,
        "samples_per_s_after": after.rate,
        "ratio": (short.rate + after.rate) / 2 / long.rate if ok else None,
        "drift": after.rate / short.rate - 1 if ok else None,
        "noise_cv": short.noise_cv,
        "data_wait_frac": short.data_wait_frac,
        "gpu_busy_frac": short.gpu_busy_frac,
        "nvml_util_pct": short.nvml_util_gpu_pct,
        "peak_reserved_gib": (short.device_mem_peak_reserved_bytes or 0) / gib,
        "headroom": short.headroom,
        "host_mem_gib": (short.host_mem_peak_bytes or 0) / gib,
        "cpu_cores": short.cpu_util_cores,
        "warmup_s": short.warmup_s,
        "measured_s": short.measured_s,
        "measured_s_long": long.measured_s,
        "device": short.device_name,
    }


def _measured(folder: Path) -> Measurement | None:
    """A completed trial this command left in ``folder`` before (rerun with the same --out, it resumes)."""
    found = sorted(folder.glob("trials/*/measurement.json"))
    if not found:
        return None
    m = Measurement.from_dict(read_json(found[-1]))
    return m if m.status == "ok" else None


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 16])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--set", dest="sets", action="append", default=[], help="extra --set for every trial")
    parser.add_argument("--out", default="results/fidelity")
    args = parser.parse_args()
    window = yaml.safe_load(Path(args.config).read_text()).get("trial", {}).get("window_s", 3.0)
    out = Path(args.out)
    rows = []
    for workers in args.workers:
        base = [f"num_workers={workers}", f"batch_size={args.batch}", f"pin_memory={str(workers > 0).lower()}"]
        # the reference: windows --factor times longer, exactly measure_windows of them (no precision stop)
        longer = [f"trial.window_s={window * args.factor}", "trial.precision=null"]
        runs = {
            f"w{workers}": merged_sets(base, args.sets),
            f"w{workers}-long": merged_sets(base, args.sets, longer),
            f"w{workers}-after": merged_sets(base, args.sets),
        }
        done = [_measured(out / name) for name in runs]
        if any(m is None for m in done):  # the three back to back, or the drift between them means nothing
            done = [run_trial(args.config, out / name, sets, echo=True)[0] for name, sets in runs.items()]
        short, long, after = done
        rows.append(_row(workers, short, long, after))
        write_csv(out / "fidelity.csv", rows)  # row by row: a run cut by a time limit keeps what it measured
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(_fmt(row[k]) for k in keys))


if __name__ == "__main__":
    main()
