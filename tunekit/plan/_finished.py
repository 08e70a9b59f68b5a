"""The finished trials as every stage of the staged plan reads them (``_Finished``), and the bounds the stages share:
the band target, the rate a loader ceiling must reach, the batches that fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tunekit import rules
from tunekit.analysis import choose_batch, pooled, working_knee
from tunekit.config import Config, Selection
from tunekit.contract import Stage
from tunekit.plan._request import Request, base_knobs
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
            self._knees[before] = working_knee(
                [r for r in self.done(*rules.knee_stages(before)) if not rules.changes_result(r)], self.selection
            )
        return self._knees[before]


StagePlan = Callable[[_Finished], "list[Request] | None"]
"""A stage's planner: its pending requests, [] when it is complete, None when the sweep cannot go on."""

Skips = Mapping[tuple[Any, ...], tuple[str, "tuple[float, int] | None"]]
"""End-to-end requests (by ``Request.key``) that the walk's own evidence says need not run, with the reason and the
upper bound it shows (``Request.bound``; None above a plateau, which bounds nothing)."""


def _fitting_batches(s: _Finished) -> list[int]:
    """The searched batch sizes that fit, largest first: each measured one that fits the headroom limit, and each
    the compute stage left unmeasured under the smallest of those (a smaller batch needs less memory)."""
    fitting = {r.knobs.batch_size for r in s.done(Stage.compute) if r.ok and rules.fits(r, s.selection)}
    measured = {r.knobs.batch_size for r in s.done(Stage.compute)}
    if not fitting:
        return []
    smallest = min(fitting)
    return sorted(
        (b for b in s.search.batch_size if b in fitting or (b < smallest and b not in measured)), reverse=True
    )


def _compute_at(s: _Finished, batch: int) -> TrialRow | None:
    return compute_ceiling(s.done(Stage.compute), batch)


def band_target(rows: list[TrialRow], selection: Selection) -> float | None:
    """The rate a config must reach to come within the band of the best knee candidate so far (completed
    knee-stage trials that fit and keep the training result, as analysis.select takes them, each config's repeats
    pooled); None without one."""
    rows = pooled(rows)
    fitting = [r for r in rows if r.ok and r.stage.knee and rules.fits(r, selection) and not rules.changes_result(r)]
    if not fitting:
        return None
    spread = rules.run_spread(r for r in rows if r.stage != Stage.baseline)  # the candidates' repeats alone
    return rules.needed(max(fitting, key=lambda r: r.rate), rules.band(fitting, selection, spread))


def reach_rate(compute: TrialRow, selection: Selection) -> float:
    """The rate at which a one-rank loader ceiling reaches the one-GPU compute ceiling: within the tolerance."""
    return compute.rate * (1.0 - selection.tolerance)
