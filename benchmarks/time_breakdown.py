"""Where a sweep's time goes: start-up, CUDA init, build, loader start, warm-up, measurement, teardown and the
rest, per stage and in all.

    python benchmarks/time_breakdown.py results/h200-resnet50-final-2026-11-29 [more run folders]

Reads every trial's measurement.json (what the worker timed, and the launcher's wall time of the whole
subprocess) and prints one table per run:

- per stage: trials, wall seconds, and the share of each part;
- the whole: trials per minute of trial wall time, and measurement as a share of it.

"Loader start" is making the DataLoader and starting its iterator (its workers) up to the warm-up, with a compute
trial's staging of its batch; "teardown" from the last window to the end of the worker's trial (device memory
read, a multi-rank DDP trial's gradient-sync probe, the loader's workers stopped, the monitor stopped). "Other" is
the launcher's wall time minus the parts the worker timed: interpreter exit, process reaping, and whatever the
worker did not time (measurements written before the worker timed loader start and teardown keep those in
"other"). Skipped trials cost nothing and are not counted. Below the table, the sweep's own wall time from
sweep.json (each invocation of a resumed sweep, the dataset's preparation among it, and what went between the
trials). Writes time_breakdown.csv beside each run's report when ``--write`` is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _common import write_csv

from tunekit._files import read_json
from tunekit.contract import Measurement

PARTS = ("startup_s", "cuda_init_s", "build_s", "loop_setup_s", "warmup_s", "measured_s", "teardown_s")


def _trial_parts(m: Measurement) -> dict[str, float]:
    wall = float(m.launcher_wall_s or 0.0)
    parts = {p: float(getattr(m, p) or 0.0) for p in PARTS}
    parts["other_s"] = max(0.0, wall - sum(parts.values()))
    parts["wall_s"] = wall
    return parts


def breakdown(run: Path) -> list[dict[str, Any]]:
    """One row per stage and one for the whole run: trials, wall seconds, and each part's seconds and share."""
    by_stage: dict[str, list[dict[str, float]]] = {}
    for path in sorted((run / "trials").glob("*/measurement.json"), key=lambda p: int(p.parent.name)):
        m = Measurement.from_dict(read_json(path))
        if m.status == "skipped" or not m.launcher_wall_s:
            continue
        by_stage.setdefault(m.stage, []).append(_trial_parts(m))
    rows = []
    everything = [t for ts in by_stage.values() for t in ts]
    for stage, trials in [*by_stage.items(), ("all", everything)]:
        wall = sum(t["wall_s"] for t in trials)
        row: dict[str, Any] = {"run": run.name, "stage": stage, "trials": len(trials), "wall_s": round(wall, 1)}
        for part in (*PARTS, "other_s"):
            seconds = sum(t[part] for t in trials)
            row[part] = round(seconds, 1)
            row[part.removesuffix("_s") + "_share"] = round(seconds / wall, 3) if wall else None
        row["trials_per_min"] = round(len(trials) / wall * 60, 2) if wall else None
        rows.append(row)
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    head = [
        "stage",
        "trials",
        "wall s",
        "start-up",
        "CUDA init",
        "build",
        "loader start",
        "warm-up",
        "measured",
        "teardown",
        "other",
        "trials/min",
    ]
    print(f"\n{rows[0]['run']}\n| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for r in rows:
        shares = [f"{r[p.removesuffix('_s') + '_share'] or 0:.0%}" for p in (*PARTS, "other_s")]
        print(f"| {r['stage']} | {r['trials']} | {r['wall_s']} | " + " | ".join(shares) + f" | {r['trials_per_min']} |")


def sweep_wall(run: Path, trial_wall_s: float) -> str | None:
    """The sweep's wall time as sweep.json records it, per invocation, and the part outside the trials. An
    invocation that finished no new trial and was not interrupted (a rerun of a finished sweep) is named apart."""
    path = run / "sweep.json"
    calls = read_json(path).get("invocations", []) if path.exists() else []
    if not calls:
        return None
    ran, idle, seen = [], [], 0
    for c in calls:
        (ran if c.get("trials", 0) > seen or c.get("interrupted") else idle).append(c)
        seen = max(seen, c.get("trials", 0))
    wall = sum(c["wall_s"] for c in ran)
    dataset = sum(c.get("dataset_s", 0.0) for c in ran)
    each = " + ".join(f"{c['wall_s']:.0f}" for c in ran)
    line = (
        f"sweep wall time {wall:.0f} s ({wall / 60:.1f} min) in {len(ran)} invocation(s) ({each} s): "
        f"trials {trial_wall_s:.0f} s, dataset preparation {dataset:.0f} s, the rest (planning, recording, "
        f"the environment snapshot) {max(0.0, wall - trial_wall_s - dataset):.0f} s; outputs excluded"
    )
    if idle:
        rerun = " + ".join(f"{c['wall_s']:.0f}" for c in idle)
        line += f"; {len(idle)} more invocation(s) found nothing left to run ({rerun} s)"
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--write", action="store_true", help="write time_breakdown.csv into each run folder")
    args = ap.parse_args(argv)
    for run in args.runs:
        rows = breakdown(run)
        if not rows or not rows[-1]["trials"]:
            print(f"{run}: no launched trials", file=sys.stderr)
            continue
        _print(rows)
        line = sweep_wall(run, rows[-1]["wall_s"])
        if line:
            print(line)
        if args.write:
            write_csv(run / "time_breakdown.csv", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
