"""Configs measured more than once: their runs pooled into one row each, with the run-to-run spread they show."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from statistics import fmean
from typing import Any

from tunekit import rules
from tunekit.contract import Mode
from tunekit.records import TrialRow


def pooled(rows: Iterable[TrialRow]) -> list[TrialRow]:
    """The trials as the decisions read them: each end-to-end config measured more than once (its repeats, ``run``
    1, 2 ...) as one row, its first run's, whose rate is the mean of its completed runs' rates and whose interval is
    the wider of the runs' (Student's t over the run-to-run spread pooled across every repeated config,
    ``rules.runs_interval``, from two degrees of freedom on: with one, t is 12.7 and the spread enters the band
    alone) and the windows' own (their intervals over the runs, in quadrature). A repeat that failed adds nothing;
    every other trial is kept as it is."""
    rows = list(rows)
    runs: dict[tuple[Any, ...], list[TrialRow]] = {}
    for r in rows:
        if r.ok and r.mode == Mode.train:
            runs.setdefault((r.stage, r.mode, r.knobs), []).append(r)
    merged = {key: _merged(group) for key, group in runs.items() if len(group) > 1}
    if not merged:
        return [r for r in rows if not r.run]
    spread = rules.run_spread(merged.values())
    df = sum(len(r.runs) - 1 for r in merged.values())
    out = []
    for r in rows:
        key = (r.stage, r.mode, r.knobs)
        if key in merged and r is runs[key][0]:
            row = merged[key]
            between = rules.runs_interval(len(row.runs), spread, df) if df >= 2 else 0.0
            out.append(dataclasses.replace(row, interval=max(between, row.interval or 0.0)))
        elif key not in merged and not r.run:
            out.append(r)
    return out


def _merged(group: list[TrialRow]) -> TrialRow:
    """The runs of one config as one row: the first run's identity, the runs' mean rate and window noise, and the
    windows' intervals combined (the mean of n rates: their quadrature sum over n)."""
    rates = tuple(r.rate for r in group)
    intervals = [r.interval for r in group]
    windows = None if any(i is None for i in intervals) else sum(i**2 for i in intervals) ** 0.5 / len(group)  # type: ignore[operator]
    return dataclasses.replace(
        group[0], rate=fmean(rates), noise_cv=fmean(r.noise_cv for r in group), runs=rates, interval=windows
    )
