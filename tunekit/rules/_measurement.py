"""Measurement: a trial's rate from its windows, its interval, the rate over whole epochs, when windows stop and
which leading ones were still settling."""

from __future__ import annotations

from collections.abc import Sequence

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
"""Student's t, two-sided 95 %, for 1 ... 15 degrees of freedom (1.96 beyond)."""

CLAIM_PRECISION = 0.10
"""The interval a baseline (PyTorch's defaults, a script's own settings: what every gain is over) reaches before it
stops below the band: each gain's interval carries the baseline's, and two windows' (Student's t of 12.7) made a
3.99x gain read 1.17-6.80x."""


def window_rate(items: Sequence[float], seconds: Sequence[float]) -> float:
    """A trial's throughput: its windows' items over their time. The windows are contiguous and close at the end
    of a loader round, so their lengths differ: a round that finishes early joins the next in one long, fast window
    while slow rounds stay windows of their own, and a median of window rates leans towards the slow rounds (by up
    to 9 % on H200 trials of 16 CPU-decoding workers). The ratio of sums weighs every second once."""
    total = sum(seconds)
    return sum(items) / total if total > 0 else 0.0


def epoch_rate(epoch_items: float, steady: float, boundary_s: float) -> float:
    """The rate over whole epochs of ``epoch_items`` each: the epoch's items at the ``steady`` rate inside an epoch,
    plus ``boundary_s`` between epochs (evaluation, checkpoint, logging, the loader's restart)."""
    return epoch_items / (epoch_items / steady + boundary_s)


def rate_interval(items: Sequence[float], seconds: Sequence[float]) -> float:
    """Relative half-width of the 95 % confidence interval of :func:`window_rate` (the ratio estimator's standard
    error over the windows; for windows of equal length, the t-interval of their mean rate); inf below two
    windows."""
    n = len(items)
    if n < 2 or sum(seconds) <= 0:
        return float("inf")
    rate = window_rate(items, seconds)
    if rate <= 0:
        return float("inf")
    spread = sum((s - rate * t) ** 2 for s, t in zip(items, seconds, strict=True)) / (n - 1)
    se = (spread / n) ** 0.5 / (sum(seconds) / n)
    t = _T975[n - 2] if n - 2 < len(_T975) else 1.96
    return t * se / rate


def settling(rates: list[float], min_windows: int, precision: float) -> int:
    """Leading windows still settling (left out of the measurement). The cut is the marginal standard error rule's
    (MSER, White 1997: the cut d minimising the kept windows' squared deviations over (n - d)^2, d at most half the
    windows and leaving at least ``min_windows``), so a ramp of several windows goes as well as one slow first
    window. It is then moved back until the windows it leaves out lie all on one side of the kept windows' mean (a
    ramp, not noise on both sides) and the last of them farther than ``precision`` from it."""
    n = len(rates)
    cuts = range(min(n - min_windows, n // 2) + 1)
    if len(cuts) < 2:
        return 0

    def mser(d: int) -> float:
        kept = rates[d:]
        mean = sum(kept) / len(kept)
        return sum((r - mean) ** 2 for r in kept) / len(kept) ** 2

    drop = min(cuts, key=mser)
    while drop:
        mean = sum(rates[drop:]) / (n - drop)
        one_side = len({r > mean for r in rates[:drop]}) == 1
        if one_side and abs(rates[drop - 1] - mean) > precision * mean:
            break
        drop -= 1
    return drop


def window_stop(
    items: Sequence[float],
    seconds: Sequence[float],
    min_windows: int,
    max_windows: int,
    precision: float | None,
    needed: float | None = None,
    baseline: bool = False,
) -> str | None:
    """Why a trial stops measuring after these windows (items and seconds of each), or None to measure another:
    ``fixed`` (no precision asked, ``min_windows`` done), ``below_band`` (the settled windows' interval lies wholly
    below ``needed``, the rate that would bring the trial within the band of the best so far: more windows cannot
    make it the knee; judged from two windows on, the t-interval of so few being wide enough to hold only a clear
    miss; a ``baseline``, what the gains are over, only once its interval is within ``CLAIM_PRECISION`` too),
    ``precise`` (``min_windows`` done and the settled windows' interval within ``precision``), ``max_windows``."""
    n = len(items)
    if precision is None:
        return "fixed" if n >= min_windows else None
    if n < 2:
        return None
    drop = settling([s / t if t > 0 else 0.0 for s, t in zip(items, seconds, strict=True)], min_windows, precision)
    kept, kept_s = items[drop:], seconds[drop:]
    interval = rate_interval(kept, kept_s)
    claimable = not baseline or interval <= CLAIM_PRECISION
    if needed is not None and claimable and window_rate(kept, kept_s) * (1.0 + interval) < needed:
        return "below_band"
    if n < min_windows:
        return None
    if interval <= precision:
        return "precise"
    return "max_windows" if n >= max_windows else None
