"""Replay: what the staged plan as it is now asks of a run it did not plan, answered from that run's measurements.

    python benchmarks/replay_plan.py results/h200-resnet50-overlap-2026-11-30 [--config configs/resnet.yaml]

A planner change is judged on GPU runs long before it can run on a GPU again: the plan is asked for its next trial
with the trials replayed so far; a request the recorded run measured (same mode and knobs, any stage) is answered
with that measurement, a skip is recorded as the plan gives it, and the replay stops at the first request the run
never measured (it says which). Each replayed trial is cut where ``rules.window_stop`` would now stop it, against
the rate the plan now says it needs (``plan.needed_rate``): its windows (the settling ones first, as measured)
up to the stop, less those the settling rule leaves out, give its rate, and its trial time loses the cut windows'
share of its measured time. The recorded run's dataset preparation and the planning between trials are not
counted. A multi-rank run's windows are its ranks' sums, held against the whole rate needed (the worker holds
each rank's against its share: the same for balanced ranks).

Prints each trial (stage, knobs, rate, windows kept of measured, trial seconds), then trials run, trial seconds,
and the knee against the recorded run's knee (recommended.yaml's knobs). Windows are taken as equally long, so a
cut trial's rate and time are estimates; a replay is a projection, never a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from tunekit import plan, rules
from tunekit._files import read_json
from tunekit.analysis import select_knee
from tunekit.config import Config, from_dict
from tunekit.contract import Measurement
from tunekit.records import TrialRow, rows_from_measurements


def _recorded(run: Path) -> dict[tuple[Any, ...], Measurement]:
    """The run's measured trials by (mode, knobs, run): a config's first measurement and its repeats."""
    found: dict[tuple[Any, ...], Measurement] = {}
    for path in sorted((run / "trials").glob("*/measurement.json"), key=lambda p: int(p.parent.name)):
        m = Measurement.from_dict(read_json(path))
        if m.status == "skipped":
            continue
        row = rows_from_measurements([dataclasses.replace(m, number=0)])[0]
        found.setdefault((row.mode, row.knobs, row.run), m)
    return found


def _cut(m: Measurement, cfg: Config, needed: float | None) -> tuple[Measurement, int, int]:
    """The measurement as the trial would now end it: (measurement, windows kept, windows measured)."""
    windows = [*(m.settling_windows or []), *(m.rate_windows or [])]
    if m.status != "ok" or not windows:
        return m, len(windows), len(windows)
    t = cfg.trial
    for k in range(1, len(windows) + 1):
        if rules.window_stop(windows[:k], [1.0] * k, t.measure_windows, t.max_windows, t.precision, needed):
            break
    else:
        k = len(windows)
    if k == len(windows):
        return m, k, k
    drop = rules.settling(windows[:k], t.measure_windows, t.precision) if t.precision is not None else 0
    kept = windows[drop:k]  # as the worker keeps them: the leading windows still settling left out
    measured = float(m.measured_s or 0.0) + float(m.settling_s or 0.0)
    trial_s = float(m.trial_s or 0.0) - measured * (1 - k / len(windows))
    cut = dataclasses.replace(
        m,
        rate=statistics.fmean(kept),
        rate_windows=kept,
        settling_windows=windows[:drop],
        noise_cv=statistics.pstdev(kept) / statistics.fmean(kept),
        trial_s=trial_s,
    )
    return cut, k, len(windows)


def replay(run: Path, cfg: Config, cuda: bool = True) -> tuple[list[TrialRow], list[str], float, str | None]:
    """(rows, one line per trial, trial seconds, the first request the run never measured or None)."""
    recorded = _recorded(run)
    rows: list[TrialRow] = []
    lines: list[str] = []
    seconds = 0.0
    while requests := plan.next_requests(cfg, rows, strategy="staged", cuda=cuda):
        req = requests[0]
        n = len(rows)
        what = f"{req.stage:<10} {req.knobs.describe()}"
        if req.skip is not None:
            rows += rows_from_measurements(
                [
                    Measurement(
                        number=n,
                        stage=req.stage,
                        mode=req.mode,
                        status="skipped",
                        reason=req.skip,
                        params=req.knobs.to_dict(),
                    )
                ]
            )
            lines.append(f"{n:3d} skip {what}: {req.skip}")
            continue
        m = recorded.get((req.mode, req.knobs, req.run))  # a repeat the run never made is never measured
        if m is None:
            return rows, lines, seconds, f"{req.stage} {req.mode} {req.knobs.describe()}"
        m, kept, measured = _cut(m, cfg, plan.needed_rate(cfg, rows, req))
        rows += rows_from_measurements([dataclasses.replace(m, number=n, stage=req.stage, run=req.run)])
        seconds += float(m.trial_s or 0.0)
        rate = f"{m.rate:.1f}" if m.rate else m.status
        lines.append(f"{n:3d} run  {what}: {rate}, windows {kept} of {measured}, {float(m.trial_s or 0):.1f} s")
    return rows, lines, seconds, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--config", type=Path, help="the config to plan with (default: the run's config.resolved.yaml)")
    args = ap.parse_args(argv)
    source = args.config or args.run / "config.resolved.yaml"
    cfg = from_dict(yaml.safe_load(source.read_text()), source=str(source))
    rows, lines, seconds, missing = replay(args.run, cfg)
    print("\n".join(lines))
    ran = [r for r in rows if r.status != "skipped"]
    print(f"trials run {len(ran)} ({len(rows) - len(ran)} skipped), trial time {seconds:.0f} s")
    if missing:
        print(f"stopped: the plan asks for {missing}, which the run never measured", file=sys.stderr)
        return 1
    knee = select_knee(
        [r for r in rows if r.stage in rules.KNEE_STAGES and not rules.changes_result(r)], cfg.selection
    ).knee
    recommended = args.run / "recommended.yaml"
    before = yaml.safe_load(recommended.read_text()).get("dataloader") if recommended.exists() else None
    print(
        f"knee now: {knee.knobs.describe() if knee else 'none'} (trial {knee.number if knee else '—'}); "
        f"the run's recommendation: {before}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
