"""Script mode's overhead in the user's loop: the same training script, unedited, timed by tunekit's trial (the
meter inside the loop: set-aside, windows, events on CUDA, the monitor thread) and by a plain clock (a timestamp per
batch request and nothing else, benchmarks/_plain_clock), interleaved A/B in one run to cancel drift (the trial
first in even rounds, the plain run first in odd ones).

    python benchmarks/script_overhead.py examples/image_classifier/tunekit.yaml --set num_workers=8 \
        --set batch_size=128 --set pin_memory=true --repeats 3 --out results/script-overhead

Target: overhead = 1 - trial / plain <= 1 %. The plain clock skips as many batches as the trial's warm-up and
set-aside took and times as many as its windows held, so both count the same part of the run. With --control, each
round runs the plain clock twice, the trial between them: the two plain runs' difference is the noise floor of one
comparison on this host, and the overhead is taken against their mean. The trial's data wait says which regime was
measured (near 0: the GPU step is the bound; high: the loader, where the meter's cost is CPU taken from the workers).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _common import plain_rate, run_trial, write_csv

from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import script_command


def _plain(cfg: config.Config, knobs: Knobs, loader: dict, skip: int, count: int) -> float:
    spec = TrialSpec(number=0, stage="single", mode="train", knobs=knobs, config=cfg.to_dict())
    settings = {
        "num_workers": loader["num_workers"],
        "prefetch_factor": loader["prefetch_factor"],
        "pin_memory": loader["pin_memory"],
        "persistent_workers": loader.get("persistent_workers", loader["num_workers"] > 0),
    }
    return plain_rate(script_command(spec), cfg.script.cwd, settings, skip, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--control", action="store_true", help="a second plain run per round: the noise floor")
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
        run_knobs = Knobs.of(**{k: v for k, v in trial.params.items() if k in Knobs.__dataclass_fields__})
        skip = int(trial.warmup_batches or 0) + int(trial.warmup_set_aside or 0)
        last = (run_knobs, trial.loader_measured, skip, int(sum(trial.steps_windows or [])))
        plain = plain if plain is not None else _plain(cfg, *last)
        control = _plain(cfg, *last) if args.control else None
        against = plain if control is None else (plain + control) / 2
        rows.append(
            {
                "repeat": repeat,
                "trial_rate": round(trial.rate, 3),
                "plain_rate": round(plain, 3),
                "plain_again": None if control is None else round(control, 3),
                "overhead": round(1 - trial.rate / against, 4),
                "plain_spread": None if control is None else round(abs(plain - control) / against, 4),
                "trial_data_wait": round(trial.data_wait_frac, 4),
                "trial_noise_cv": round(trial.noise_cv, 4),
                "trial_windows": trial.windows_measured,
                "knobs": str(knobs),
            }
        )
        floor = "" if control is None else f", plain again {control:.1f} (spread {rows[-1]['plain_spread']:.2%})"
        print(
            f"round {repeat}: trial {trial.rate:.1f} (data wait {trial.data_wait_frac:.1%}, window CV "
            f"{trial.noise_cv:.1%}), plain {plain:.1f}{floor}, overhead {rows[-1]['overhead']:+.2%}",
            flush=True,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(args.out / "script_overhead.csv", rows)  # each round kept: a call cut short keeps what it measured
    median = statistics.median(r["overhead"] for r in rows)
    spread = [r["plain_spread"] for r in rows if r["plain_spread"] is not None]
    floor = f"; plain against plain {statistics.median(spread):.2%} (median)" if spread else ""
    print(
        f"median overhead {median:+.2%} over {len(rows)} rounds (target <= 1 %){floor} -> "
        f"{args.out / 'script_overhead.csv'}"
    )


if __name__ == "__main__":
    main()
