"""Which trials a sweep runs, stage by stage.

``staged`` follows the troubleshooting order from the outside in: (1) compute ceiling per batch size, (2) loader
ceiling per worker count, (3) end to end, workers x pin_memory at the chosen batch, (4) prefetch_factor at the knee,
(4b) smaller batches at the knee when the input pipeline is the bound, (5) compile modes at the knee,
(6) accumulation to reach target_effective_batch, (7) with launch ranks, the knee's per-rank config on one GPU (the
scaling efficiency). Each stage depends on what the earlier ones measured, so the plan is recomputed from the finished
trials every time the driver asks; a request that already has a finished trial is never returned again. ``grid``
runs every valid combination. Both end with the repeats: the configs a decision rests on (the knee, the best, a
script's own settings) measured again, in alternation, ``selection.repeats`` times each. docs/plan.md gives the
reasons for each stage.
"""

from __future__ import annotations

import dataclasses

from tunekit.config import Config
from tunekit.contract import Mode, Stage
from tunekit.plan._finished import band_target, reach_rate
from tunekit.plan._frontier import imagined
from tunekit.plan._request import Request
from tunekit.plan._retune import knee_values, retune_search
from tunekit.plan._staged import script_baseline
from tunekit.plan._strategies import STRATEGIES, PlanStrategy, strategy_for
from tunekit.records import TrialRow, compute_ceiling

__all__ = [
    "Request",
    "PlanStrategy",
    "STRATEGIES",
    "strategy_for",
    "next_requests",
    "frontier",
    "estimate_total",
    "needed_rate",
    "baseline",
    "retune_search",
    "knee_values",
]


def _own_batch(cfg: Config, rows: list[TrialRow]) -> Config:
    """A script that keeps its own batch (``script.own_batch``): the batch its baseline trial's loader had, once it
    ran, in place of ``search.batch_size`` (until then only the baseline is asked for)."""
    if not cfg.own_batch:
        return cfg
    base = next((r for r in rows if r.stage == Stage.baseline and r.ok), None)
    batch = (base.measurement.loader_measured or {}).get("batch_size") if base is not None else None
    if not batch:
        return cfg
    return dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, batch_size=[int(batch)]))


def next_requests(cfg: Config, rows: list[TrialRow], *, strategy: str, cuda: bool) -> list[Request]:
    """The trials to run next (of one stage; the first may depend on the last result, so run it and ask again),
    given every finished trial; empty when the sweep is done."""
    cfg = _own_batch(cfg, rows)
    if cfg.own_batch and script_baseline(cfg, rows, cuda):
        return script_baseline(cfg, rows, cuda)  # its loader's batch is the sweep's
    own = next((r for r in rows if r.stage == Stage.baseline), None)
    if cfg.own_batch and own is not None and not own.ok:
        return []  # without the script's own batch there is no batch to sweep
    return strategy_for(strategy).requests(cfg, rows, cuda)


def frontier(cfg: Config, rows: list[TrialRow], running: list[Request], *, strategy: str, cuda: bool) -> Request | None:
    """The request a free node of a shared sweep may start now, given every finished trial and the requests in
    flight on other nodes: the first of :func:`next_requests` whatever those measure (``_frontier``); None when it
    depends on one of them (wait for its result), or when the plan may end with them. With none in flight, the
    first of :func:`next_requests`."""
    answer: Request | None = None
    for rows_then in imagined(rows, running):
        requests = next_requests(cfg, rows_then, strategy=strategy, cuda=cuda)
        first = requests[0] if requests else None
        if first is None or (answer is not None and first != answer):
            return None
        answer = first
    return answer


def baseline(cfg: Config, rows: list[TrialRow], *, strategy: str, cuda: bool) -> Request | None:
    """The PyTorch-defaults trial a staged sweep still owes its report (its batch chosen, the trial not run), or
    None: the driver runs it when the budget ends the sweep before the plan reached it."""
    cfg = _own_batch(cfg, rows)
    return strategy_for(strategy).baseline(cfg, rows, cuda)


def estimate_total(cfg: Config, rows: list[TrialRow], *, strategy: str, cuda: bool) -> int:
    """Trials the sweep will likely run in all (finished ones included), for the progress bar."""
    cfg = _own_batch(cfg, rows)
    return max(strategy_for(strategy).estimate(cfg, rows, cuda) + _repeated(cfg), len(rows))


def _repeated(cfg: Config) -> int:
    """The repeats a sweep usually runs: the knee and the best (and the script's own settings), each
    ``selection.repeats`` times."""
    return cfg.selection.repeats * (3 if cfg.own_settings else 2)


def needed_rate(cfg: Config, rows: list[TrialRow], req: Request) -> float | None:
    """The throughput ``req`` must reach to matter, or None: for a knee-stage trial, the band of the best fitting
    knee-stage trial so far; for a loader ceiling, the rate at which it reaches the compute ceiling at its batch
    (all the plan asks of it). A trial whose measurement lies clearly below it need not measure on
    (``rules.window_stop``); the baselines too (the PyTorch defaults, a script's own settings), which run after the
    start of the end-to-end walk for that reason. None for the compute ceilings, the scaling trial, or while there is
    nothing to compare with."""
    if req.stage == Stage.loader and req.mode == Mode.loader:
        compute = compute_ceiling(rows, req.knobs.batch_size)
        return reach_rate(compute, cfg.selection) if compute is not None else None
    if not req.stage.raced or req.run:  # the ceilings, the scaling trial and the repeats measure in full
        return None
    return band_target(rows, cfg.selection)
