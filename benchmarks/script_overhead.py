"""Script mode's overhead in the user's loop: the same training script, unedited, timed by tunekit's trial (the
meter inside the loop: set-aside, windows, events on CUDA, the monitor thread) and by a plain clock (a timestamp per
batch request and nothing else, benchmarks/_plain_clock), interleaved A/B in one run to cancel drift (the trial
first in even rounds, the plain run first in odd ones).

    python benchmarks/script_overhead.py examples/image_classifier/tunekit.yaml --set num_workers=8 \
        --set batch_size=128 --set pin_memory=true --repeats 3 --out results/script-overhead

Target: overhead = 1 - trial / plain <= 1 %. The plain clock skips as many batches as the trial's warm-up and
set-aside took and times as many as its windows held, so both count the same part of the run.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _common import plain_rate, run_trial, write_csv

from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launcher import script_command


def _plain(cfg: config.Config, knobs: Knobs, loader: dict, skip: int, count: int) -> float:
    spec = TrialSpec(number=0, stage="single", mode="train", knobs=knobs, config=cfg.to_dict())
    settings = {"num_workers": loader["num_workers"], "prefetch_factor": loader["prefetch_factor"],
                "pin_memory": loader["pin_memory"],
                "persistent_workers": loader.get("persistent_workers", loader["num_workers"] > 0)}
    return plain_rate(script_command(spec), cfg.script.cwd, settings, skip, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/script-overhead"))
    args = parser.parse_args()
    cfg = config.load(args.config)
    knobs = {k: config.parse_knob(k, v) for k, v in (s.split("=", 1) for s in args.sets)}
    rows, last = [], None
    for repeat in range(args.repeats):
        # alternated: trial then plain in even rounds, plain (with the last trial's figures) then trial in odd ones
        plain = _plain(cfg, *last) if repeat % 2 and last else None
        trial, _ = run_trial(args.config, args.out / "trials", args.sets)
        if trial.status != "ok":
            raise SystemExit(f"the trial failed: {trial.reason}")
        run_knobs = Knobs(**{k: v for k, v in trial.params.items() if k in Knobs.__dataclass_fields__})
        skip = int(trial.warmup_batches or 0) + int(trial.warmup_set_aside or 0)
        last = (run_knobs, trial.loader_measured, skip, int(sum(trial.steps_windows or [])))
        plain = plain if plain is not None else _plain(cfg, *last)
        rows.append({"repeat": repeat, "trial_rate": round(trial.rate, 3), "plain_rate": round(plain, 3),
                     "overhead": round(1 - trial.rate / plain, 4), "knobs": str(knobs)})
        print(f"round {repeat}: trial {trial.rate:.1f}, plain {plain:.1f}, overhead {1 - trial.rate / plain:+.2%}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "script_overhead.csv", rows)
    median = statistics.median(r["overhead"] for r in rows)
    print(f"median overhead {median:+.2%} over {len(rows)} rounds (target <= 1 %) -> "
          f"{args.out / 'script_overhead.csv'}")


if __name__ == "__main__":
    main()
