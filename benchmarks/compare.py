"""tunekit against the obvious alternatives, measured side by side in one run.

1. ``tunekit sweep CONFIG`` (staged), timed.
2. ``tunekit sweep`` with ``--strategy grid`` on a reduced space (``--grid-set`` overrides), timed.
3. Four configs re-measured back to back with ``tunekit trial`` (``--repeats`` rounds, interleaved): PyTorch
   defaults (0 workers, no pinning), a common hand-tuned config (workers = CPU count, pinned + non_blocking, batch
   256), the staged recommendation, and the grid's best.

    python benchmarks/compare.py configs/resnet.yaml --grid-set 'search.num_workers=[0,4,8,12,16]' \
        --grid-set 'search.batch_size=[256,512]' --grid-set 'search.compile=[none]' --out results/compare

With ``--staged-run DIR --grid-run DIR`` it skips both sweeps and re-measures the configs of two finished runs
(their wall times then come from the runs' trials). The grid's entry is its best trial, not its knee.

Prints a table and writes compare.csv (rewritten after every trial, so a cut-off run keeps what it measured). Run
again with the same ``--out``, it resumes: trials already in ``side-by-side/`` with the same knobs count towards
``--repeats``, and only the missing rounds run (``--table-only`` runs none and only rebuilds the table). The
table pools every finished trial of a config, so a config re-measured by hand has more runs than the others.
Targets: recommendation >= 0.97 x grid best; staged sweep time <= 0.10 x the full grid's time (estimated as
full-grid trial count x the mean grid trial time when the full grid is too long).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import run_trial, write_csv

from tunekit import config as config_mod
from tunekit import load_recommended, plan, rules
from tunekit.contract import Measurement


def _sweep(config: Path, out: Path, *extra: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tunekit", "sweep", str(config), "--out", str(out), "--no-resume", "--quiet", *extra],
        check=False,
    )
    return time.perf_counter() - t0


def _previous(trials_dir: Path, knobs: dict[str, Any]) -> tuple[int, list[float]]:
    """Trials of an earlier, cut-off compare with these knobs: how many finished, and the rates of the ok ones."""
    done, rates, others = 0, [], 0
    paths = [p for p in trials_dir.glob("*/measurement.json") if p.parent.name.isdigit()] if trials_dir.is_dir() else []
    for path in sorted(paths, key=lambda p: int(p.parent.name)):
        m = Measurement.from_dict(json.loads(path.read_text()))
        if any(m.params.get(k) != v for k, v in knobs.items()):
            others += 1  # another config under the same name (the recommendation changed): not a round of this one
            continue
        done += 1
        if m.status == "ok":
            rates.append(m.rate)
    if others:
        print(
            f"{trials_dir}: {others} earlier trial(s) ran other knobs than {json.dumps(knobs)}; not counted",
            file=sys.stderr,
        )
    return done, rates


def _best_knobs(run: Path) -> dict[str, Any] | None:
    """The knobs of the fastest completed trial of a run (trials.csv)."""
    ok = [
        t
        for t in csv.DictReader(open(run / "trials.csv"))
        if t["status"] == "ok" and t.get("stage") in rules.KNEE_STAGES
    ]
    if not ok:
        return None
    t = max(ok, key=lambda t: float(t["rate"]))
    knobs = {
        "num_workers": int(t["num_workers"]),
        "pin_memory": t["pin_memory"] == "True",
        "batch_size": int(t["batch_size"]),
        "grad_accum": int(t["grad_accum"]),
        "compile": t["compile"],
    }
    if knobs["num_workers"]:
        knobs["prefetch_factor"] = int(float(t["prefetch_factor"]))
    return knobs


def _trial_time(run: Path) -> float:
    """A finished run's trial time: the sum of its trials' launcher wall times."""
    trials = csv.DictReader(open(run / "trials.csv"))
    return sum(float(t["launcher_wall_s"]) for t in trials if t.get("launcher_wall_s"))


def _full_grid_estimate(modes: list[str], grid_trials: list[dict], staged_trials: list[dict]) -> tuple[float, str]:
    """The full grid's time, too long to run: its trials counted per compile mode, times the mean trial time of that
    mode in the reduced grid run, or in the staged run for a mode the reduced grid left out (a compiled trial takes
    its compile warm-up on top: pricing it as an eager one would shrink the grid and flatter nobody)."""

    def mean(trials: list[dict], mode: str) -> float | None:
        times = [
            float(t["launcher_wall_s"])
            for t in trials
            if t.get("launcher_wall_s") and t["status"] != "skipped" and t.get("compile", "none") == mode
        ]
        return statistics.fmean(times) if times else None

    total, parts = 0.0, []
    for mode in sorted(set(modes), key=modes.index):
        n = modes.count(mode)
        per, source = mean(grid_trials, mode), "grid"
        if per is None:
            per, source = mean(staged_trials, mode), "staged"
        if per is None:  # measured nowhere: price it as the reduced grid's mean trial
            walls = [float(t["launcher_wall_s"]) for t in grid_trials if t.get("launcher_wall_s")]
            per, source = (statistics.fmean(walls), "grid, all modes") if walls else (0.0, "unmeasured")
        total += n * per
        parts.append(f"{n} x {per:.1f} s (compile {mode}, {source})")
    return total, " + ".join(parts)


def _knobs(rec_path: Path) -> dict[str, Any] | None:
    if not rec_path.exists():
        return None
    rec = load_recommended(rec_path)
    knobs = {
        "num_workers": rec.num_workers,
        "pin_memory": rec.pin_memory,
        "batch_size": rec.batch_size,
        "grad_accum": rec.grad_accum,
        "compile": rec.compile,
    }
    if rec.num_workers:
        knobs["prefetch_factor"] = rec.prefetch_factor
    return knobs


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("--grid-set", action="append", default=[], help="KEY=YAML override for the grid run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hand-batch", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("results/compare"))
    parser.add_argument("--staged-run", type=Path, help="reuse this finished staged run instead of sweeping")
    parser.add_argument("--grid-run", type=Path, help="reuse this finished grid run instead of sweeping")
    parser.add_argument("--hand-workers", type=int, help="workers of the hand-tuned config (default: the CPU count)")
    parser.add_argument("--table-only", action="store_true", help="run no trial; tabulate those in --out")
    args = parser.parse_args()
    if bool(args.staged_run) != bool(args.grid_run):
        parser.error("--staged-run and --grid-run go together")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def _runs(args: argparse.Namespace) -> tuple[Path, Path, float, float]:
    """The staged and grid runs (swept now, or given) and their times."""
    if args.staged_run and args.grid_run:
        return args.staged_run, args.grid_run, _trial_time(args.staged_run), _trial_time(args.grid_run)
    raw = yaml.safe_load(args.config.read_text())
    for item in args.grid_set:
        key, _, value = item.partition("=")
        config_mod.set_dotted(raw, key, yaml.safe_load(value))
    grid_config = args.out / "grid.yaml"
    grid_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    staged_dir, grid_dir = args.out / "staged", args.out / "grid"
    staged_s = _sweep(args.config, staged_dir)
    grid_s = _sweep(grid_config, grid_dir, "--strategy", "grid")
    return staged_dir, grid_dir, staged_s, grid_s


def _candidates(args: argparse.Namespace, staged_dir: Path, grid_dir: Path) -> dict[str, dict[str, Any] | None]:
    cpus = args.hand_workers or config_mod.cpu_count()
    return {
        "PyTorch defaults": {
            "num_workers": 0,
            "pin_memory": False,
            "batch_size": args.hand_batch,
            "grad_accum": 1,
            "compile": "none",
        },
        "hand-tuned": {
            "num_workers": cpus,
            "prefetch_factor": 2,
            "pin_memory": True,
            "batch_size": args.hand_batch,
            "grad_accum": 1,
            "compile": "none",
        },
        "tunekit staged": _knobs(staged_dir / "recommended.yaml"),
        "grid best": _best_knobs(grid_dir),
    }


def main() -> None:
    args = _arguments()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    staged_dir, grid_dir, staged_s, grid_s = _runs(args)
    staged_trials = list(csv.DictReader(open(staged_dir / "trials.csv")))
    grid_trials = list(csv.DictReader(open(grid_dir / "trials.csv")))
    cfg = config_mod.load(args.config, check_imports=False)
    full_grid = _full_grid_estimate(
        [r.knobs.compile for r in plan.next_requests(cfg, [], strategy="grid", cuda=True)], grid_trials, staged_trials
    )
    candidates = _candidates(args, staged_dir, grid_dir)
    measured: dict[str, list[float]] = {}
    finished: dict[str, int] = {}
    for name, knobs in candidates.items():
        if knobs is not None:
            finished[name], measured[name] = _previous(out / "side-by-side" / name.replace(" ", "-") / "trials", knobs)

    def table() -> list[dict[str, Any]]:
        rows = _table(candidates, measured, staged_trials, grid_trials, staged_s, grid_s, full_grid)
        write_csv(out / "compare.csv", rows)
        return rows

    rows = table()
    for round_ in range(0 if args.table_only else args.repeats):  # interleaved, so drift hits every config alike
        for name in measured:
            if finished[name] > round_:
                continue  # measured by an earlier, cut-off run
            sets = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in candidates[name].items()]
            m, _ = run_trial(args.config, out / "side-by-side" / name.replace(" ", "-"), sets)
            finished[name] += 1
            if m.status == "ok":
                measured[name].append(m.rate)
            rows = table()
    print("config | knobs | samples/s (or seconds), median | ratio | runs: min-max")
    for r in rows:
        print(f"{r['config']} | {r['knobs']} | {r['samples_per_s']} | {r['vs_grid_best']} | {r['runs'] or ''}")


def _table(
    candidates: dict,
    measured: dict,
    staged_trials: list,
    grid_trials: list,
    staged_s: float,
    grid_s: float,
    full_grid: tuple[float, str],
) -> list[dict[str, Any]]:
    rates = {k: statistics.median(v) for k, v in measured.items() if v}
    grid_best = rates.get("grid best")
    rows = [
        {
            "config": k,
            "knobs": json.dumps(candidates[k]),
            "samples_per_s": round(v, 1),
            "vs_grid_best": round(v / grid_best, 3) if grid_best else None,
            "runs": f"{len(measured[k])}: {min(measured[k]):.1f}-{max(measured[k]):.1f}",
        }
        for k, v in rates.items()
    ]
    rows.append(
        {
            "config": "staged sweep time (s)",
            "knobs": f"{len(staged_trials)} trials",
            "samples_per_s": round(staged_s, 1),
            "vs_grid_best": None,
            "runs": None,
        }
    )
    rows.append(
        {
            "config": "reduced grid time (s)",
            "knobs": f"{len(grid_trials)} trials",
            "samples_per_s": round(grid_s, 1),
            "vs_grid_best": None,
            "runs": None,
        }
    )
    full_s, how = full_grid
    rows.append(
        {
            "config": "full grid, estimated (s)",
            "knobs": how,
            "samples_per_s": round(full_s, 1),
            "vs_grid_best": round(staged_s / full_s, 3) if full_s else None,
            "runs": None,
        }
    )
    return rows


if __name__ == "__main__":
    main()
