"""One node of a sweep that several identical machines run together through one shared study (``--storage URL``:
the sweep's first machine runs ``tunekit sweep``, each further one ``tunekit sweep --join``).

Every node runs one trial at a time (a trial needs the whole machine) and loops: fail the trials of nodes that
stopped beating (optuna queues them again), run a trial that waits in the queue, else ask the plan for the request
that may start now whatever the trials in flight measure (``plan.frontier``) and claim it through optuna's queue
(``store.SharedRun.claim``); where the next decision needs a result another node is still measuring, read the study
again every ``fleet.poll_s``. A node stops when the plan is done and nothing is in flight, or when the budget ends
the sweep (``budget.max_trials`` counts every node's trials; ``budget.minutes`` each node's own time). There is no
coordinator: the study is the whole state, and optuna's queue and heartbeat are the whole protocol. Nothing here
imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from tunekit import plan, rules
from tunekit.contract import Measurement
from tunekit.env import describe_machine
from tunekit.errors import UsageError
from tunekit.records import TrialRow
from tunekit.report import Progress, warn
from tunekit.store import Claim, RunStore, SharedRun

__all__ = ["node_trials", "check_machine", "Measure"]

Measure = Callable[[plan.Request, int], Measurement]
"""Runs one request as trial number ``n`` of the run (the driver's launch) and returns its measurement."""


class _Sweep(Protocol):
    cfg: Any
    strategy: str
    cuda: bool
    runs: Any
    rows: list[TrialRow]
    console: Any
    stop_reason: str

    def prepare(self) -> None: ...


class _Budget(Protocol):
    durations: list[float]

    def stop_reason(self, trials_run: int, reserve: int = 0) -> str | None: ...

    def room_for_last(self, trials_run: int) -> bool: ...


def check_machine(runs: RunStore, machine: dict[str, Any]) -> None:
    """A shared run is one machine type's: a node whose hardware differs from the one the sweep records
    (``rules.machine_changes``: GPU model and count, CPU model and usable count, memory) is refused in one line.

    Raises:
        UsageError: another machine type.
    """
    recorded = runs.machine
    changed = rules.machine_changes(recorded, machine)[0] if runs.shared and recorded else []
    if changed:
        what = ", ".join(f"{key} {old} there, {new} here" for key, old, new in changed)
        raise UsageError(
            f"{runs.where}: this machine ({describe_machine(machine)}) is not the type the sweep runs on "
            f"({describe_machine(recorded)}: {what}); a node joins only a sweep of its own type: sweep this one as "
            "another run (--set name=...)"
        )


def node_trials(sweep: _Sweep, budget: _Budget, measure: Measure) -> None:
    """Take trials of the shared plan, one at a time, until the plan is done with nothing in flight or the budget
    ends the sweep; ``sweep.rows`` then holds every node's finished trials."""
    runs: SharedRun = sweep.runs
    estimate = plan.estimate_total(sweep.cfg, sweep.rows, strategy=sweep.strategy, cuda=sweep.cuda)
    with Progress(sweep.console, estimate, len(sweep.rows)) as bar:
        while True:
            taken = _next_claim(sweep, budget)
            if taken is None:
                break
            claim, last = taken
            req = plan.Request(claim.stage, claim.mode, claim.knobs, claim.skip, claim.bound, claim.run)
            bar.starting(req)
            row = _run(sweep, claim, req, measure)
            if row is not None:
                sweep.rows = [*sweep.rows, row]
                if req.skip is None:
                    budget.durations.append(float(row.measurement.launcher_wall_s or 0.0))
                bar.finished(row, plan.estimate_total(sweep.cfg, sweep.rows, strategy=sweep.strategy, cuda=sweep.cuda))
            if last:
                break
    sweep.rows = runs.rows()


def _next_claim(sweep: _Sweep, budget: _Budget) -> tuple[Claim, bool] | None:
    """The next trial this node runs, and whether it is the sweep's last (the baseline the budget kept room for);
    waits while the next decision needs a result still being measured; None when this node is done."""
    runs: SharedRun = sweep.runs
    cfg, waited = sweep.cfg, False
    while True:
        runs.fail_stale()
        if runs.waiting():  # a dead node's trial queued again, or one a node enqueued and did not ask for
            sweep.prepare()
            claim = runs.pop_waiting(cfg)
            if claim is not None:
                return claim, False
            continue
        sweep.rows = runs.rows()
        flight = [plan.Request(stage, mode, knobs, run=run) for stage, mode, knobs, run in runs.in_flight()]
        if not flight and not plan.next_requests(cfg, sweep.rows, strategy=sweep.strategy, cuda=sweep.cuda):
            return None
        req = plan.frontier(cfg, sweep.rows, flight, strategy=sweep.strategy, cuda=sweep.cuda)
        last = False
        if req is not None and req.skip is None:
            req, last = _within_budget(sweep, budget, req, flight)
            if req is None:
                return None
        if req is None:
            if not waited:
                sweep.console.print(f"waiting: the next decision needs the {len(flight)} trial(s) in flight")
            waited = True
            time.sleep(cfg.fleet.poll_s)
            continue
        if req.skip is None:
            sweep.prepare()
        claim = runs.claim(cfg, req.stage, req.mode, req.knobs, req.run, req.skip, req.bound)
        if claim is not None:
            return claim, last


def _within_budget(
    sweep: _Sweep, budget: _Budget, req: plan.Request, flight: list[plan.Request]
) -> tuple[plan.Request | None, bool]:
    """The request to run under the budget (every node's launched trials count), and whether it is the last: the
    plan's, or, once the budget ends the sweep, the report's baseline it kept room for (as a single machine's
    sweep does); None when this node stops (the baseline, when owed, is in flight on another node)."""
    launched = sum(1 for r in sweep.rows if r.status != "skipped") + len(flight)
    owed = plan.baseline(sweep.cfg, sweep.rows, strategy=sweep.strategy, cuda=sweep.cuda)
    reserve = 1 if owed is not None and owed.key != req.key else 0
    sweep.stop_reason = budget.stop_reason(launched, reserve) or ""
    if not sweep.stop_reason:
        return req, False
    if owed is None or not budget.room_for_last(launched) or owed.key in {f.key for f in flight}:
        return None, False
    return owed, True


def _run(sweep: _Sweep, claim: Claim, req: plan.Request, measure: Measure) -> TrialRow | None:
    """Run a claimed trial with its heartbeat and record it; None when it was failed meanwhile as stale (its
    heartbeat lapsed) and is run again elsewhere."""
    runs: SharedRun = sweep.runs
    if claim.retried is not None:
        sweep.console.print(f"trial {claim.number}: its node stopped beating; running it again here")
    with runs.beating(claim):
        try:
            measurement = measure(req, claim.number)
        except BaseException:
            runs.interrupt(claim.trial, claim.mode)
            raise
    if not runs.finish(claim.trial, claim.mode, measurement):
        warn(sweep.console, f"trial {claim.number}: this node's heartbeat lapsed, so another node runs it again")
        return None
    return TrialRow.from_measurement(replace(measurement, number=claim.number))
