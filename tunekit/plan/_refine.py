"""Stages 4 to 6: refinements around the knee (prefetch, smaller batches, compile modes, user-defined knobs,
accumulation to a target effective batch) (docs/plan.md)."""

from __future__ import annotations

from tunekit import rules
from tunekit.config import extra_knobs
from tunekit.contract import Knobs, Mode, Stage
from tunekit.plan._ceilings import _ceiling_request
from tunekit.plan._finished import _compute_at, _Finished, _fitting_batches, band_target
from tunekit.plan._request import Request, pending
from tunekit.records import TrialRow


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
    left = pending(
        [
            Request(Stage.prefetch, Mode.train, Knobs.of(**{**k.to_dict(), "prefetch_factor": pf}))
            for pf in s.search.prefetch_factor
            if pf != k.prefetch_factor
        ],
        s.raw,
    )
    m = knee.measurement
    wait = m.data_wait_frac if m.data_wait_frac_max is None else m.data_wait_frac_max  # the rank that waits most
    deeper = all((r.knobs.prefetch_factor or 0) > (k.prefetch_factor or 0) for r in left)
    if left and deeper and wait is not None and wait < rules.NO_WAIT:
        return [
            left[0].skipped(
                f"the knee (trial {knee.number}) waits on data {wait:.1%} of the time, under "
                f"{rules.NO_WAIT:.0%}: more batches in flight cannot make it faster"
            )
        ]
    if left and deeper and rules.keeps_cpus_busy(knee):
        return [
            left[0].skipped(
                f"the knee (trial {knee.number}) keeps {m.cpu_util_frac or 0.0:.0%} of its usable CPUs busy, over "
                f"{rules.CPU_SATURATED:.0%}: more batches in flight are made with the same CPU time, so they cannot "
                "arrive faster"
            )
        ]
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
        req = Request(Stage.batch, Mode.train, Knobs.of(**{**knee.knobs.to_dict(), "batch_size": batch}))
        # judged against this batch and the larger ones only: a smaller batch that later ran faster must not
        # make this one look as if it fell behind
        trials = [
            r
            for r in s.done(*rules.knee_stages(Stage.compile))
            if r.ok and rules.fits(r, s.selection) and (r.stage != Stage.batch or r.knobs.batch_size >= batch)
        ]
        best = max(trials, key=lambda r: r.rate)
        allowed = rules.band(trials, s.selection)
        target = rules.needed(best, allowed)
        row, ceiling = s.find(req), ceilings.get(batch)
        if row is None:
            # a batch below where the compute stage stopped has no ceiling yet: tried end to end first (an
            # input-bound knee runs far below any ceiling), its ceiling measured only once it keeps within the band
            if ceiling is None or rules.can_reach(ceiling, target, s.selection, knee.knobs.ranks):
                return [req]
            return [
                req.skipped(
                    f"the compute ceiling at batch {batch} is {ceiling.rate:.1f} {ceiling.unit}/s (trial "
                    f"{ceiling.number}), "
                    f"below the {target:.1f} needed to come within the band ({allowed:.1%}) of the best config so far "
                    f"({best.rate:.1f}, trial {best.number})"
                )
            ]
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
    left = pending(
        [
            Request(Stage.compile, Mode.train, Knobs.of(**{**k.to_dict(), "compile": c}))
            for c in s.search.compile
            if c != k.compile
        ],
        s.raw,
    )
    ceiling = _compute_at(s, k.batch_size)
    share, wait = rules.of_ceiling(knee, ceiling), knee.measurement.data_wait_frac or 0.0
    if left and rules.waits_on_data(wait, share) and share is not None:
        return [
            left[0].skipped(
                f"the knee (trial {knee.number}) waits on data {wait:.0%} of the time at {share:.0%} of its compute "
                f"ceiling (trial {ceiling.number}): the input pipeline is the bound, so a faster model changes nothing"
            )
        ]
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
    tries = [
        Request(Stage.extra, Mode.train, knee.knobs.with_extra(k.key, v, k.baseline))
        for k in knobs
        for v in k.values
        if v != dict(knee.knobs.extra).get(k.key, k.baseline)
    ]
    tries += [
        Request(Stage.extra, Mode.train, Knobs.of(**{**knee.knobs.to_dict(), "threads": t}))
        for t in s.search.threads or []
        if t != knee.knobs.threads
    ]
    tries += [
        Request(Stage.extra, Mode.train, Knobs.of(**{**knee.knobs.to_dict(), "worker_threads": t}))
        for t in s.search.worker_threads or []
        if t != knee.knobs.worker_threads and knee.knobs.num_workers
    ]
    left = pending(tries, s.raw)
    ceiling = _compute_at(s, knee.knobs.batch_size)
    if left and not rules.input_bound(knee, ceiling):
        share = rules.of_ceiling(knee, ceiling)
        where = f"{share:.0%} of its compute ceiling" if share is not None else "without a compute ceiling"
        return [
            left[0].skipped(
                f"the knee (trial {knee.number}) runs at {where}: the input pipeline is not the "
                "bound, so a knob of the pipeline cannot make it faster"
            )
        ]
    if left:
        return left[:1]
    return _fewer_workers(s, knee, [s.find(r) for r in tries]) or _batch_after_knobs(s)


def _fewer_workers(s: _Finished, knee: TrialRow, tried: list[TrialRow | None]) -> list[Request]:
    """The fastest user-knob trial that keeps the training result and beats the knee, with fewer workers: the
    fewest that stay within the band of the best, found by bisection of the smaller counts (throughput does not
    rise as workers are taken away, as the end-to-end walk down assumes), so five smaller counts cost three
    trials, not five."""
    faster = [
        r
        for r in tried
        if r is not None and r.ok and not rules.changes_result(r) and r.rate > knee.rate and rules.fits(r, s.selection)
    ]
    if not faster:
        return []
    top = max(faster, key=lambda r: r.rate)
    target = band_target(s.rows, s.selection) or 0.0  # the trials in ``faster`` are candidates: never None
    # worker threads exist only with workers: without any, the config would lose the knob that made it faster
    counts = sorted(
        c for c in s.search.num_workers if c < top.knobs.num_workers and (c or top.knobs.worker_threads is None)
    )
    lo, hi = 0, len(counts)  # counts[hi] (top's own count when hi == len) is within the band; below lo none is
    while lo < hi:
        mid = (lo + hi) // 2
        req = Request(Stage.extra, Mode.train, Knobs.of(**{**top.knobs.to_dict(), "num_workers": counts[mid]}))
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
    return pending([Request(Stage.extra, Mode.train, Knobs.of(**{**knee.knobs.to_dict(), "batch_size": batch}))], s.raw)


def _accumulation(s: _Finished) -> list[Request] | None:
    """Micro-batch x steps pairs that reach target_effective_batch, at the knee's loader settings."""
    target = s.search.target_effective_batch
    knee = s.knee(Stage.accumulation)
    if not target or knee is None:
        return []
    fit = set(_fitting_batches(s))
    return pending(
        [
            Request(
                Stage.accumulation,
                Mode.train,
                Knobs.of(**{**knee.knobs.to_dict(), "batch_size": b, "grad_accum": target // b}),
            )
            for b in s.search.batch_size
            if target % b == 0 and b in fit
        ],
        s.raw,
    )
