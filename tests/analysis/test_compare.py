"""analysis.compare on fixed data: the knee of each machine type, its items per unit of money with the rate's
interval carried through, the cheapest type per item and whether the intervals settle it; different jobs and one
type twice refused."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import measurement, sleepy_config
from tunekit.analysis import TypeRun, compare, job_difference, select_knee
from tunekit.config import Selection, from_dict
from tunekit.errors import UsageError
from tunekit.records import rows_from_measurements

SELECTION = Selection(tolerance=0.03, min_headroom=0.10)
CPU_BOX = {"device": "CPU: AMD EPYC", "gpu": None, "gpus": 0, "cpu": "AMD EPYC", "cpus": 16, "memory_bytes": 2**36}
H200 = {**CPU_BOX, "device": "NVIDIA H200", "gpu": "NVIDIA H200", "gpus": 1, "cpu": "Intel Xeon"}
SMALL = {**CPU_BOX, "cpus": 4}


def _type(
    source: str,
    rate: float,
    per_hour: float | None,
    *,
    interval: float | None = 0.02,
    machine: dict[str, Any] = CPU_BOX,
    points: int = 3,
    **config: Any,
) -> TypeRun:
    """A sweep whose knee is 2 workers at ``rate`` (4 workers no faster, 0 workers half as fast)."""
    trials = [
        measurement(0, "end_to_end", "train", rate / 2, rate_interval=interval),
        measurement(1, "end_to_end", "train", rate, num_workers=2, rate_interval=interval),
        measurement(2, "end_to_end", "train", rate, num_workers=4, rate_interval=interval),
    ][:points]
    choice = select_knee(rows_from_measurements(trials), SELECTION)
    return TypeRun(source, from_dict(sleepy_config(**config)), choice, machine, source, per_hour, "cost.per_hour")


def test_the_cheapest_type_per_item_with_the_rate_interval_carried_through():
    """The H200 runs twice as fast at three times the price: the CPU box gives 1.5x the samples per unit of money,
    and 2 % intervals leave no overlap."""
    c = compare([_type("h200", 600.0, 3.0, machine=H200), _type("cpu", 300.0, 1.0)])
    h200, cpu = c.types
    assert [t.source for t in c.types] == ["h200", "cpu"] and c.unit == "samples"
    assert h200.knee is not None and h200.knee.knobs.num_workers == 2 and h200.rate == 600.0
    assert h200.per_hour_items == pytest.approx(600.0 * 3600)
    assert h200.per_money == pytest.approx(600.0 * 3600 / 3.0) and cpu.per_money == pytest.approx(300.0 * 3600)
    assert h200.rate_range == pytest.approx((588.0, 612.0))
    assert cpu.per_money_range == pytest.approx((300.0 * 3600 * 0.98, 300.0 * 3600 * 1.02))
    assert c.cheapest is not None and c.cheapest.type is cpu and c.cheapest.next is h200
    assert c.cheapest.ratio == pytest.approx(1.5)
    assert c.cheapest.overlap is False and c.cheapest.settled
    assert c.notes == ()


def test_overlapping_intervals_leave_the_cheaper_type_unsettled():
    c = compare([_type("a", 300.0, 1.0, interval=0.05), _type("b", 290.0, 1.0, interval=0.05, machine=H200)])
    assert c.cheapest is not None and c.cheapest.type.source == "a"
    assert c.cheapest.overlap is True and not c.cheapest.settled


def test_an_unknown_interval_settles_nothing():
    c = compare([_type("a", 300.0, 1.0, interval=None), _type("b", 100.0, 1.0, machine=H200)])
    assert c.types[0].rate_range is None and c.types[0].per_money_range is None
    assert c.cheapest is not None and c.cheapest.type.source == "a"
    assert c.cheapest.overlap is None and not c.cheapest.settled


def test_a_type_without_a_price_or_a_knee_is_listed_and_said():
    c = compare(
        [
            _type("priced", 300.0, 2.0),
            _type("free", 900.0, None, machine=H200),
            _type("few", 50.0, 1.0, points=1, machine=SMALL),
        ]
    )
    priced, free, few = c.types
    assert free.per_money is None and free.rate == 900.0 and free.priced_by == ""
    assert few.knee is None and few.rate is None and "at least" in few.reason
    assert c.cheapest is not None and c.cheapest.type is priced and c.cheapest.next is None
    assert not c.cheapest.settled
    assert any(note.startswith("free: not priced") and "--per-hour free=PRICE" in note for note in c.notes)
    assert any(note.startswith("few: no knee") for note in c.notes)


def test_different_jobs_are_refused_naming_both_runs_and_the_key():
    a = _type("results/cpu", 300.0, 1.0)
    b = _type("results/h200", 600.0, 3.0, machine=H200, **{"workload.dataset_args.sample_wait_s": 0.01})
    with pytest.raises(UsageError, match=r"results/cpu and results/h200 are different jobs") as raised:
        compare([a, b])
    assert "workload.dataset_args.sample_wait_s: 0.005 against 0.01" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_what_may_differ_per_machine_type_is_the_same_job():
    mine = from_dict(sleepy_config())
    other = from_dict(
        sleepy_config(**{"device": "cuda", "search.num_workers": [0, 4, 8], "trial.window_s": 2, "cost.per_hour": 3})
    )
    assert job_difference(mine, other) == ""
    counted = from_dict(sleepy_config(**{"workload.unit": "tokens"}))
    assert job_difference(mine, counted).startswith("unit: 'samples' against 'tokens'")


def test_one_machine_type_twice_is_refused():
    same = {**CPU_BOX, "memory_bytes": CPU_BOX["memory_bytes"] * 1.02}  # a VM type's RAM varies a little
    with pytest.raises(UsageError, match=r"compare: a and b are one machine type"):
        compare([_type("a", 300.0, 1.0), _type("b", 310.0, 1.0, machine=same)])


def test_no_run_is_refused():
    with pytest.raises(UsageError, match="no run given"):
        compare([])


def test_disturbed_figures_are_said_first():
    shaky = _type("shaky", 300.0, 1.0)
    shaky = TypeRun(**{**shaky.__dict__, "disturbed": ("the figures are disturbed: the run's noise band is 57.3%",)})
    c = compare([_type("quiet", 300.0, 1.0, machine=H200), shaky])
    assert c.types[1].disturbed and c.notes[0] == "shaky: the figures are disturbed: the run's noise band is 57.3%"
