"""Stage 3: the end-to-end walk over workers x pin_memory at the chosen batch, from the start its ceilings give, with
the script's own settings and PyTorch's defaults; what its own evidence lets it skip (docs/plan.md)."""

from __future__ import annotations

import itertools

from tunekit import rules
from tunekit.contract import Knobs, Mode, Stage
from tunekit.plan._ceilings import _reaches
from tunekit.plan._finished import Skips, _compute_at, _Finished
from tunekit.plan._request import Request, pending, pins
from tunekit.records import TrialRow


def _defaults(s: _Finished, batch: int) -> Request:
    """PyTorch's DataLoader defaults at the chosen batch: every report's baseline."""
    return Request(
        Stage.end_to_end,
        Mode.train,
        Knobs.of(num_workers=0, batch_size=batch, pin_memory=False, ranks=s.world, **{**s.base, "compile": "none"}),
    )


def _defaults_owed(s: _Finished, batch: int) -> list[Request]:
    """The defaults trial while it is owed: not when the script's own settings completed as PyTorch's defaults at
    this batch (one config is one figure: that trial serves both, ``analysis.defaults_trial``)."""
    own = next((r for r in s.raw if r.stage == Stage.baseline and r.ok and r.mode == Mode.train), None)
    if own is not None and own.knobs.pytorch_defaults and (own.knobs.batch_size, own.knobs.grad_accum) == (batch, 1):
        return []
    return pending([_defaults(s, batch)], s.raw)


def _end_to_end(s: _Finished) -> list[Request] | None:
    """Workers x pin_memory at the chosen batch, planned from the ceilings: the fewest workers whose loader ceiling
    reaches the compute ceiling (the most workers when none does); in script mode then the script's own settings
    (the report's gain is over them; raced against the band the start gave, as the defaults: a script's own settings
    are usually far below it, and before any band existed that trial measured every window); then PyTorch's
    defaults (every report's baseline, raced against the band the start gave: it is almost always far below it,
    and a 0-worker trial's windows are the longest of a sweep; the driver runs these baselines even when the
    budget ends the sweep first); one count
    above the start to confirm, further up only while that gains beyond the band; then down from the start while
    the counts stay within the band of the best, a count whose loader ceiling cannot reach the band skipped with
    that evidence."""
    batch = s.batch
    assert batch is not None  # the loader stage stops the sweep without one
    counts = sorted(s.search.num_workers)
    start = _start_count(s, batch, counts)
    first = pending(_at_count(s, batch, start), s.raw)
    if first:
        return [_maybe_skip(first[0], s)]
    own = _script_baseline(s)
    if own:
        return own
    defaults = _defaults_owed(s, batch)
    if defaults:
        return defaults
    below = sorted((c for c in counts if c < start), reverse=True)
    up, plateau = _climb(s, batch, counts, start)
    band: dict[bool, Skips] = {}  # per pin setting: what the lowest count measured with it says of fewer
    for w in up + below:
        left = pending(_at_count(s, batch, w), s.raw)
        if left:
            skips = {**plateau, **{k: v for found in band.values() for k, v in found.items()}}
            return [_walked(left[0], s, skips)]
        # walking down, a count measured in full: its evidence on fewer workers replaces that of the counts above
        # it, pin setting by pin setting (the nearest measured count is the one that speaks for those below). A
        # count above the start says nothing of those below it: the start, within the band, lies between them.
        if w <= start:
            band.update(_below_band(s, batch, w, [c for c in below if c < w]))
    return []


def _below_band(s: _Finished, batch: int, workers: int, fewer: list[int]) -> dict[bool, Skips]:
    """Walking down: once a worker count falls out of the band of the best with one pin setting, and out of the band
    of the fastest count measured above it with that setting (past that count's peak, beyond noise), fewer workers
    with it will not climb back into the band.
    Per pin setting measured at ``workers`` (and fitting), the requests at ``fewer`` counts to skip with that
    evidence, or none. A count within the band of the counts above it (or faster), or with none measured above it
    (the walk's first, at the most workers), is no such evidence: with more workers than the CPUs can run, fewer
    workers contend less and can deliver more. Against the fastest above, not the nearest, a slow decline within
    the band at each step is still cut once it has fallen out of the band of its peak."""
    fitting = [r for r in s.done(Stage.end_to_end) if r.ok and rules.fits(r, s.selection)]
    if not fitting:
        return {}
    best = max(fitting, key=lambda r: r.rate)
    allowed = rules.band(fitting, s.selection)
    found: dict[bool, Skips] = {}
    for req in _at_count(s, batch, workers):
        here = s.find(req)
        if here is None or not here.ok or not rules.fits(here, s.selection):
            continue  # not measured, or failed: the counts above still speak for those below
        pin = req.knobs.pin_memory
        found[pin] = {}
        above = _fastest_above(s, batch, workers, pin)
        if not fewer or here.rate >= rules.needed(best, allowed) or above is None:
            continue
        if here.rate >= rules.needed(above, allowed):
            continue  # not slower than the counts above beyond the band: which way the curve runs is noise
        pinned = ("pinned " if pin else "unpinned ") if len(pins(s.cfg, s.cuda)) > 1 else ""
        reason = (
            f"{workers} workers {pinned}(trial {here.number}, {here.rate:.1f} {here.unit}/s) already fell out "
            f"of the band ({allowed:.1%}) of the best config so far ({best.rate:.1f}, trial {best.number}), below "
            f"{above.knobs.num_workers} workers (trial {above.number}, {above.rate:.1f}): "
            f"fewer workers {pinned}do not deliver more"
        )
        found[pin] = {
            r.key: (reason, (here.rate, here.number))
            for w in fewer
            for r in _at_count(s, batch, w)
            if r.knobs.pin_memory == pin
        }
    return found


def _fastest_above(s: _Finished, batch: int, workers: int, pin: bool) -> TrialRow | None:
    """The fastest fitting end-to-end trial with more workers than ``workers``, the same pin setting and batch."""
    above = [
        r
        for r in s.done(Stage.end_to_end)
        if r.ok
        and r.knobs.num_workers > workers
        and r.knobs.pin_memory == pin
        and r.knobs.batch_size == batch
        and rules.fits(r, s.selection)
    ]
    return max(above, key=lambda r: r.rate, default=None)


def _at_count(s: _Finished, batch: int, workers: int) -> list[Request]:
    """The end-to-end requests at one worker count, pinned first."""
    return [
        Request(
            Stage.end_to_end,
            Mode.train,
            Knobs.of(num_workers=workers, batch_size=batch, pin_memory=p, ranks=s.world, **s.base),
        )
        for p in reversed(pins(s.cfg, s.cuda))
    ]


def _start_count(s: _Finished, batch: int, counts: list[int]) -> int:
    """The fewest workers whose one-rank loader ceiling reaches the one-GPU compute ceiling within the tolerance (per
    rank, both), or the most workers when none does (or the ceilings are missing)."""
    compute = _compute_at(s, batch)
    if compute is None:
        return counts[-1]
    for w in counts:
        loader = [r for r in s.done(Stage.loader) if r.ok and r.knobs.num_workers == w and r.knobs.batch_size == batch]
        if w and any(_reaches(s, r, compute) for r in loader):
            return w
    return counts[-1]


def _best_at(s: _Finished, batch: int, workers: int) -> TrialRow | None:
    found = [
        r
        for r in s.done(Stage.end_to_end)
        if r.ok and r.knobs.num_workers == workers and r.knobs.batch_size == batch and rules.fits(r, s.selection)
    ]
    return max(found, key=lambda r: r.rate) if found else None


def _climb(s: _Finished, batch: int, counts: list[int], start: int) -> tuple[list[int], Skips]:
    """The start and every count above it, in order, and the requests to skip above a confirmed plateau. The next
    one up confirms the plateau; further up runs only while the last step up gained more than the band, the rest
    above being skipped with that evidence."""
    up = [start, *(c for c in counts if c > start)]
    for lower, upper in itertools.pairwise(up):
        low, high = _best_at(s, batch, lower), _best_at(s, batch, upper)
        if low is None or high is None:
            break  # not measured yet: _end_to_end runs them in this order first
        allowed = rules.band([r for r in s.done(Stage.end_to_end) if r.ok], s.selection)
        if high.rate <= low.rate * (1.0 + allowed):
            return up, _above_plateau(s, batch, [c for c in up if c > upper], low, high, allowed)
    return up, {}


def _above_plateau(s: _Finished, batch: int, counts: list[int], low: TrialRow, high: TrialRow, allowed: float) -> Skips:
    """The requests at ``counts``, above a confirmed plateau, to skip (the plan returns them one by one)."""
    reason = (
        f"{high.knobs.num_workers} workers (trial {high.number}, {high.rate:.1f} {high.unit}/s) gained no more "
        f"than the band ({allowed:.1%}) over {low.knobs.num_workers} (trial {low.number}, {low.rate:.1f}): "
        "the throughput is on its plateau, more workers only add cost"
    )
    return {r.key: (reason, None) for w in counts for r in _at_count(s, batch, w)}


def _walked(req: Request, s: _Finished, skips: Skips) -> Request:
    """A request of the walk as it is returned: skipped with the walk's own evidence (a plateau above, a count
    below the band) when it has some, else as :func:`_maybe_skip` judges it."""
    if req.key in skips and not req.knobs.loader_defaults:  # the defaults run whatever the walk found
        return req.skipped(*skips[req.key])
    return _maybe_skip(req, s)


def _maybe_skip(req: Request, s: _Finished) -> Request:
    """Skip an end-to-end trial whose loader ceiling cannot reach the band of the best end-to-end trial so far."""
    if req.knobs.loader_defaults:
        return req  # PyTorch's defaults: always measured, the baseline of every report
    # The ceiling bounds only trials with its own pin_memory setting: pinning moves work onto the main process (the
    # pin-memory thread), so the loader can be slower pinned than unpinned when the CPUs are saturated.
    # the ceiling at this count, else at the fewest measured workers above it: more workers deliver no less
    ceiling = min(
        (
            r
            for r in s.done(Stage.loader)
            if r.ok and r.knobs.num_workers >= req.knobs.num_workers and r.knobs.pin_memory == req.knobs.pin_memory
        ),
        key=lambda r: r.knobs.num_workers,
        default=None,
    )
    fitting = [r for r in s.done(Stage.end_to_end) if r.ok and rules.fits(r, s.selection)]
    if ceiling is None or not fitting:
        return req
    best = max(fitting, key=lambda r: r.rate)
    allowed = rules.band(fitting, s.selection)
    target = rules.needed(best, allowed)
    if rules.can_reach(ceiling, target, s.selection, req.knobs.ranks):
        return req
    ranks = req.knobs.ranks
    times = f" per rank, {ranks} ranks at most {ceiling.rate * ranks:.1f}," if ranks > 1 else ""
    at = (
        f"{req.knobs.num_workers} workers"
        if ceiling.knobs.num_workers == req.knobs.num_workers
        else f"{ceiling.knobs.num_workers} workers, more than {req.knobs.num_workers}"
    )
    return req.skipped(
        f"the loader alone gives {ceiling.rate:.1f} {ceiling.unit}/s at {at} (trial "
        f"{ceiling.number}){times} below the {target:.1f} needed to come within the band ({allowed:.1%}) of the best "
        f"end-to-end config so far ({best.rate:.1f}, trial {best.number})",
        bound=(ceiling.rate * ranks, ceiling.number),
    )


def _script_baseline(s: _Finished) -> list[Request]:
    """Script mode only: the user's script with its own settings (each placeholder left out with its flag, unless
    script.baseline gives it; nothing set on its DataLoader): what the report's gain is over. A staged sweep runs it
    after the start of the end-to-end walk (first of all with script.own_batch, whose batch it gives; a grid, first
    of all). It is one trial whatever its knobs turn out to be (it records what its loader really got), so it is
    done once any baseline trial is finished."""
    if not s.cfg.own_settings or s.done(Stage.baseline):
        return []
    return [Request(Stage.baseline, Mode.train, _script_request_knobs(s))]


def _script_request_knobs(s: _Finished) -> Knobs:
    return Knobs.of(batch_size=max(s.search.batch_size), ranks=s.world, **s.base)
