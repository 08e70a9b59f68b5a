from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from tunekit import rules
from tunekit.analysis import choose_batch, pooled, select, select_knee
from tunekit.config import Config, Selection, extra_knobs
from tunekit.contract import Knobs, Mode, Stage
from tunekit.plan._request import Request, base_knobs, pending, pins
from tunekit.records import TrialRow, compute_ceiling


class _Finished:
    """The finished trials as every stage reads them, under one config: the trials of a stage, the chosen batch and
    the knee before each stage. Made afresh on every ask and never written by a stage: what a stage decides it
    returns."""

    def __init__(self, cfg: Config, rows: list[TrialRow], cuda: bool):
        self.cfg, self.cuda = cfg, cuda
        self.raw = rows
        """Every finished trial, each repeat its own."""
        self.rows = pooled(rows)
        """The finished trials with each config's repeats pooled into one row (``analysis.pooled``)."""
        self.search, self.selection = cfg.search, cfg.selection
        self.base = base_knobs(cfg)
        self.world = cfg.launch.world
        """Ranks of the end-to-end trials (the ceilings run on one GPU)."""
        self._knees: dict[Stage | None, TrialRow | None] = {}
        """:meth:`knee`'s answers, kept: each is a function of the rows, which do not change."""

    def done(self, *stages: Stage) -> list[TrialRow]:
        return [r for r in self.rows if r.stage in stages]

    def find(self, req: Request) -> TrialRow | None:
        """The finished trial of ``req``: run with its knobs, or asked for with them (the script ran others)."""
        return next((r for r in self.raw if req.key in (r.key, r.asked_key)), None)

    @property
    def batch(self) -> int | None:
        return choose_batch(self.done(Stage.compute), self.selection)

    def knee(self, before: Stage | None) -> TrialRow | None:
        """The knee of the knee stages that run before ``before`` (of all of them for None; the best config while
        there is no knee yet: a single config can still be refined)."""
        if before not in self._knees:
            found = select_knee([r for r in self.done(*rules.knee_stages(before)) if not rules.changes_result(r)],
                                self.selection)
            self._knees[before] = found.knee or found.best
        return self._knees[before]


StagePlan = Callable[[_Finished], "list[Request] | None"]
"""A stage's planner: its pending requests, [] when it is complete, None when the sweep cannot go on."""

Skips = Mapping[tuple[Any, ...], tuple[str, "tuple[float, int] | None"]]
"""End-to-end requests (by ``Request.key``) that the walk's own evidence says need not run, with the reason and the
upper bound it shows (``Request.bound``; None above a plateau, which bounds nothing)."""


def _compute(s: _Finished) -> list[Request] | None:
    """Batch sizes from the largest down: past those that run out of memory or over the headroom limit, then down
    while each stays within the band of the best that fits at its size or above, stopping at the first that falls
    out of it (per-sample throughput does not rise as the batch shrinks, and the batch chosen is the smallest within
    the band: the smaller ones cannot be it). With target_effective_batch every batch is measured: the accumulation
    stage weighs each micro-batch against its ceiling. Stage 4b measures a smaller batch's ceiling when it needs it."""
    done = {r.knobs.batch_size: r for r in s.done(Stage.compute)}
    for batch in sorted(s.search.batch_size, reverse=True):
        row = done.get(batch)
        if row is None:
            return [_ceiling_request(s, batch)]
        if s.search.target_effective_batch or not row.ok or not rules.fits(row, s.selection):
            continue
        above = [r for b, r in done.items() if b >= batch and r.ok and rules.fits(r, s.selection)]
        if row.rate < rules.needed(max(above, key=lambda r: r.rate), rules.band(above, s.selection)):
            return []
    return []


def _ceiling_request(s: _Finished, batch: int) -> Request:
    return Request(Stage.compute, Mode.compute, Knobs(num_workers=0, batch_size=batch, **s.base))


def _loader(s: _Finished) -> list[Request] | None:
    """The loader alone (pinned when pinning is searched on a GPU), only where its ceiling decides something: the
    most workers first; when that ceiling reaches the compute ceiling, a bisection of the counts for the fewest that
    does (the start of the end-to-end walk; loader ceilings rise with workers). The other counts are skipped with
    that evidence: the end-to-end walk measures the counts around its start directly."""
    batch = s.batch
    if batch is None:
        return None
    pin = pins(s.cfg, s.cuda)[-1]
    reqs = {w: Request(Stage.loader, Mode.loader, Knobs(num_workers=w, batch_size=batch, pin_memory=pin, **s.base))
            for w in s.search.num_workers}
    compute = _compute_at(s, batch)
    counts = sorted(w for w in reqs if w)
    if compute is None or not counts:
        return pending(list(reqs.values()), s.raw)  # nothing to compare with: every count
    while counts and (failed := s.find(reqs[counts[-1]])) is not None and not failed.ok:
        counts.pop()  # the loader failed at the most workers (out of memory, say): the next most stands in
    if not counts:
        return [req.skipped("the loader alone failed at every worker count tried") for req in
                pending(list(reqs.values()), s.raw)]
    lo, hi = 0, len(counts) - 1  # counts[hi] reaches the compute ceiling (or is the most); below lo none does
    top = s.find(reqs[counts[hi]])
    if top is None:
        return [reqs[counts[hi]]]
    if _reaches(s, top, compute):
        while lo < hi:
            mid = (lo + hi) // 2
            row = s.find(reqs[counts[mid]])
            if row is None:
                return [reqs[counts[mid]]]
            lo, hi = (lo, mid) if _reaches(s, row, compute) else (mid + 1, hi)
        start = s.find(reqs[counts[hi]])
        assert start is not None
        reason = (f"the fewest workers whose loader ceiling reaches the compute ceiling ({compute.rate:.1f} "
                  f"{compute.unit}/s at batch {batch}, trial {compute.number}) are {counts[hi]} (trial {start.number}, "
                  f"{start.rate:.1f}), found by bisection: the end-to-end walk starts there and measures the "
                  "counts around it directly")
    else:
        reason = (f"the loader alone at the most workers, {counts[hi]}, gives {top.rate:.1f} {top.unit}/s (trial "
                  f"{top.number}), below the compute ceiling ({compute.rate:.1f} at batch {batch}, trial "
                  f"{compute.number}): the end-to-end walk starts at {counts[hi]} workers and measures fewer directly")
    return [req.skipped(reason) for req in pending(list(reqs.values()), s.raw)]


def _fitting_batches(s: _Finished) -> list[int]:
    """The searched batch sizes that fit, largest first: each measured one that fits the headroom limit, and each
    the compute stage left unmeasured under the smallest of those (a smaller batch needs less memory)."""
    fitting = {r.knobs.batch_size for r in s.done(Stage.compute) if r.ok and rules.fits(r, s.selection)}
    measured = {r.knobs.batch_size for r in s.done(Stage.compute)}
    if not fitting:
        return []
    smallest = min(fitting)
    return sorted((b for b in s.search.batch_size if b in fitting or (b < smallest and b not in measured)),
                  reverse=True)


def _compute_at(s: _Finished, batch: int) -> TrialRow | None:
    return compute_ceiling(s.done(Stage.compute), batch)


def band_target(rows: list[TrialRow], selection: Selection) -> float | None:
    """The rate a config must reach to come within the band of the best knee candidate so far (completed
    knee-stage trials that fit and keep the training result, as analysis.select takes them, each config's repeats
    pooled); None without one."""
    rows = pooled(rows)
    fitting = [r for r in rows if r.ok and r.stage.knee and rules.fits(r, selection)
               and not rules.changes_result(r)]
    if not fitting:
        return None
    return rules.needed(max(fitting, key=lambda r: r.rate), rules.band(fitting, selection, rules.run_spread(rows)))


def reach_rate(compute: TrialRow, selection: Selection) -> float:
    """The rate at which a one-rank loader ceiling reaches the one-GPU compute ceiling: within the tolerance."""
    return compute.rate * (1.0 - selection.tolerance)


def _reaches(s: _Finished, loader: TrialRow, compute: TrialRow) -> bool:
    """Whether a one-rank loader ceiling reaches the one-GPU compute ceiling within the tolerance."""
    return loader.ok and loader.rate >= reach_rate(compute, s.selection)


def _defaults(s: _Finished, batch: int) -> Request:
    """PyTorch's DataLoader defaults at the chosen batch: every report's baseline."""
    return Request(Stage.end_to_end, Mode.train, Knobs(num_workers=0, batch_size=batch, pin_memory=False,
                                                       ranks=s.world, **{**s.base, "compile": "none"}))


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
    defaults = _defaults(s, batch)
    if pending([defaults], s.raw):
        return [defaults]
    below = sorted((c for c in counts if c < start), reverse=True)
    up, skips = _climb(s, batch, counts, start)
    for w in up + below:
        left = pending(_at_count(s, batch, w), s.raw)
        if left:
            return [_walked(left[0], s, skips)]
        # walking down, a count measured in full: fewer workers with a pin setting that fell out of the band are
        # skipped too (the first reason found for a request stands). A count above the start says nothing of those
        # below it: the start, within the band, lies between them.
        if w <= start:
            skips = {**_below_band(s, batch, w, [c for c in below if c < w]), **skips}
    return []


def baseline_request(cfg: Config, rows: list[TrialRow], cuda: bool) -> Request | None:
    """The baseline trial a staged sweep that has chosen its batch still owes its report (None when none is): in
    script mode the script's own settings first (the gain the report leads with), then the PyTorch defaults. The
    driver runs it before a budget ends the sweep, so no report lacks its baseline."""
    s = _Finished(cfg, rows, cuda)
    batch = s.batch if _compute(s) == [] else None  # the compute stage over: the batch is final
    if batch is None:
        return None
    found = _script_baseline(s) or pending([_defaults(s, batch)], rows)
    return found[0] if found else None


def _below_band(s: _Finished, batch: int, workers: int, fewer: list[int]) -> Skips:
    """Walking down: once a worker count falls out of the band of the best with one pin setting, fewer workers with
    that setting will not climb back into it: the requests at ``fewer`` counts to skip with that evidence."""
    fitting = [r for r in s.done(Stage.end_to_end) if r.ok and rules.fits(r, s.selection)]
    if not fitting or not fewer:
        return {}
    best = max(fitting, key=lambda r: r.rate)
    allowed = rules.band(fitting, s.selection)
    skips: dict[tuple[Any, ...], tuple[str, tuple[float, int] | None]] = {}
    for req in _at_count(s, batch, workers):
        here = s.find(req)
        if here is None or not here.ok or not rules.fits(here, s.selection) or here.rate >= rules.needed(best, allowed):
            continue
        pinned = ("pinned " if req.knobs.pin_memory else "unpinned ") if len(pins(s.cfg, s.cuda)) > 1 else ""
        reason = (f"{workers} workers {pinned}(trial {here.number}, {here.rate:.1f} {here.unit}/s) already fell out "
                  f"of the band ({allowed:.1%}) of the best config so far ({best.rate:.1f}, trial {best.number}): "
                  f"fewer workers {pinned}do not deliver more")
        skips.update({r.key: (reason, (here.rate, here.number)) for w in fewer for r in _at_count(s, batch, w)
                      if r.knobs.pin_memory == req.knobs.pin_memory})
    return skips


def _at_count(s: _Finished, batch: int, workers: int) -> list[Request]:
    """The end-to-end requests at one worker count, pinned first."""
    return [Request(Stage.end_to_end, Mode.train, Knobs(num_workers=workers, batch_size=batch, pin_memory=p,
                                                        ranks=s.world, **s.base))
            for p in reversed(pins(s.cfg, s.cuda))]


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
    found = [r for r in s.done(Stage.end_to_end) if r.ok and r.knobs.num_workers == workers
             and r.knobs.batch_size == batch and rules.fits(r, s.selection)]
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


def _above_plateau(s: _Finished, batch: int, counts: list[int], low: TrialRow, high: TrialRow,
                   allowed: float) -> Skips:
    """The requests at ``counts``, above a confirmed plateau, to skip (the plan returns them one by one)."""
    reason = (f"{high.knobs.num_workers} workers (trial {high.number}, {high.rate:.1f} {high.unit}/s) gained no more "
              f"than the band ({allowed:.1%}) over {low.knobs.num_workers} (trial {low.number}, {low.rate:.1f}): "
              "the throughput is on its plateau, more workers only add cost")
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
    ceiling = min((r for r in s.done(Stage.loader) if r.ok and r.knobs.num_workers >= req.knobs.num_workers
                   and r.knobs.pin_memory == req.knobs.pin_memory), key=lambda r: r.knobs.num_workers, default=None)
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
    at = (f"{req.knobs.num_workers} workers" if ceiling.knobs.num_workers == req.knobs.num_workers
          else f"{ceiling.knobs.num_workers} workers, more than {req.knobs.num_workers}")
    return req.skipped(
        f"the loader alone gives {ceiling.rate:.1f} {ceiling.unit}/s at {at} (trial "
        f"{ceiling.number}){times} below the {target:.1f} needed to come within the band ({allowed:.1%}) of the best "
        f"end-to-end config so far ({best.rate:.1f}, trial {best.number})", bound=(ceiling.rate * ranks,
                                                                                  ceiling.number))


def _prefetch(s: _Finished) -> list[Request] | None:
    """The other prefetch factors at the knee (only with workers); skipped with the evidence when the knee hardly
    waits on data, or keeps the CPUs busy (the search's smallest factor runs first: the others only put more
    batches in flight)."""
    knee = s.knee(Stage.prefetch)
    if knee is None:
        return None
    k = knee.knobs
    if k.num_workers == 0:
        return []
    left = pending([Request(Stage.prefetch, Mode.train, Knobs(**{**k.to_dict(), "prefetch_factor": pf}))
                    for pf in s.search.prefetch_factor if pf != k.prefetch_factor], s.raw)
    m = knee.measurement
    wait = m.data_wait_frac if m.data_wait_frac_max is None else m.data_wait_frac_max  # the rank that waits most
    deeper = all((r.knobs.prefetch_factor or 0) > (k.prefetch_factor or 0) for r in left)
    if left and deeper and wait is not None and wait < rules.NO_WAIT:
        return [left[0].skipped(f"the knee (trial {knee.number}) waits on data {wait:.1%} of the time, under "
                                f"{rules.NO_WAIT:.0%}: more batches in flight cannot make it faster")]
    if left and deeper and rules.keeps_cpus_busy(knee):
        return [left[0].skipped(
            f"the knee (trial {knee.number}) keeps {m.cpu_util_frac or 0.0:.0%} of its usable CPUs busy, over "
            f"{rules.CPU_SATURATED:.0%}: more batches in flight are made with the same CPU time, so they cannot "
            "arrive faster")]
    return left


def _smaller_batches(s: _Finished) -> list[Request] | None:
    """Stage 4b: when the knee runs below :data:`rules.NEAR_CEILING` of its compute ceiling, its config at the next
    smaller batch that fits, then the next, while each keeps within the band of the best. A batch the compute stage
    did not reach gets its ceiling once it keeps within the band, before the next smaller batch."""
    knee = s.knee(Stage.batch)
    if knee is None or s.search.target_effective_batch:
        return []  # with a target, the accumulation stage chooses the micro-batch
    ceilings = {r.knobs.batch_size: r for r in s.done(Stage.compute) if r.ok and rules.fits(r, s.selection)}
    if not rules.input_bound(knee, ceilings.get(knee.knobs.batch_size)):
        return []  # the model is the bound (or unknown): a smaller batch only adds per-step overhead
    measured = {r.knobs.batch_size: r for r in s.done(Stage.compute)}
    for batch in sorted((b for b in s.search.batch_size if b < knee.knobs.batch_size), reverse=True):
        if batch in measured and batch not in ceilings:
            return []  # a smaller batch whose ceiling failed or does not fit: the stage ends there
        req = Request(Stage.batch, Mode.train, Knobs(**{**knee.knobs.to_dict(), "batch_size": batch}))
        # judged against this batch and the larger ones only: a smaller batch that later ran faster must not
        # make this one look as if it fell behind
        trials = [r for r in s.done(*rules.knee_stages(Stage.compile)) if r.ok and rules.fits(r, s.selection)
                  and (r.stage != Stage.batch or r.knobs.batch_size >= batch)]
        best = max(trials, key=lambda r: r.rate)
        allowed = rules.band(trials, s.selection)
        target = rules.needed(best, allowed)
        row, ceiling = s.find(req), ceilings.get(batch)
        if row is None:
            # a batch below where the compute stage stopped has no ceiling yet: tried end to end first (an
            # input-bound knee runs far below any ceiling), its ceiling measured only once it keeps within the band
            if ceiling is None or rules.can_reach(ceiling, target, s.selection, knee.knobs.ranks):
                return [req]
            return [req.skipped(
                f"the compute ceiling at batch {batch} is {ceiling.rate:.1f} {ceiling.unit}/s (trial "
                f"{ceiling.number}), "
                f"below the {target:.1f} needed to come within the band ({allowed:.1%}) of the best config so far "
                f"({best.rate:.1f}, trial {best.number})")]
        if not row.ok or row.rate < target:
            return []  # this batch fell behind (or failed): a smaller one will not do better
        if ceiling is None:  # the knee may land here: the verdicts and later stages read its ceiling
            return [_ceiling_request(s, batch)]
    return []


def _compile(s: _Finished) -> list[Request] | None:
    """The other compile modes at the knee; skipped with the evidence when the knee waits on data below its compute
    ceiling (a faster model changes nothing then, and compiling costs tens of seconds a trial)."""
    knee = s.knee(Stage.compile)
    if knee is None:
        return None
    k = knee.knobs
    left = pending([Request(Stage.compile, Mode.train, Knobs(**{**k.to_dict(), "compile": c}))
                    for c in s.search.compile if c != k.compile], s.raw)
    ceiling = _compute_at(s, k.batch_size)
    share, wait = rules.of_ceiling(knee, ceiling), knee.measurement.data_wait_frac or 0.0
    if left and rules.waits_on_data(wait, share) and share is not None:
        return [left[0].skipped(
            f"the knee (trial {knee.number}) waits on data {wait:.0%} of the time at {share:.0%} of its compute "
            f"ceiling (trial {ceiling.number}): the input pipeline is the bound, so a faster model changes nothing")]
    return left


def _extra(s: _Finished) -> list[Request] | None:
    """The user-defined knobs (search.extra) and the thread counts (search.threads, search.worker_threads, the
    latter only with workers) at the knee, one at a time, each value other than its baseline, when the knee is
    input-bound (skipped with the evidence otherwise: a knob of the pipeline cannot speed up a model
    that is the bound). Then, when a value that keeps the training result beats the knee, its config with fewer
    workers, the fewest within the band found by bisection (a faster pipeline may need fewer of them), and, when
    that knee sits at a smaller batch than the sweep's and is no longer input-bound, its config at the sweep's
    batch (:func:`_batch_after_knobs`)."""
    knobs = extra_knobs(s.cfg)
    if not knobs and not s.search.threads and not s.search.worker_threads:  # null or not searched
        return []
    knee = s.knee(Stage.extra)
    if knee is None:
        return None
    tries = [Request(Stage.extra, Mode.train, knee.knobs.with_extra(k.key, v, k.baseline))
             for k in knobs for v in k.values if v != dict(knee.knobs.extra).get(k.key, k.baseline)]
    tries += [Request(Stage.extra, Mode.train, Knobs(**{**knee.knobs.to_dict(), "threads": t}))
              for t in s.search.threads or [] if t != knee.knobs.threads]
    tries += [Request(Stage.extra, Mode.train, Knobs(**{**knee.knobs.to_dict(), "worker_threads": t}))
              for t in s.search.worker_threads or [] if t != knee.knobs.worker_threads and knee.knobs.num_workers]
    left = pending(tries, s.raw)
    ceiling = _compute_at(s, knee.knobs.batch_size)
    if left and not rules.input_bound(knee, ceiling):
        share = rules.of_ceiling(knee, ceiling)
        where = f"{share:.0%} of its compute ceiling" if share is not None else "without a compute ceiling"
        return [left[0].skipped(f"the knee (trial {knee.number}) runs at {where}: the input pipeline is not the "
                                "bound, so a knob of the pipeline cannot make it faster")]
    if left:
        return left[:1]
    return _fewer_workers(s, knee, [s.find(r) for r in tries]) or _batch_after_knobs(s)


def _fewer_workers(s: _Finished, knee: TrialRow, tried: list[TrialRow | None]) -> list[Request]:
    """The fastest user-knob trial that keeps the training result and beats the knee, with fewer workers: the
    fewest that stay within the band of the best, found by bisection of the smaller counts (throughput does not
    rise as workers are taken away, as the end-to-end walk down assumes), so five smaller counts cost three
    trials, not five."""
    faster = [r for r in tried if r is not None and r.ok and not rules.changes_result(r) and r.rate > knee.rate
              and rules.fits(r, s.selection)]
    if not faster:
        return []
    top = max(faster, key=lambda r: r.rate)
    target = band_target(s.rows, s.selection) or 0.0  # the trials in ``faster`` are candidates: never None
    # worker threads exist only with workers: without any, the config would lose the knob that made it faster
    counts = sorted(c for c in s.search.num_workers if c < top.knobs.num_workers
                    and (c or top.knobs.worker_threads is None))
    lo, hi = 0, len(counts)  # counts[hi] (top's own count when hi == len) is within the band; below lo none is
    while lo < hi:
        mid = (lo + hi) // 2
        req = Request(Stage.extra, Mode.train, Knobs(**{**top.knobs.to_dict(), "num_workers": counts[mid]}))
        row = s.find(req)
        if row is None:
            return [req]
        within = row.ok and rules.fits(row, s.selection) and row.rate >= target
        lo, hi = (lo, mid) if within else (mid + 1, hi)
    return []


def _batch_after_knobs(s: _Finished) -> list[Request]:
    """A user knob's knee at a smaller batch than the sweep's (stage 4b moved it there while the input pipeline
    was the bound) that is no longer input-bound: its config at the sweep's batch, once. The model is the bound
    now, and the larger batch has the higher compute ceiling that a smaller one gave up for nothing while the loader
    held both back."""
    knee, batch = s.knee(Stage.accumulation), s.batch
    if knee is None or batch is None or knee.stage != Stage.extra or knee.knobs.batch_size >= batch:
        return []
    here, there = _compute_at(s, knee.knobs.batch_size), _compute_at(s, batch)
    if here is None or there is None or there.rate <= here.rate or rules.input_bound(knee, here):
        return []
    return pending([Request(Stage.extra, Mode.train, Knobs(**{**knee.knobs.to_dict(), "batch_size": batch}))], s.raw)


def _accumulation(s: _Finished) -> list[Request] | None:
    """Micro-batch x steps pairs that reach target_effective_batch, at the knee's loader settings."""
    target = s.search.target_effective_batch
    knee = s.knee(Stage.accumulation)
    if not target or knee is None:
        return []
    fit = set(_fitting_batches(s))
    return pending([Request(Stage.accumulation, Mode.train,
                            Knobs(**{**knee.knobs.to_dict(), "batch_size": b, "grad_accum": target // b}))
                    for b in s.search.batch_size if target % b == 0 and b in fit], s.raw)


def _scaling(s: _Finished) -> list[Request] | None:
    """A multi-rank knee's config on one GPU, for the scaling efficiency (never a knee candidate: another job)."""
    knee = s.knee(None)
    if s.world < 2 or knee is None or knee.knobs.ranks < 2:
        return []
    return pending([Request(Stage.scaling, Mode.train, Knobs(**{**knee.knobs.to_dict(), "ranks": 1}))], s.raw)


def _repeats(s: _Finished) -> list[Request]:
    """The configs a decision rests on, each measured ``selection.repeats`` more times, in alternation (the
    script's own settings, the knee, the best; then again): their spread between runs is the run-to-run noise,
    measured on this machine, which widens the band and every gain's interval (``analysis.pooled``). The choice is
    made anew after each run, so a knee that moves is repeated too. The script's own settings are asked for as
    their first trial was (``_script_baseline``: its knobs are what the script chose)."""
    if not s.selection.repeats:
        return []
    choice = select(s.cfg, s.raw)
    own = next((r for r in s.rows if r.stage == Stage.baseline and r.ok and r.mode == Mode.train), None)
    configs: list[TrialRow] = []
    for row in (own, choice.knee, choice.best):
        if row is not None and row.ok and row.mode == Mode.train and all(row.key != c.key for c in configs):
            configs.append(row)
    for run in range(1, s.selection.repeats + 1):
        ran = [r for r in s.raw if r.run == run]
        asked = [Request(c.stage, c.mode, _asked_knobs(s, c), run=run) for c in configs
                 if not any(r.stage == c.stage and (r.knobs == c.knobs or c.stage == Stage.baseline) for r in ran)]
        if asked:
            return asked
    return []


def _asked_knobs(s: _Finished, row: TrialRow) -> Knobs:
    """The knobs to ask a repeat of ``row`` with: its own, or for the script's own settings those its first trial
    was asked with."""
    return _script_request_knobs(s) if row.stage == Stage.baseline else row.knobs


def repeat_requests(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    """The repeats a grid's decision rests on, once every combination ran."""
    return _repeats(_Finished(cfg, rows, cuda))


def script_baseline(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    """Script mode's baseline trial while it is owed (a grid's too)."""
    return _script_baseline(_Finished(cfg, rows, cuda))


def scaling_requests(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    """The scaling trial of a sweep under ``launch`` once its knee stages are done (a grid's too)."""
    return _scaling(_Finished(cfg, rows, cuda)) or []


def _script_baseline(s: _Finished) -> list[Request]:
    """Script mode only: the user's script with its own settings (each placeholder left out with its flag, unless
    script.baseline gives it; nothing set on its DataLoader): what the report's gain is over. A staged sweep runs it
    after the start of the end-to-end walk (first of all with script.own_batch, whose batch it gives; a grid, first
    of all). It is one trial whatever its knobs turn out to be (it records what its loader really got), so it is
    done once any baseline trial is finished."""
    if s.cfg.script is None or s.done(Stage.baseline):
        return []
    return [Request(Stage.baseline, Mode.train, _script_request_knobs(s))]


def _script_request_knobs(s: _Finished) -> Knobs:
    return Knobs(batch_size=max(s.search.batch_size), ranks=s.world, **s.base)


STAGES: tuple[tuple[Stage | None, StagePlan], ...] = (
    (Stage.compute, _compute), (Stage.loader, _loader),
    (Stage.end_to_end, _end_to_end), (Stage.prefetch, _prefetch),
    (Stage.batch, _smaller_batches), (Stage.compile, _compile), (Stage.extra, _extra),
    (Stage.accumulation, _accumulation), (None, _repeats), (Stage.scaling, _scaling),
)
"""Each stage of the staged plan with its planner, in the order they run (the enum's; a script's own baseline is
planned by ``_end_to_end``, after the walk's start, or first of all by ``plan.next_requests`` with own_batch). The
repeats (None: they keep the stage of the config they repeat, ``Request.run``) come before the scaling trial, which
takes the final knee."""


def staged_requests(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    """The first stage's pending requests; [] when every stage is complete or one cannot go on."""
    finished = _Finished(cfg, rows, cuda)
    for _, stage in STAGES:
        requests = stage(finished)
        if requests is None:
            return []
        if requests:
            return requests
    return []


def estimate_staged(cfg: Config, rows: list[TrialRow], cuda: bool) -> int:
    """Trials a staged sweep will likely run in all: every stage at its usual size."""
    s = cfg.search
    computed = [r for r in rows if r.stage == Stage.compute]
    over = computed and _compute(_Finished(cfg, rows, cuda)) == []
    n_compute = len(computed) if over else len(s.batch_size)  # at most every batch, down from the largest
    counts = len([w for w in s.num_workers if w])
    n_loader = 1 + max(0, counts - 1).bit_length()  # the most workers, then a bisection at worst
    n_e2e = 1 + min(3, len(s.num_workers)) * len(pins(cfg, cuda))  # the defaults; the start, one up, one down
    n_e2e += 1 if cfg.script is not None else 0  # the script's own settings
    total = n_compute + n_loader + n_e2e + (len(s.prefetch_factor) - 1) + (len(s.compile) - 1)
    knobs = extra_knobs(cfg)
    total += (sum(len(k.values) - 1 for k in knobs) + len(s.threads or [])
              + len(s.worker_threads or []))  # one each, at the knee
    if s.threads or s.worker_threads or any(not k.changes_result for k in knobs):
        total += counts.bit_length()  # the bisection of the smaller worker counts after a faster value
    total += 1 if cfg.launch.world > 1 else 0  # the knee on one GPU: the scaling efficiency
    if s.target_effective_batch:
        total += sum(1 for b in s.batch_size if s.target_effective_batch % b == 0)
    else:
        total += min(1, len(s.batch_size) - 1)  # stage 4b usually tries one smaller batch, when data-bound
    return total
