"""The plan's strategies, as optuna's samplers are: one documented base, :class:`PlanStrategy`, and a subclass per
strategy, found by its name (``contract.Strategy``) in :data:`STRATEGIES`. The plan's entry points
(``plan.next_requests``, ``plan.baseline``, ``plan.estimate_total``) choose the strategy once per call and ask it;
what every strategy shares (a script's own batch, the repeats, the scaling trial) stays there and in
``_staged``."""

from __future__ import annotations

import abc
from typing import ClassVar

from tunekit.config import Config
from tunekit.contract import Strategy
from tunekit.plan._grid import grid_requests
from tunekit.plan._request import Request, pending
from tunekit.plan._staged import (
    baseline_request,
    estimate_staged,
    repeat_requests,
    scaling_requests,
    script_baseline,
    staged_requests,
)
from tunekit.records import TrialRow

__all__ = ["PlanStrategy", "StagedPlan", "GridPlan", "STRATEGIES", "strategy_for"]


class PlanStrategy(abc.ABC):
    """How a sweep chooses its trials. A strategy is stateless: every call gets the config and every finished
    trial (``rows``), and answers from them alone, so a resumed or seeded sweep asks it as a fresh one would.

    Subclasses set :attr:`name` and implement :meth:`requests` and :meth:`estimate`; a strategy that owes the
    report a PyTorch-defaults trial it may not have reached overrides :meth:`baseline`."""

    name: ClassVar[Strategy]

    @abc.abstractmethod
    def requests(self, cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
        """The trials to run next (of one stage; the first may depend on the last result, so the driver runs it
        and asks again); empty when the strategy is done."""

    @abc.abstractmethod
    def estimate(self, cfg: Config, rows: list[TrialRow], cuda: bool) -> int:
        """The trials it will likely run in all, finished ones included and the repeats not (the progress bar)."""

    def baseline(self, cfg: Config, rows: list[TrialRow], cuda: bool) -> Request | None:
        """The PyTorch-defaults trial it still owes the report when the budget ends the sweep first; None."""
        return None


class StagedPlan(PlanStrategy):
    """The stages in order, each from what the earlier ones measured (docs/plan.md)."""

    name = Strategy.staged

    def requests(self, cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
        return staged_requests(cfg, rows, cuda)

    def estimate(self, cfg: Config, rows: list[TrialRow], cuda: bool) -> int:
        return estimate_staged(cfg, rows, cuda)

    def baseline(self, cfg: Config, rows: list[TrialRow], cuda: bool) -> Request | None:
        return baseline_request(cfg, rows, cuda)


class GridPlan(PlanStrategy):
    """A script's own settings, every valid combination of the search once, then the repeats and (under launch)
    the knee's per-rank config on one GPU."""

    name = Strategy.grid

    def requests(self, cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
        return (
            script_baseline(cfg, rows, cuda)
            or pending(grid_requests(cfg, cuda), rows)
            or repeat_requests(cfg, rows, cuda)
            or scaling_requests(cfg, rows, cuda)
        )

    def estimate(self, cfg: Config, rows: list[TrialRow], cuda: bool) -> int:
        return len(grid_requests(cfg, cuda)) + (1 if cfg.launch.world > 1 else 0) + (1 if cfg.own_settings else 0)


STRATEGIES: dict[Strategy, type[PlanStrategy]] = {cls.name: cls for cls in (StagedPlan, GridPlan)}
"""Every strategy by its name; ``tests/plan/test_plan.py`` checks that each ``contract.Strategy`` has one."""


def strategy_for(name: str) -> PlanStrategy:
    """The strategy named ``name`` (a ``contract.Strategy`` value; a ValueError names the ones there are)."""
    return STRATEGIES[Strategy(name)]()
