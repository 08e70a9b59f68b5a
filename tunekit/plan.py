"""Which trials a sweep runs, stage by stage.

``staged`` follows the seeds' order from the outside in: (1) compute ceiling per batch size, (2) loader ceiling
per worker count, (3) end to end workers x pin_memory at the chosen batch, (4) prefetch_factor at the knee,
(4b) smaller batches at the knee when the input pipeline is the bound, (5) compile modes at the knee,
(6) accumulation to reach target_effective_batch.

Stage 4b departs from DESIGN.md, which fixes the batch from the compute ceiling alone. On an H200 with CPU-decoded
JPEGs (configs/resnet.yaml) the compute ceiling chose batch 512, 4 % faster than 256 on a staged batch, while end
to end 16 workers at batch 256 ran 10 % faster than at 512: when the loader is the bound, smaller batches flow
better. So when the knee is below 90 % of the compute ceiling at its batch, the knee's config is tried at the next
smaller batch that fits, and the next, while each keeps within noise of the best; a batch whose compute ceiling
cannot reach the best is skipped with that evidence. Each stage depends on what the
earlier ones measured, so the plan is recomputed from the finished trials every time the driver asks; a request
that already has a finished trial is never returned again. ``grid`` runs every valid combination.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from tunekit.analysis import TrialRow, choose_batch, run_noise, select_knee
from tunekit.config import Config
from tunekit.contract import Knobs
from tunekit.diagnosis import NEAR_CEILING

__all__ = ["Request", "STAGES", "next_requests", "estimate_total"]

STAGES: tuple[str, ...] = ("compute", "loader", "end_to_end", "prefetch", "batch", "compile", "accumulation",
                           "grid")


@dataclass(frozen=True)
class Request:
    """One trial the plan wants: its stage, mode and knobs. Equal requests are the same trial."""

    stage: str
    mode: str
    knobs: Knobs
    skip: str | None = None
    """Why this trial need not run (it is recorded as skipped with this reason), or None."""

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.stage, self.mode, *self.knobs.to_dict().values())


def _pins(cfg: Config, cuda: bool) -> list[bool]:
    # Pinned memory only means something with a CUDA device; on the CPU it would be the same trial twice.
    pins = sorted({p for p in cfg.search.pin_memory if cuda or not p})  # [False, True]: pinned is the costlier
    return pins or [False]


def _base(cfg: Config) -> dict[str, Any]:
    s = cfg.search
    return {
        "prefetch_factor": s.prefetch_factor[0],
        "grad_accum": 1 if s.target_effective_batch else s.grad_accum[0],
        "compile": "none" if "none" in s.compile else s.compile[0],
    }


def _grid(cfg: Config, cuda: bool) -> list[Request]:
    s = cfg.search
    out: list[Request] = []
    if s.target_effective_batch:  # only micro-batch x steps pairs that reach the target
        shapes = [(b, s.target_effective_batch // b) for b in s.batch_size if s.target_effective_batch % b == 0]
    else:
        shapes = list(itertools.product(s.batch_size, s.grad_accum))
    for w, pin, (batch, accum), comp in itertools.product(s.num_workers, _pins(cfg, cuda), shapes, s.compile):
        prefetches = s.prefetch_factor if w > 0 else [None]
        for pf in prefetches:
            knobs = Knobs(num_workers=w, prefetch_factor=pf, pin_memory=pin, batch_size=batch, grad_accum=accum,
                          compile=comp)
            out.append(Request("grid", "train", knobs))
    return out


def _done(rows: list[TrialRow], stage: str) -> list[TrialRow]:
    return [r for r in rows if r.stage == stage]


def _pending(requests: list[Request], rows: list[TrialRow]) -> list[Request]:
    finished = {r.key for r in rows}
    return [q for q in requests if q.key not in finished]


def _compute_stage(cfg: Config, rows: list[TrialRow]) -> list[Request]:
    """Batch sizes in ascending order, stopping at the first OOM or the first batch over the headroom limit."""
    base = _base(cfg)
    done = {r.knobs.batch_size: r for r in _done(rows, "compute")}
    for batch in cfg.search.batch_size:
        row = done.get(batch)
        if row is None:
            knobs = Knobs(num_workers=0, batch_size=batch, pin_memory=False, **base)
            return [Request("compute", "compute", knobs)]
        if row.status == "oom" or (row.ok and row.headroom is not None
                                   and row.headroom < cfg.selection.min_headroom):
            return []  # never try a larger batch after one that did not fit
    return []


def _staged(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    s, base = cfg.search, _base(cfg)
    compute = _compute_stage(cfg, rows)
    if compute:
        return compute
    batch = choose_batch(_done(rows, "compute"), cfg.selection)
    if batch is None:
        return []
    pins = _pins(cfg, cuda)
    pin_loader = pins[-1]
    loader = [Request("loader", "loader", Knobs(num_workers=w, batch_size=batch, pin_memory=pin_loader, **base))
              for w in s.num_workers]
    if _pending(loader, rows):
        return _pending(loader, rows)
    # Most workers first: once a fast config is known, worker counts whose loader ceiling cannot come within
    # the tolerance of it cannot be the knee, and are skipped with that evidence instead of run.
    e2e = [Request("end_to_end", "train", Knobs(num_workers=w, batch_size=batch, pin_memory=p, **base))
           for w in sorted(s.num_workers, reverse=True) for p in reversed(pins)]
    defaults = Request("end_to_end", "train", Knobs(num_workers=0, batch_size=batch, pin_memory=False, **base))
    if defaults not in e2e:  # PyTorch's defaults are every report's baseline, searched or not
        e2e.append(defaults)
    pending = _pending(e2e, rows)
    if pending:
        return [_maybe_skip(pending[0], rows, cfg)]
    found = select_knee(_done(rows, "end_to_end"), cfg.selection)
    knee = found.knee or found.best  # with a single config there is no knee yet, but it can still be refined
    if knee is None:
        return []
    k = knee.knobs
    if k.num_workers > 0:
        prefetch = [Request("prefetch", "train", Knobs(**{**k.to_dict(), "prefetch_factor": pf}))
                    for pf in s.prefetch_factor if pf != k.prefetch_factor]
        if _pending(prefetch, rows):
            return _pending(prefetch, rows)
        found = select_knee(_done(rows, "end_to_end") + _done(rows, "prefetch"), cfg.selection)
        knee = found.knee or found.best or knee
        k = knee.knobs
    smaller = _batch_stage(cfg, rows, knee)
    if smaller:
        return smaller
    if _done(rows, "batch"):
        found = select_knee(_done(rows, "end_to_end") + _done(rows, "prefetch") + _done(rows, "batch"),
                            cfg.selection)
        knee = found.knee or found.best or knee
        k = knee.knobs
    compile_ = [Request("compile", "train", Knobs(**{**k.to_dict(), "compile": c}))
                for c in s.compile if c != k.compile]
    if _pending(compile_, rows):
        return _pending(compile_, rows)
    if s.target_effective_batch:
        ref = select_knee([r for r in rows if r.stage in ("end_to_end", "prefetch", "batch", "compile")],
                          cfg.selection)
        k = (ref.knee or ref.best or knee).knobs
        fits = {r.knobs.batch_size for r in _done(rows, "compute")
                if r.ok and (r.headroom is None or r.headroom >= cfg.selection.min_headroom)}
        accum = [Request("accumulation", "train",
                         Knobs(**{**k.to_dict(), "batch_size": b, "grad_accum": s.target_effective_batch // b}))
                 for b in s.batch_size if s.target_effective_batch % b == 0 and b in fits]
        return _pending(accum, rows)
    return []


def _batch_stage(cfg: Config, rows: list[TrialRow], knee: TrialRow) -> list[Request]:
    """Stage 4b (see the module docstring): the knee's config at smaller batches, one at a time, while the input
    pipeline is the bound and each smaller batch stays within noise of the best."""
    if cfg.search.target_effective_batch:
        return []  # the accumulation stage chooses the micro-batch
    min_headroom = cfg.selection.min_headroom
    ceilings = {r.knobs.batch_size: r for r in _done(rows, "compute")
                if r.ok and (r.headroom is None or r.headroom >= min_headroom)}
    at_knee = ceilings.get(knee.knobs.batch_size)
    if at_knee is None or knee.rate >= NEAR_CEILING * at_knee.rate:
        return []  # the model is the bound: a smaller batch only adds per-step overhead
    for batch in sorted((b for b in ceilings if b < knee.knobs.batch_size), reverse=True):
        req = Request("batch", "train", Knobs(**{**knee.knobs.to_dict(), "batch_size": batch}))
        row = next((r for r in rows if r.key == req.key), None)
        # judged against this batch and the larger ones only: a smaller batch that later ran faster must not
        # make this one look as if it fell behind
        trials = [r for r in rows if r.stage in ("end_to_end", "prefetch", "batch") and r.ok
                  and (r.stage != "batch" or r.knobs.batch_size >= batch)
                  and (r.headroom is None or r.headroom >= min_headroom)]
        best = max(trials, key=lambda r: r.rate)
        needed = best.rate * (1 - max(cfg.selection.tolerance, run_noise(trials)))
        if row is None:
            ceiling = ceilings[batch]
            if ceiling.rate * (1 + max(cfg.selection.tolerance, ceiling.noise_cv)) < needed:
                return [Request(req.stage, req.mode, req.knobs, skip=(
                    f"the compute ceiling at batch {batch} is {ceiling.rate:.1f} samples/s (trial "
                    f"{ceiling.number}), below the {needed:.1f} needed to come within tolerance of the best "
                    f"config so far ({best.rate:.1f}, trial {best.number})"))]
            return [req]
        if not row.ok or row.rate < needed:
            return []  # this batch fell behind (or failed): a smaller one will not do better
    return []


def _maybe_skip(req: Request, rows: list[TrialRow], cfg: Config) -> Request:
    """Skip an end-to-end trial whose loader ceiling is already below what the knee must reach."""
    if req.knobs.num_workers == 0 and not req.knobs.pin_memory:
        return req  # PyTorch's defaults: always measured, the baseline of every report
    # The ceiling bounds only trials with its own pin_memory setting: pinning moves work onto the main process (the
    # pin-memory thread), so the loader can be slower pinned than unpinned when the CPUs are saturated.
    ceiling = next((r for r in _done(rows, "loader") if r.ok and r.knobs.num_workers == req.knobs.num_workers
                    and r.knobs.pin_memory == req.knobs.pin_memory), None)
    done = [r for r in _done(rows, "end_to_end") if r.ok]
    if ceiling is None or not done:
        return req
    tol = cfg.selection.tolerance
    fitting = [r for r in done if r.headroom is None or r.headroom >= cfg.selection.min_headroom]
    if not fitting:
        return req  # nothing the knee could be chosen from yet: nothing to measure against
    best = max(fitting, key=lambda r: r.rate)
    bound = ceiling.rate * (1 + max(tol, ceiling.noise_cv))
    # the same band the knee is chosen with (analysis.select_knee): one noisy best trial must not widen it
    needed = best.rate * (1 - max(tol, run_noise(fitting)))
    if bound >= needed:
        return req
    return Request(req.stage, req.mode, req.knobs, skip=(
        f"the loader alone gives {ceiling.samples_per_s:.1f} samples/s at {req.knobs.num_workers} workers "
        f"(trial {ceiling.number}), below the {needed:.1f} needed to come within tolerance of the best "
        f"end-to-end config so far ({best.samples_per_s:.1f}, trial {best.number})"))


def next_requests(cfg: Config, rows: list[TrialRow], *, strategy: str, cuda: bool) -> list[Request]:
    """The trials to run next (of one stage; the first may depend on the last result, so run it and ask again),
    given every finished trial; empty when the sweep is done."""
    if strategy == "grid":
        return _pending(_grid(cfg, cuda), rows)
    return _staged(cfg, rows, cuda)


def estimate_total(cfg: Config, rows: list[TrialRow], *, strategy: str, cuda: bool) -> int:
    """Trials the sweep will likely run in all (finished ones included), for the progress bar."""
    if strategy == "grid":
        return len(_grid(cfg, cuda))
    s = cfg.search
    pins = len(_pins(cfg, cuda))
    computed = _done(rows, "compute")
    stopped = any(r.status == "oom" or (r.ok and r.headroom is not None and r.headroom < cfg.selection.min_headroom)
                  for r in computed)
    n_compute = len(computed) if stopped else len(s.batch_size)
    total = n_compute + len(s.num_workers) * (1 + pins) + (len(s.prefetch_factor) - 1) + (len(s.compile) - 1)
    if s.target_effective_batch:
        total += sum(1 for b in s.batch_size if s.target_effective_batch % b == 0)
    else:
        total += min(1, len(s.batch_size) - 1)  # stage 4b usually tries one smaller batch, when data-bound
    return max(total, len(rows))
