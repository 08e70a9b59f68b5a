"""Selection: which trials compare, the run's noise and spread, the band the knee is chosen in, gains and their
intervals, and what a trial must reach to matter."""

from __future__ import annotations

import math
from collections.abc import Iterable
from statistics import mean, median

from tunekit.config import Selection
from tunekit.contract import Stage
from tunekit.records import TrialRow
from tunekit.rules._measurement import _T975

KNEE_STAGES: tuple[Stage, ...] = tuple(s for s in Stage if s.knee)
"""The stages whose trials run end to end and may be chosen as the knee (``Stage.knee``), in the order the staged
plan runs them (the enum's)."""


MIN_POINTS = 2
"""Completed candidates a knee needs: with one point there is nothing to compare."""


def knee_stages(before: Stage | None = None) -> tuple[Stage, ...]:
    """The knee stages that run before ``before`` (all of them for None): the trials a stage refines."""
    return KNEE_STAGES if before is None else KNEE_STAGES[: KNEE_STAGES.index(before)]


def changes_result(row: TrialRow) -> bool:
    """Whether the trial set a user-defined knob whose values may change what training learns (``search.extra``,
    ``changes_result: true``) away from its baseline: it is measured and reported, never chosen."""
    return bool(row.measurement.changes_result)


def fits(row: TrialRow, selection: Selection) -> bool:
    """Whether a trial left at least ``selection.min_headroom`` of its memory free (unknown headroom fits)."""
    return row.headroom is None or row.headroom >= selection.min_headroom


def past_memory_limit(row: TrialRow, selection: Selection) -> bool:
    """A batch that ran out of memory, or fit only under the headroom limit: beyond the memory boundary (the
    compute stage goes on to smaller batches)."""
    return row.status == "oom" or (row.ok and not fits(row, selection))


def run_noise(rows: Iterable[TrialRow]) -> float:
    """The run noise of comparable trials: the median window CV of those at or above their median throughput."""
    rows = list(rows)
    if not rows:
        return 0.0
    middle = median(r.rate for r in rows)
    return float(median(r.noise_cv for r in rows if r.rate >= middle))


def run_spread(rows: Iterable[TrialRow]) -> float:
    """The run-to-run spread the repeats measured: the pooled relative standard deviation of the runs of every
    config measured more than once (``TrialRow.runs``: each run's rate, the config's runs alternating with the other
    repeated configs' on the same machine); 0 when no config was."""
    groups = [r.runs for r in rows if len(r.runs) > 1]
    df = sum(len(g) - 1 for g in groups)
    if not df:
        return 0.0
    squares = sum(sum((x / mean(g) - 1.0) ** 2 for x in g) for g in groups)
    return math.sqrt(squares / df)


def runs_interval(runs: int, spread: float, df: int) -> float:
    """Relative half-width of the 95 % interval of the mean of ``runs`` runs of a config, from the run-to-run
    ``spread`` pooled over ``df`` degrees of freedom (Student's t)."""
    t = _T975[df - 1] if 0 < df <= len(_T975) else 1.96
    return t * spread / math.sqrt(runs) if df > 0 else math.inf


def band(rows: Iterable[TrialRow], selection: Selection, spread: float | None = None) -> float:
    """The run's band: max(tolerance, run noise of ``rows``, the run-to-run spread: ``spread`` when given (measured
    over every repeated config of the run, the script's own settings too), else their repeats')."""
    rows = list(rows)
    return max(selection.tolerance, run_noise(rows), run_spread(rows) if spread is None else spread)


def gain_margin(band: float, *rows: TrialRow) -> float:
    """How much one config must beat another by to be faster beyond doubt: the run's band, or the sum of the two
    rates' interval half-widths (``TrialRow.interval``: the windows', or the repeated runs'; each at most 100 %)
    when wider."""
    intervals = sum(min(1.0, r.interval or 0.0) for r in rows)
    return max(band, intervals)


def gain_interval(a: TrialRow, b: TrialRow) -> tuple[float, float] | None:
    """The 95 % interval of ``a``'s rate over ``b``'s, from their rates' relative half-widths (``TrialRow.interval``:
    the windows', or the repeated runs'; combined in quadrature); None when either is unknown."""
    ia, ib = a.interval, b.interval
    if ia is None or ib is None or not math.isfinite(ia) or not math.isfinite(ib) or not b.rate:
        return None
    ratio, half = a.rate / b.rate, math.hypot(ia, ib)
    return ratio * max(0.0, 1.0 - half), ratio * (1.0 + half)


def needed(best: TrialRow, allowed: float) -> float:
    """The throughput a config must reach to be within ``allowed`` of ``best``."""
    return best.rate * (1.0 - allowed)


def trial_margin(selection: Selection, *rows: TrialRow) -> float:
    """How much single measurements may be off: max(tolerance, each trial's window CV)."""
    return max([selection.tolerance, *(r.noise_cv for r in rows)])


def can_reach(ceiling: TrialRow, target: float, selection: Selection, ranks: int = 1) -> bool:
    """Whether a config of ``ranks`` ranks bounded by ``ceiling`` (a loader-alone or compute-alone trial of one)
    could still reach ``target``: the ceiling, ``ranks`` times over, plus its own margin is at least the target."""
    return ceiling.rate * ranks * (1.0 + trial_margin(selection, ceiling)) >= target
