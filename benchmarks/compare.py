"""tunekit against the obvious alternatives, measured side by side in one run.

1. ``tunekit sweep CONFIG`` (staged), timed.
2. ``tunekit sweep`` with ``--strategy grid`` on a reduced space (``--grid-set`` overrides), timed.
3. Four configs re-measured back to back with ``tunekit trial`` (``--repeats`` rounds, interleaved): PyTorch
   defaults (0 workers, no pinning), a common hand-tuned config (workers = CPU count, pinned + non_blocking, batch
   256), the staged recommendation, and the grid's best.

    python benchmarks/compare.py configs/resnet.yaml --grid-set 'search.num_workers=[0,4,8,12,16]' \
        --grid-set 'search.batch_size=[256,512]' --grid-set 'search.compile=[none]' --out results/compare

Prints a table and writes compare.csv. Targets: recommendation >= 0.97 x grid best; staged sweep time <= 0.10 x
the full grid's time (estimated as full-grid trial count x the mean grid trial time when the full grid is too long).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tunekit import config as config_mod
from tunekit import load_recommended, plan


def _sweep(config: Path, out: Path, *extra: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tunekit", "sweep", str(config), "--out", str(out), "--no-resume",
                    "--quiet", *extra], check=False)
    return time.perf_counter() - t0


def _trial(config: Path, out: Path, knobs: dict[str, Any]) -> dict:
    cmd = [sys.executable, "-m", "tunekit", "trial", str(config), "--out", str(out)]
    for key, value in knobs.items():
        cmd += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    subprocess.run(cmd, capture_output=True, text=True, check=False)
    latest = max((out / "trials").iterdir(), key=lambda p: int(p.name))
    return json.loads((latest / "measurement.json").read_text())


def _set_dotted(raw: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        raw = raw.setdefault(part, {})
    raw[last] = value


def _knobs(rec_path: Path) -> dict[str, Any] | None:
    if not rec_path.exists():
        return None
    rec = load_recommended(rec_path)
    knobs = {"num_workers": rec.num_workers, "pin_memory": rec.pin_memory, "batch_size": rec.batch_size,
             "grad_accum": rec.grad_accum, "compile": rec.compile}
    if rec.num_workers:
        knobs["prefetch_factor"] = rec.prefetch_factor
    return knobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("--grid-set", action="append", default=[], help="KEY=YAML override for the grid run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hand-batch", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("results/compare"))
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(args.config.read_text())
    for item in args.grid_set:
        key, _, value = item.partition("=")
        _set_dotted(raw, key, yaml.safe_load(value))
    grid_config = out / "grid.yaml"
    grid_config.write_text(yaml.safe_dump(raw, sort_keys=False))

    staged_s = _sweep(args.config, out / "staged")
    grid_s = _sweep(grid_config, out / "grid", "--strategy", "grid")
    staged_trials = list(csv.DictReader(open(out / "staged" / "trials.csv")))
    grid_trials = list(csv.DictReader(open(out / "grid" / "trials.csv")))
    cfg = config_mod.load(args.config, check_imports=False)
    full_grid = len(plan.next_requests(cfg, [], strategy="grid", cuda=True))
    mean_grid_trial = statistics.fmean(float(t["launcher_wall_s"]) for t in grid_trials if t.get("launcher_wall_s"))

    cpus = len(os.sched_getaffinity(0))
    candidates = {
        "PyTorch defaults": {"num_workers": 0, "pin_memory": False, "batch_size": args.hand_batch},
        "hand-tuned": {"num_workers": cpus, "prefetch_factor": 2, "pin_memory": True, "batch_size": args.hand_batch},
        "tunekit staged": _knobs(out / "staged" / "recommended.yaml"),
        "grid best": _knobs(out / "grid" / "recommended.yaml"),
    }
    measured: dict[str, list[float]] = {k: [] for k, v in candidates.items() if v is not None}
    for _ in range(args.repeats):  # interleaved, so drift hits every config alike
        for name in measured:
            m = _trial(args.config, out / "side-by-side" / name.replace(" ", "-"), candidates[name])
            if m["status"] == "ok":
                measured[name].append(m["samples_per_s"])
    rates = {k: statistics.median(v) for k, v in measured.items() if v}
    grid_best = rates.get("grid best")
    rows = [{"config": k, "knobs": json.dumps(candidates[k]), "samples_per_s": round(v, 1),
             "vs_grid_best": round(v / grid_best, 3) if grid_best else None} for k, v in rates.items()]
    rows.append({"config": "staged sweep wall time (s)", "knobs": f"{len(staged_trials)} trials",
                 "samples_per_s": round(staged_s, 1), "vs_grid_best": None})
    rows.append({"config": "reduced grid wall time (s)", "knobs": f"{len(grid_trials)} trials",
                 "samples_per_s": round(grid_s, 1), "vs_grid_best": None})
    rows.append({"config": "full grid, estimated (s)", "knobs": f"{full_grid} trials x {mean_grid_trial:.1f} s",
                 "samples_per_s": round(full_grid * mean_grid_trial, 1),
                 "vs_grid_best": round(staged_s / (full_grid * mean_grid_trial), 3)})
    with open(out / "compare.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("config | knobs | samples/s (or seconds) | ratio")
    for r in rows:
        print(f"{r['config']} | {r['knobs']} | {r['samples_per_s']} | {r['vs_grid_best']}")


if __name__ == "__main__":
    main()
