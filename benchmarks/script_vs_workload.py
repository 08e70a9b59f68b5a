"""Script mode against workload mode on one job, in one run: `tunekit sweep` of the image example's script, run
unedited (examples/image_classifier/tunekit.yaml), and of the same job named as factories (workload.yaml), then
the script re-run end to end under the script sweep's recommendation and under its own settings, alternated, each
timed by a plain clock (benchmarks/_plain_clock: a timestamp per batch request, nothing else).

    python benchmarks/script_vs_workload.py --budget-min 4 --out results/script-vs-workload

Reports per mode: wall time, trials, the knee and its rate; the wall-time ratio (target: script <= 1.5x workload);
and the script's own throughput under the recommendation against its own settings. Extra `--set` options go to
both sweeps (e.g. --set workload.precision=fp32 on a CPU: it applies to the workload config only). `--modes script`
then `--modes workload` on the same `--out` run the two sweeps in two invocations (two calls to one machine held
warm): each adds its row to sweeps.csv, and the ratio is printed once both rows are there.
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

import yaml
from _common import plain_rate, write_csv

from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import script_command

_ROOT = Path(__file__).resolve().parent.parent
_EXAMPLE = _ROOT / "examples" / "image_classifier"


def _sweep(cfg: Path, out: Path, budget: float, sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "tunekit", "sweep", str(cfg), "--out", str(out), "--budget-min", str(budget)]
    for item in sets:
        cmd += ["--set", item]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not (out / "recommended.yaml").exists():
        raise SystemExit(
            f"the sweep of {cfg.name} failed (exit {proc.returncode}): "
            f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}"
        )
    rec = yaml.safe_load((out / "recommended.yaml").read_text())
    trials = sum(1 for line in (out / "trials.csv").read_text().splitlines()[1:] if line.strip())
    complete = "Stopped early" not in (out / "report.md").read_text()  # the plan ran out, not the budget
    return {
        "wall_s": round(wall, 1),
        "trials": trials,
        "complete": complete,
        "knee": rec["dataloader"] | rec["training"],
        "knee_rate": rec["evidence"]["rate"],
        "band": rec["evidence"].get("band"),
        "rec": rec,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget-min", type=float, default=4.0)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=2, help="alternated re-runs of the script (0: none)")
    parser.add_argument("--skip", type=int, default=40, help="batches the plain clock lets pass first")
    parser.add_argument("--count", type=int, default=200, help="batches the plain clock times")
    parser.add_argument("--out", type=Path, default=Path("results/script-vs-workload"))
    parser.add_argument("--rerun", type=Path, help="no sweeps: re-run the script under this recommended.yaml")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=("script", "workload"),
        default=["script", "workload"],
        help="the sweeps to run; rows already in OUT/sweeps.csv for the others are kept",
    )
    args = parser.parse_args()
    out = args.out.resolve()
    subprocess.run(
        [sys.executable, "train.py", "--data", "./data", "--make-data", "2048", "--epochs", "0"],
        cwd=_EXAMPLE,
        check=True,
        capture_output=True,
    )
    if args.rerun:
        _reruns(yaml.safe_load(args.rerun.read_text()), args, out)
        return
    script_sets = [s for s in args.sets if not s.startswith("workload.")]
    modes, rows = {}, _earlier_rows(out / "sweeps.csv", keep=set(("script", "workload")) - set(args.modes))
    for mode, cfg, sets in (("script", "tunekit.yaml", script_sets), ("workload", "workload.yaml", args.sets)):
        if mode not in args.modes:
            continue
        modes[mode] = _sweep(_EXAMPLE / cfg, out / mode, args.budget_min, sets)
        rows.append(row := {"mode": mode, **{k: v for k, v in modes[mode].items() if k != "rec"}})
        write_csv(out / "sweeps.csv", rows)  # each sweep kept as it ends: a call cut short keeps the first
        print(
            f"{mode}: {row['wall_s']} s, {row['trials']} trials "
            f"({'complete' if row['complete'] else 'cut by the budget'}), knee {row['knee']} at {row['knee_rate']}",
            flush=True,
        )
    walls = {row["mode"]: float(row["wall_s"]) for row in rows}
    if len(walls) == 2:
        cut = (
            ""
            if all(str(row["complete"]) == "True" for row in rows)
            else ", but a sweep was cut by the budget: not a fair ratio"
        )
        print(
            f"wall time script / workload: {walls['script'] / walls['workload']:.2f} (target <= 1.5){cut}", flush=True
        )
    if args.rounds and "script" in modes:
        _reruns(modes["script"]["rec"], args, out)


def _earlier_rows(path: Path, keep: set[str]) -> list[dict]:
    """The rows of an earlier invocation's sweeps.csv for the modes in ``keep`` (not swept this time)."""
    if not keep or not path.exists():
        return []
    with path.open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["mode"] in keep]


def _reruns(rec: dict, args: argparse.Namespace, out: Path) -> None:
    """The script end to end under the recommendation and under its own settings, alternated."""
    cfg = config.load(_EXAMPLE / "tunekit.yaml")
    own = script_command(TrialSpec(number=0, stage="baseline", mode="train", knobs=Knobs(), config=cfg.to_dict()))
    runs = {
        "recommended": (list(rec["script"]["command"]), dict(rec["script"]["set_on_dataloader"])),
        "own settings": (own, {}),
    }
    reruns = []
    for round_ in range(args.rounds):
        order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
        for name in order:
            command, loader = runs[name]
            rate = plain_rate(command, _EXAMPLE, loader, args.skip, args.count, timeout_s=900)
            reruns.append(
                {
                    "round": round_,
                    "run": name,
                    "rate": round(rate, 2),
                    "command": " ".join(command),
                    "set_on_dataloader": json.dumps(loader),
                }
            )
            print(f"round {round_}: {name}: {rate:.1f} samples/s", flush=True)
            write_csv(out / "reruns.csv", reruns)  # each run kept as it ends
    median = {name: statistics.median(r["rate"] for r in reruns if r["run"] == name) for name in runs}
    print(
        f"the script under the recommendation: {median['recommended']:.1f} samples/s against "
        f"{median['own settings']:.1f} under its own settings ({median['recommended'] / median['own settings']:.2f}x)"
        f"; the sweep predicted {rec['evidence']['rate']:.1f} -> {out}"
    )


if __name__ == "__main__":
    main()
