"""Stages 1 and 2: the compute ceiling per batch size, the loader ceiling per worker count (docs/plan.md)."""

from __future__ import annotations

from tunekit import rules
from tunekit.contract import Knobs, Mode, Stage
from tunekit.plan._finished import _compute_at, _Finished, reach_rate
from tunekit.plan._request import Request, pending, pins
from tunekit.records import TrialRow


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
    return Request(Stage.compute, Mode.compute, Knobs.of(num_workers=0, batch_size=batch, **s.base))


def _loader(s: _Finished) -> list[Request] | None:
    """The loader alone (pinned when pinning is searched on a GPU), only where its ceiling decides something: the
    most workers first; when that ceiling reaches the compute ceiling, a bisection of the counts for the fewest that
    does (the start of the end-to-end walk; loader ceilings rise with workers). The other counts are skipped with
    that evidence: the end-to-end walk measures the counts around its start directly."""
    batch = s.batch
    if batch is None:
        return None
    pin = pins(s.cfg, s.cuda)[-1]
    reqs = {
        w: Request(Stage.loader, Mode.loader, Knobs.of(num_workers=w, batch_size=batch, pin_memory=pin, **s.base))
        for w in s.search.num_workers
    }
    compute = _compute_at(s, batch)
    counts = sorted(w for w in reqs if w)
    if compute is None or not counts:
        return pending(list(reqs.values()), s.raw)  # nothing to compare with: every count
    while counts and (failed := s.find(reqs[counts[-1]])) is not None and not failed.ok:
        counts.pop()  # the loader failed at the most workers (out of memory, say): the next most stands in
    if not counts:
        return [
            req.skipped("the loader alone failed at every worker count tried")
            for req in pending(list(reqs.values()), s.raw)
        ]
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
        reason = (
            f"the fewest workers whose loader ceiling reaches the compute ceiling ({compute.rate:.1f} "
            f"{compute.unit}/s at batch {batch}, trial {compute.number}) are {counts[hi]} (trial {start.number}, "
            f"{start.rate:.1f}), found by bisection: the end-to-end walk starts there and measures the "
            "counts around it directly"
        )
    else:
        reason = (
            f"the loader alone at the most workers, {counts[hi]}, gives {top.rate:.1f} {top.unit}/s (trial "
            f"{top.number}), below the compute ceiling ({compute.rate:.1f} at batch {batch}, trial "
            f"{compute.number}): the end-to-end walk starts at {counts[hi]} workers and measures fewer directly"
        )
    return [req.skipped(reason) for req in pending(list(reqs.values()), s.raw)]


def _reaches(s: _Finished, loader: TrialRow, compute: TrialRow) -> bool:
    """Whether a one-rank loader ceiling reaches the one-GPU compute ceiling within the tolerance."""
    return loader.ok and loader.rate >= reach_rate(compute, s.selection)
