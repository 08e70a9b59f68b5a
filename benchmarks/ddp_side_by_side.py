"""Workers per rank on a multi-GPU host: tunekit's recommendation against the rules people use, in one run.

Re-measures, back to back with ``tunekit trial`` at the config's ``launch`` ranks (``--repeats`` interleaved rounds):

1. tunekit: the multi-rank sweep's recommendation (``--run DIR``'s recommended.yaml);
2. Lightning's rule: ``cpus // local_world_size - 1`` workers per rank, the rest as recommended;
3. the single-GPU knee reused on every rank (``--single-gpu`` recommended.yaml of a one-GPU sweep);
4. PyTorch defaults: 0 workers, no pinning, at the recommended batch.

    R=results/h200x2-resnet50-ddp-2026-11-30
    python benchmarks/ddp_side_by_side.py configs/resnet-ddp.yaml --run $R --repeats 2 \
        --single-gpu results/h200-resnet50-final-2026-11-29/recommended.yaml --out $R/side-by-side

Writes side-by-side.csv and side-by-side.md (global samples/s, per GPU, workers, host memory) into ``--out``.
Targets: tunekit >= 1.0 x the Lightning rule's throughput with no more workers per rank than it uses.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from _common import run_trial, write_csv

from tunekit import config as config_mod
from tunekit import load_recommended
from tunekit._files import write_text_atomic
from tunekit.contract import Measurement


def _knobs(rec_path: Path) -> dict[str, Any]:
    rec = load_recommended(rec_path)
    return {
        "num_workers": rec.num_workers,
        "prefetch_factor": rec.prefetch_factor or 2,
        "pin_memory": rec.pin_memory,
        "batch_size": rec.batch_size,
        "grad_accum": rec.grad_accum,
        "compile": rec.compile,
    }


def contenders(cfg: config_mod.Config, run: Path, single_gpu: Path | None) -> dict[str, dict[str, Any]]:
    """The configs to compare, by name: every one at the config's ranks."""
    ours = _knobs(run / "recommended.yaml")
    lightning = max(0, config_mod.cpu_count() // cfg.launch.nproc_per_node - 1)
    out = {"tunekit": ours, f"Lightning rule ({lightning}/rank)": {**ours, "num_workers": lightning}}
    if single_gpu is not None:
        out["single-GPU knee per rank"] = _knobs(single_gpu)
    out["PyTorch defaults"] = {**ours, "num_workers": 0, "pin_memory": False}
    return {name: {**k, "ranks": cfg.launch.world} for name, k in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--run", type=Path, required=True, help="the finished multi-rank sweep")
    ap.add_argument("--single-gpu", type=Path, help="recommended.yaml of a one-GPU sweep of the same workload")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    cfg = config_mod.load(args.config)
    configs = contenders(cfg, args.run, args.single_gpu)
    measured: dict[str, list[Measurement]] = {name: [] for name in configs}
    for round_ in range(args.repeats):
        for name, knobs in configs.items():
            sets = [
                f"{k}={'none' if v is None else v}"
                for k, v in knobs.items()
                if not (k == "prefetch_factor" and knobs["num_workers"] == 0)
            ]
            m, _ = run_trial(args.config, args.out / "trials", sets)
            measured[name].append(m)
            print(f"round {round_ + 1} {name}: {m.status} {m.rate or 0:.1f} {m.unit or 'samples'}/s", file=sys.stderr)
            rows = _table(configs, measured)  # after every trial: a cut-off run keeps what it measured
            write_csv(args.out / "side-by-side.csv", rows)
            write_text_atomic(args.out / "side-by-side.md", _markdown(rows, cfg))
    print(_markdown(_table(configs, measured), cfg))
    return 0


def _table(configs: dict[str, dict[str, Any]], measured: dict[str, list[Measurement]]) -> list[dict[str, Any]]:
    """side-by-side.csv's rows (its ``samples_per_s`` column, named as in the committed tables, is the rate)."""
    ours = None
    rows = []
    for name, knobs in configs.items():
        if not measured[name]:
            continue
        ok = [m for m in measured[name] if m.status == "ok"]
        rate = statistics.median(m.rate for m in ok) if ok else None
        ours = rate if name == "tunekit" else ours
        host = max((m.host_mem_peak_bytes or 0 for m in ok), default=0)
        rows.append(
            {
                "config": name,
                "workers_per_rank": knobs["num_workers"],
                "workers_total": knobs["num_workers"] * knobs["ranks"],
                "batch": knobs["batch_size"],
                "pinned": knobs["pin_memory"],
                "samples_per_s": rate,
                "per_gpu": None if rate is None else rate / knobs["ranks"],
                "vs_tunekit": None if rate is None or not ours else rate / ours,
                "host_mem_gib": host / 2**30 if host else None,
                "runs": len(measured[name]),
                "failed": len(measured[name]) - len(ok),
                # the same knobs under another name: their gap is the machine's run-to-run spread
                "same_as": next(
                    (
                        other
                        for other, k in configs.items()
                        if other != name and k == knobs and list(configs).index(other) < list(configs).index(name)
                    ),
                    None,
                ),
            }
        )
    return rows


def _markdown(rows: list[dict[str, Any]], cfg: config_mod.Config) -> str:
    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    out = [
        f"{cfg.launch.world} ranks, {config_mod.cpu_count()} CPUs",
        "",
        "| config | workers/rank | workers | batch | pinned | samples/s | per GPU | vs tunekit | host memory |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        same = f" (the same config as {r['same_as']})" if r.get("same_as") else ""
        out.append(
            f"| {r['config']}{same} | {r['workers_per_rank']} | {r['workers_total']} | {r['batch']} | "
            f"{'yes' if r['pinned'] else 'no'} | {f(r['samples_per_s'], ',.1f')} | {f(r['per_gpu'], ',.1f')} | "
            f"{f(r['vs_tunekit'], '.3f')} | {f(r['host_mem_gib'], '.1f')} GiB |"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
