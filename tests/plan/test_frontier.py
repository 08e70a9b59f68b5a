"""The plan's frontier (``plan.frontier``, tunekit/plan/_frontier.py): what a free node of a shared sweep may start
while others measure, on saved measurements of a model whose rates are known (no trial runs)."""

from __future__ import annotations

import heapq
from typing import Any

import pytest

from tests.conftest import measurement, sleepy_config
from tunekit import config, plan
from tunekit.contract import Measurement, Mode
from tunekit.records import TrialRow

STEP_S, SAMPLE_S = 0.0533, 0.005
"""test_check's known-answer job: the model gives 150 samples/s at batch 8, each worker 200."""


def _rate(req: plan.Request) -> float:
    k = req.knobs
    compute = k.batch_size / STEP_S
    loader = 1 / SAMPLE_S * k.num_workers if k.num_workers else 1 / SAMPLE_S
    if req.mode == Mode.compute:
        return compute
    if req.mode == Mode.loader:
        return loader
    return min(compute, loader) if k.num_workers else 1 / (STEP_S / k.batch_size + SAMPLE_S)


def _row(req: plan.Request, number: int) -> TrialRow:
    rate = None if req.skip else _rate(req)
    m = measurement(
        number, req.stage, req.mode, rate, status="skipped" if req.skip else "ok", run=req.run, **req.knobs.to_dict()
    )
    return TrialRow.from_measurement(Measurement.from_dict(m))


def _cfg(**overrides: Any) -> config.Config:
    return config.from_dict(
        sleepy_config(
            **{
                "workload.model_args.step_wait_s": STEP_S,
                "search.num_workers": [0, 1, 2, 3, 4],
                "selection.tolerance": 0.05,
                **overrides,
            }
        )
    )


def _nodes(cfg: config.Config, nodes: int, strategy: str = "staged") -> tuple[float, list[TrialRow], int]:
    """A sweep run by ``nodes`` simulated nodes, each trial taking one unit of time (a skip none): the time it
    took, its rows, and the most trials that ran at once."""
    rows: list[TrialRow] = []
    running: list[tuple[float, int, plan.Request]] = []
    clock, number, widest = 0.0, 0, 0
    while True:
        while len(running) < nodes:
            req = plan.frontier(cfg, rows, [r for _, _, r in running], strategy=strategy, cuda=False)
            if req is None:
                break
            heapq.heappush(running, (clock + (0.0 if req.skip else 1.0), number, req))
            number += 1
        widest = max(widest, sum(1 for _, _, r in running if r.skip is None))
        if not running:
            return clock, rows, widest
        clock, done, req = heapq.heappop(running)
        rows.append(_row(req, done))


def test_with_nothing_in_flight_it_is_the_plans_next_request():
    cfg = _cfg()
    assert (
        plan.frontier(cfg, [], [], strategy="staged", cuda=False)
        == plan.next_requests(cfg, [], strategy="staged", cuda=False)[0]
    )


@pytest.mark.parametrize(
    ("strategy", "overrides"),
    [
        ("staged", {}),
        ("staged", {"search.batch_size": [8, 16, 32], "selection.repeats": 1}),
        ("staged", {"search.batch_size": [8, 16], "search.target_effective_batch": 32}),
        ("grid", {"search.batch_size": [8, 16]}),
    ],
)
def test_three_nodes_run_the_trials_of_one_in_less_time(strategy: str, overrides: dict[str, Any]):
    cfg = _cfg(**overrides)
    one, alone, _ = _nodes(cfg, 1, strategy)
    three, shared, widest = _nodes(cfg, 3, strategy)
    assert sorted(map(str, (r.key for r in shared))) == sorted(map(str, (r.key for r in alone)))
    assert widest > 1 and three < one


def test_a_stage_that_decides_on_a_result_waits_for_it():
    """The compute stage hands out its two largest batches at once (the second is measured whatever the first
    gives); the third waits: whether it runs depends on whether the second fell out of the band."""
    cfg = _cfg(**{"search.batch_size": [8, 16, 32]})
    first = plan.frontier(cfg, [], [], strategy="staged", cuda=False)
    second = plan.frontier(cfg, [], [first], strategy="staged", cuda=False)
    assert (first.knobs.batch_size, second.knobs.batch_size) == (32, 16)
    assert plan.frontier(cfg, [], [first, second], strategy="staged", cuda=False) is None
    rows = [_row(first, 0)]
    assert plan.frontier(cfg, rows, [second], strategy="staged", cuda=False) is None  # the loader needs the batch


def test_the_end_to_end_walk_hands_out_its_start_the_defaults_and_the_count_above():
    cfg = _cfg()
    rows: list[TrialRow] = []
    while (req := plan.next_requests(cfg, rows, strategy="staged", cuda=False)[0]).stage != "end_to_end":
        rows.append(_row(req, len(rows)))
    flight: list[plan.Request] = []
    while (req := plan.frontier(cfg, rows, flight, strategy="staged", cuda=False)) is not None:
        flight.append(req)
    assert [r.knobs.num_workers for r in flight] == [1, 0, 2]  # the start, PyTorch's defaults, one count up


def test_many_in_flight_try_each_outcome_alone_not_every_combination(monkeypatch: pytest.MonkeyPatch):
    cfg = _cfg(**{"search.batch_size": [8, 16]})
    cells = [r for r in plan.next_requests(cfg, [], strategy="grid", cuda=False)]
    asked = []
    real = plan.next_requests
    monkeypatch.setattr(plan, "next_requests", lambda *a, **k: asked.append(1) or real(*a, **k))
    assert plan.frontier(cfg, [], cells[:6], strategy="grid", cuda=False) == cells[6]
    assert len(asked) == 3 + 6 * 6  # all failed, all slow, all fast; then each trial's outcomes against the others'
