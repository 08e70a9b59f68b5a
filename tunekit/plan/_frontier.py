"""What a free node of a shared sweep may start while other nodes measure (docs/plan.md, "Several nodes").

The plan answers from finished trials alone, and its first request may depend on the last result. With trials in
flight on other nodes, a request is independent of them when the plan asks for it whatever they measure: the
plan is asked once per combination of their possible outcomes (each failed, far below anything measured, or as
fast as its ceilings allow), and a request that comes first in every answer may start now. Where the answers
differ, a decision needs a result still being measured, and the node waits for it. So the trials of a stage that
do not depend on each other (the first two compute ceilings, the ceilings of a target effective batch, a loader
stage without a compute ceiling, the end-to-end walk's start with its other pin setting, the baselines raced
against it and the count above it, grid cells) run side by side, and every trial a node starts is one a single
machine would have run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from tunekit.contract import Measurement, Mode
from tunekit.plan._request import Request
from tunekit.records import TrialRow, compute_ceiling

__all__ = ["imagined"]

_OUTCOMES = ("failed", "slow", "fast")
_ALL_COMBINATIONS = 4
"""Up to this many trials in flight, every combination of their outcomes is tried (3^4 = 81 plans); beyond it,
each trial's outcomes with the others' alike (3 + 6 per trial)."""
_UNBOUNDED = 1e12
"""The rate of a fast outcome without a ceiling to bound it (a ceiling itself): above any real one."""
_SLOW = 1e-6
_NUMBERS = 10**9
"""Numbers of the imagined trials: apart from every real one."""


def imagined(rows: list[TrialRow], running: list[Request]) -> Iterator[list[TrialRow]]:
    """The finished trials with each combination of outcomes of the trials in flight (no combination but the
    finished trials alone when none is in flight)."""
    running = list({r.key: r for r in running}.values())
    if len(running) <= _ALL_COMBINATIONS:
        combos: list[tuple[str, ...]] = list(itertools.product(_OUTCOMES, repeat=len(running)))
    else:
        alike = [(o,) * len(running) for o in _OUTCOMES]
        one = [
            tuple(mine if i == j else other for j in range(len(running)))
            for i in range(len(running))
            for mine in _OUTCOMES
            for other in _OUTCOMES
            if mine != other
        ]
        combos = alike + one
    for combo in combos:
        pairs = enumerate(zip(running, combo, strict=True))
        yield rows + [_outcome(rows, req, kind, _NUMBERS + i) for i, (req, kind) in pairs]


def _outcome(rows: list[TrialRow], req: Request, kind: str, number: int) -> TrialRow:
    """One imagined finished trial of ``req``: failed, slow (data-bound: waiting on data nearly all the time), or
    as fast as its ceilings allow (the model the bound: no wait)."""
    unit = next((r.unit for r in rows if r.ok), None)
    tags = {"number": number, "stage": req.stage.value, "mode": req.mode.value, "run": req.run}
    params = req.knobs.to_dict()
    if kind == "failed":
        return TrialRow.from_measurement(
            Measurement(status="crashed", reason="imagined", params=params, unit=unit, **tags)  # type: ignore[arg-type]
        )
    rate = _SLOW if kind == "slow" else _ceiling(rows, req)
    measured = Measurement(
        status="ok",
        rate=rate,
        rate_windows=[rate] * 3,
        noise_cv=0.0,
        step_time_s=1.0,
        data_wait_frac=0.95 if kind == "slow" else 0.0,
        headroom=0.5,
        warmup_s=0.0,
        cpu_util_frac=0.1,
        params=params,
        unit=unit,
        **tags,  # type: ignore[arg-type]
    )
    return TrialRow.from_measurement(measured)


def _ceiling(rows: list[TrialRow], req: Request) -> float:
    """The most an end-to-end trial can deliver, as the plan's own skips reason: its batch's compute ceiling and
    its loader ceiling (same pinning and batch, at its worker count or the fewest measured above it: more workers
    deliver no less), times its ranks; a ceiling trial has no bound."""
    if req.mode != Mode.train:
        return _UNBOUNDED
    k = req.knobs
    bounds = [c.rate for c in [compute_ceiling(rows, k.batch_size)] if c is not None]
    loaders = [
        r
        for r in rows
        if r.ok
        and r.mode == Mode.loader
        and r.knobs.num_workers >= k.num_workers
        and (r.knobs.pin_memory, r.knobs.batch_size) == (k.pin_memory, k.batch_size)
    ]
    if loaders:
        bounds.append(min(loaders, key=lambda r: r.knobs.num_workers).rate)
    return min(bounds) * k.ranks if bounds else _UNBOUNDED
