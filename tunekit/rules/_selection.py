"""Selection: which trials compare, the run's noise and spread, the band the knee is chosen in, gains and their
intervals, and what a trial must reach to matter."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median

from tunekit.config import Selection
from tunekit.contract import Stage
from tunekit.records import TrialRow
from tunekit.rules._evidence import spread

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
    """The run-to-run spread the repeats of ``rows`` measured (``spread``, log scale, pooled over every config
    measured more than once, ``TrialRow.runs``), or 0 while they give too few degrees of freedom to measure it: the
    plan's band widens by what was measured, never by the prior."""
    measured = spread(r.runs for r in rows if len(r.runs) > 1)
    return measured.sd if measured.measured else 0.0


def band(rows: Iterable[TrialRow], selection: Selection, spread: float | None = None) -> float:
    """The run's band: max(tolerance, run noise of ``rows``, the run-to-run spread: ``spread`` when given (measured
    over the run's repeated candidates: never the script's own settings, which are no candidate), else their
    repeats'). The plan steers by it (what is still worth measuring); the knee itself is chosen by a test
    (``within_tolerance``)."""
    rows = list(rows)
    return max(selection.tolerance, run_noise(rows), run_spread(rows) if spread is None else spread)


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
