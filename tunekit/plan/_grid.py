from __future__ import annotations

import itertools

from tunekit.config import Config, extra_knobs
from tunekit.contract import Knobs, Mode, Stage
from tunekit.plan._request import Request, pins


def grid_requests(cfg: Config, cuda: bool) -> list[Request]:
    """Every valid combination of the searched knobs, user-defined ones included (prefetch only with workers; with
    target_effective_batch, only micro-batch x steps pairs that reach it)."""
    s = cfg.search
    if s.target_effective_batch:
        shapes = [(b, s.target_effective_batch // b) for b in s.batch_size if s.target_effective_batch % b == 0]
    else:
        shapes = list(itertools.product(s.batch_size, s.grad_accum))
    user = extra_knobs(cfg)
    settings = [
        tuple((k.key, v) for k, v in zip(user, values, strict=True) if v != k.baseline)
        for values in itertools.product(*(k.values for k in user))
    ]
    out: list[Request] = []
    for w, pin, (batch, accum), comp, threads, extra in itertools.product(
        s.num_workers, pins(cfg, cuda), shapes, s.compile, [None, *(s.threads or [])], settings
    ):
        for pf, wt in itertools.product(
            s.prefetch_factor if w > 0 else [None], [None, *(s.worker_threads or [])] if w > 0 else [None]
        ):
            knobs = Knobs(
                num_workers=w,
                prefetch_factor=pf,
                pin_memory=pin,
                batch_size=batch,
                grad_accum=accum,
                compile=comp,
                ranks=cfg.launch.world,
                threads=threads,
                worker_threads=wt,
                extra=extra,
            )
            out.append(Request(Stage.grid, Mode.train, knobs))
    return out
