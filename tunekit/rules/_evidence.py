"""Evidence: how sure a figure is, and the tests the decisions make on it.

Every 95 % claim tunekit prints says what varies in it. A trial's windows vary within one run; the **runs** of one
config vary between runs (the host's state, the page cache, the order of workers' start-up, a neighbour's load),
and that variation is usually the larger. So every interval of a rate or a gain carries the run-to-run spread:

* measured, where the repeats give at least :data:`MIN_SPREAD_DF` degrees of freedom (Student's t over them);
* else the stated prior :data:`RUN_SPREAD_PRIOR`, taken as if measured with :data:`PRIOR_DF` degrees of freedom,
  with what the repeats did measure folded in. Never 0.

Two configs measured in the same **blocks** (the repeats run in alternation: run k of each config back to back)
are compared **paired**: the log of their rates' ratio in each block, whose spread is the residual of an additive
model (config + block) on the log rates, so a shock that slows both configs in a block cancels. The block that
chose a config (run 0, the stages' own trial) is left out of its gain when other blocks exist (the winner's curse:
the config chosen for being fast was, in that run, luckier than its mean). Configs that share no block beyond it
are compared unpaired, each mean's variance the one-way run-to-run spread over its runs.

The knee is a test of equivalence: a config is within the user's tolerance of the best when the one-sided 95 %
lower bound of its rate over the best's is at least ``1 - tolerance``; one whose bound straddles it is *undecided*.
The spread a knee decision reads is the candidates' own (the script's own settings, often starved and erratic,
never widen it). ``tunekit check`` decides by a one-sided test of the same kind (:func:`check_test`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

RUN_SPREAD_PRIOR = 0.05
"""The run-to-run spread (relative standard deviation of one run's rate) assumed while the repeats give fewer than
:data:`MIN_SPREAD_DF` degrees of freedom: two runs of one config on a quiet 2-core box were 6.4 % apart (a spread
of 4.5 %), a real script's own settings on an H200 13 %; on a quiet GPU host runs agree to 1-2 %, which the repeats
then measure."""

PRIOR_DF = 4
"""The degrees of freedom the prior is taken with (its Student's t: 2.78 two-sided, 2.13 one-sided)."""

MIN_SPREAD_DF = 2
"""Degrees of freedom from which a measured spread replaces the prior (with one, t is 12.7 and a lucky pair of
close runs would claim almost any precision)."""

COLLAPSED = 0.6
"""A run below this share of its config's fastest other run collapsed (a stall of the host, a neighbour's burst):
it is set aside, said, and measured again, rather than widening every interval of the run (one repeat of 17.5/s
against 143.8/s made a band of 200 %)."""

DECIDING_RUNS = 5
"""Runs of an undecided contender and of the best that the plan asks for at most (in alternated blocks) before the
choice stays provisional: by then the pair's interval has four paired blocks (tunekit's simulation: a 1.5 % shortfall
is decided within 3 % from about three blocks of 1 % run-to-run spread)."""

CHECK_TOLERANCE = 0.05
"""The smallest regression ``tunekit check`` calls (raised to the config's ``selection.tolerance``): a gate that
fails a CI job must not trip on the 2-3 % a quiet machine drifts by between runs."""


# --- Student's t ---------------------------------------------------------------------------------------------

# fmt: off
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
_T95 = (
    6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
    1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
)
# fmt: on


def t_quantile(df: float, two_sided: bool = True) -> float:
    """Student's t for a 95 % bound: two-sided (0.975 quantile) or one-sided (0.95); inf without a degree of
    freedom; beyond 30, the Cornish-Fisher expansion around the normal quantile."""
    if df < 1:
        return math.inf
    table = _T975 if two_sided else _T95
    n = int(df)
    if n <= len(table):
        return table[n - 1]
    z = 1.959964 if two_sided else 1.644854
    return z + (z**3 + z) / (4 * n) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * n * n)


# --- the run-to-run spread -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """How much one run's rate varies (relative standard deviation, on a log scale) and how well that is known."""

    sd: float
    df: int
    """Degrees of freedom of its Student's t: the measured ones, or :data:`PRIOR_DF` for the prior."""
    measured_df: int = 0
    """What the repeats gave (0 without repeats); below :data:`MIN_SPREAD_DF` the prior stands in."""

    @property
    def measured(self) -> bool:
        return self.measured_df >= MIN_SPREAD_DF

    def describe(self) -> str:
        """ "3.1 % between runs (6 degrees of freedom)", or the prior said as one."""
        if self.measured:
            return f"{self.sd:.1%} between runs ({self.measured_df} degrees of freedom)"
        gave = self.measured_df
        return f"{self.sd:.1%} between runs assumed (the prior; the repeats gave {gave} degree(s) of freedom)"


def _from(squares: float, df: int) -> Spread:
    """The spread of ``squares`` (the log rates' squared deviations) over ``df`` degrees of freedom: measured from
    :data:`MIN_SPREAD_DF` on; below, the prior with that little data folded in as extra degrees of freedom (the
    conjugate blend: a single pair of runs neither silences the prior nor, 20 % apart by chance, swamps it)."""
    if df >= MIN_SPREAD_DF:
        return Spread(math.sqrt(squares / df), df, df)
    return Spread(math.sqrt((PRIOR_DF * RUN_SPREAD_PRIOR**2 + squares) / (PRIOR_DF + df)), PRIOR_DF + df, df)


def spread(groups: Iterable[Sequence[float]]) -> Spread:
    """The run-to-run spread of configs measured more than once (each group: one config's runs' rates), pooled on
    a log scale, one-way (what a run varies by, whatever else ran in its block); the prior below
    :data:`MIN_SPREAD_DF` degrees of freedom."""
    squares, df = 0.0, 0
    for g in groups:
        logs = [math.log(x) for x in g if x > 0]
        if len(logs) > 1:
            m = sum(logs) / len(logs)
            squares += sum((v - m) ** 2 for v in logs)
            df += len(logs) - 1
    return _from(squares, df)


def blocked_spread(table: Mapping[Hashable, Mapping[int, float]], of: Hashable | None = None) -> Spread:
    """The spread left once each block's common shift is taken out: the residual of the additive model
    ``log rate = config + block`` over the blocks in which at least two configs ran (``table``: config → run → rate),
    fitted by alternating means; degrees of freedom cells − configs − blocks + 1. This is what a paired ratio
    varies by (each side's variance one run's). With ``of``, that config's own residuals over its share of the
    degrees of freedom (a config noisier than the rest, the script's own settings, is not diluted by them)."""
    blocks: dict[int, int] = {}
    for runs in table.values():
        for k in runs:
            blocks[k] = blocks.get(k, 0) + 1
    shared = {k for k, n in blocks.items() if n > 1}
    cells = {(c, k): math.log(v) for c, runs in table.items() for k, v in runs.items() if k in shared and v > 0}
    configs = {c for c, _ in cells}
    if len(configs) < 2 or not cells:
        return _from(0.0, 0)
    mu = {c: 0.0 for c in configs}
    beta = {k: 0.0 for k in shared}
    for _ in range(50):
        for c in configs:
            own = [v - beta[k] for (cc, k), v in cells.items() if cc == c]
            mu[c] = sum(own) / len(own)
        for k in shared:
            ks = [v - mu[c] for (c, kk), v in cells.items() if kk == k]
            beta[k] = sum(ks) / len(ks)
    df = len(cells) - len(configs) - len(shared) + 1
    residuals = {(c, k): v - mu[c] - beta[k] for (c, k), v in cells.items()}
    if of is None:
        return _from(sum(e * e for e in residuals.values()), max(df, 0))
    mine = [e for (c, _), e in residuals.items() if c == of]
    share = max(df, 0) * len(mine) / len(cells)
    return _from(sum(e * e for e in mine), int(share)) if share >= 1 else _from(sum(e * e for e in mine), 0)


def collapsed(rates: Sequence[float]) -> list[int]:
    """The runs (indices into ``rates``) below :data:`COLLAPSED` of the fastest other run of the same config."""
    if len(rates) < 2:
        return []
    return [i for i, x in enumerate(rates) if x < COLLAPSED * max(y for j, y in enumerate(rates) if j != i)]


# --- a config's rate, and one config over another -------------------------------------------------------------


def mean_windows(intervals: Sequence[float | None]) -> float | None:
    """The windows' 95 % half-width of the mean of several runs' rates: their half-widths in quadrature over their
    number; None when any run has none."""
    if not intervals or any(i is None for i in intervals):
        return None
    return math.sqrt(sum(i * i for i in intervals)) / len(intervals)  # type: ignore[operator]


def mean_interval(runs: int, spread: Spread, windows: float | None = None) -> float:
    """Relative half-width of the 95 % interval of the mean of ``runs`` runs of a config: the run-to-run spread over
    √runs (Student's t of its degrees of freedom), never narrower than the windows' own interval (``windows``: the
    runs' windows' half-width, combined)."""
    half = math.expm1(spread.sd / math.sqrt(max(runs, 1)) * t_quantile(spread.df))
    return max(half, windows or 0.0)


@dataclass(frozen=True)
class Ratio:
    """One config's rate over another's, with its 95 % interval and what it rests on."""

    value: float
    low: float
    """Two-sided 95 % bounds (what is printed)."""
    high: float
    lower: float
    """One-sided 95 % lower bound (what the knee's test reads)."""
    upper: float
    """One-sided 95 % upper bound."""
    blocks: int
    """Paired blocks the figure rests on (0: the two means compared unpaired)."""
    selected: bool
    """Whether it rests on the run that chose the config (no other block shared)."""
    spread: Spread

    @property
    def paired(self) -> bool:
        return self.blocks > 0

    def basis(self) -> str:
        """What it rests on, in words: "paired over 2 block(s) of alternated runs", "one run each, unpaired, run-to-run
        spread 5% assumed", "…, on the runs that chose it"."""
        if self.paired:
            words = f"paired over {self.blocks} block(s) of alternated runs"
        else:
            words = "one run each, unpaired" if not self.spread.measured_df else "unpaired"
        if not self.spread.measured:
            words += f", run-to-run spread {RUN_SPREAD_PRIOR:.0%} assumed"
        return words + (", on the runs that chose it" if self.selected else "")


def _sd(half: float | None) -> float:
    """A 95 % half-width as a log-scale standard deviation (its normal quantile)."""
    return 0.0 if half is None or not math.isfinite(half) else math.log1p(half) / 1.959964


def _combined(a: Spread, b: Spread) -> Spread:
    """The spread of a ratio's two sides, each run's variance their mean (so a paired ratio's is twice it), at the
    fewer degrees of freedom of the two."""
    return Spread(math.sqrt((a.sd**2 + b.sd**2) / 2), min(a.df, b.df), min(a.measured_df, b.measured_df))


def ratio(
    a: Mapping[int, float],
    b: Mapping[int, float],
    *,
    paired: tuple[Spread, Spread],
    unpaired: tuple[Spread, Spread],
    a_windows: float | None = None,
    b_windows: float | None = None,
) -> Ratio:
    """``a``'s rate over ``b``'s (each: run → rate), each side with its own spread (``paired``: what is left of a
        run once its block's common shift is out; ``unpaired``: a whole run's). Paired over the blocks both ran in other
        than run 0 when there are any (the log ratio's mean over those blocks, its variance the two sides' over their
        number); else the two configs' mean rates unpaired (each side's runs after its first when it has any: the first
    chose it; each mean's variance its spread over its runs). Neither is
        narrower than the two windows' intervals (``a_windows``, ``b_windows``: each mean's half-width, combined)."""
    fresh = sorted(k for k in a if k in b and k >= 1 and a[k] > 0 and b[k] > 0)
    floor = math.hypot(_sd(a_windows), _sd(b_windows))
    if fresh:
        logs = [math.log(a[k] / b[k]) for k in fresh]
        centre = sum(logs) / len(logs)
        used = _combined(*paired)
        se = max(used.sd * math.sqrt(2.0 / len(fresh)), floor)
    else:  # each side's runs after the one that chose it, where it has any
        a, b = _later(a), _later(b)
        ra, rb = sum(a.values()) / len(a), sum(b.values()) / len(b)
        centre = math.log(ra / rb)
        used = _combined(*unpaired)
        se = max(math.sqrt(unpaired[0].sd ** 2 / len(a) + unpaired[1].sd ** 2 / len(b)), floor)
    two, one = t_quantile(used.df) * se, t_quantile(used.df, two_sided=False) * se
    selected = not fresh and 0 in a and 0 in b
    return Ratio(
        math.exp(centre),
        math.exp(centre - two),
        math.exp(centre + two),
        math.exp(centre - one),
        math.exp(centre + one),
        len(fresh),
        selected,
        used,
    )


def _later(runs: Mapping[int, float]) -> Mapping[int, float]:
    """A config's runs after its first (the stages' run, which chose it) when it has any, else all of them."""
    later = {k: v for k, v in runs.items() if k >= 1}
    return later or runs


def within_tolerance(r: Ratio, tolerance: float) -> bool | None:
    """The knee's test of ``a`` against the best (``r``: a's rate over the best's): True when its one-sided 95 %
    lower bound is at least ``1 - tolerance`` (within tolerance, beyond doubt), False when its upper bound is below
    it (out, beyond doubt), None when the interval straddles it (undecided)."""
    if r.lower >= 1.0 - tolerance:
        return True
    if r.upper < 1.0 - tolerance:
        return False
    return None


def beats(r: Ratio) -> bool:
    """Whether ``a`` is faster than ``b`` beyond doubt: the printed interval's lower end above 1 (keep your
    settings unless so)."""
    return r.low > 1.0


# --- tunekit check -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckTest:
    """A committed figure against fresh runs of its config: the change and its one-sided 95 % bounds."""

    status: str
    """``regressed`` (slower than the tolerance allows, beyond doubt), ``holds`` (within it, beyond doubt),
    ``faster`` (faster beyond the tolerance, beyond doubt), ``inconclusive`` (the bounds straddle the tolerance)."""
    change: float
    """The runs' mean over the recorded rate, less 1."""
    lower: float
    upper: float
    """One-sided 95 % bounds of the change."""
    tolerance: float


def check_test(
    recorded: float,
    recorded_half: float | None,
    spread: Spread,
    rates: Sequence[float],
    windows: float | None,
    tolerance: float,
) -> CheckTest:
    """``rates`` (fresh runs of the committed config) against ``recorded`` (its rate, with the 95 % half-width
    ``recorded_half`` of the runs it is the mean of) with the recorded run-to-run ``spread``: the log of the change
    has the variance of the fresh runs' mean (spread² over their number, at least the windows' ``windows``) plus
    the recorded figure's; one-sided 95 % bounds at the spread's degrees of freedom. Regressed when the upper bound
    lies below ``1 - tolerance``, faster when the lower one lies above ``1 + tolerance``, holds when the lower one
    is at least ``1 - tolerance``, else inconclusive."""
    mean = sum(rates) / len(rates)
    change = math.log(mean / recorded)
    rec_sd = math.log1p(recorded_half) / t_quantile(spread.df) if recorded_half and math.isfinite(recorded_half) else 0
    se = math.hypot(max(spread.sd / math.sqrt(len(rates)), _sd(windows)), rec_sd)
    t = t_quantile(spread.df, two_sided=False)
    lower, upper = math.expm1(change - t * se), math.expm1(change + t * se)
    if upper < -tolerance:
        status = "regressed"
    elif lower > tolerance:
        status = "faster"
    elif lower >= -tolerance:
        status = "holds"
    else:
        status = "inconclusive"
    return CheckTest(status, math.expm1(change), lower, upper, tolerance)
