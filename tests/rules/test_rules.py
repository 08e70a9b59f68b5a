"""Rules on their own (tunekit/rules/): a trial's windows, its rate and interval, an input bound beside gradient
sync, and the check's comparison."""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import measurement
from tunekit import rules
from tunekit.records import rows_from_measurements


def test_window_rules_leave_out_only_windows_that_are_still_settling():
    from tunekit import rules

    assert rules.settling([238, 370, 375, 375], 2, 0.05) == 1  # 370 is within 5 % of the rest: not settling
    assert rules.settling([200, 400, 401], 3, 0.05) == 0  # never below the minimum count
    # a ramp of three windows (two H200 ranks whose CPUs were still filling up) goes as a whole
    assert rules.settling([4608, 4812, 4459, 4982, 5128, 5107, 5104, 5204], 3, 0.03) == 3
    # noise on both sides of the mean is no ramp: nothing is left out
    assert rules.settling([100, 104, 97, 103, 98, 102, 99], 3, 0.02) == 0
    assert rules.settling([100, 101, 99, 100, 102], 3, 0.03) == 0  # all within the precision

    def one_second(*rates: float) -> tuple[list[float], list[float]]:  # windows of one second each
        return list(rates), [1.0] * len(rates)

    assert rules.window_stop(*one_second(100, 101), 2, 5, None) == "fixed"
    assert rules.window_stop(*one_second(100, 130), 2, 5, 0.02) is None  # too wide: measure another
    assert rules.window_stop(*one_second(100, 130, 100, 131, 99), 2, 5, 0.02) == "max_windows"
    assert rules.rate_interval([100.0], [1.0]) == float("inf")
    assert rules.rate_interval(*one_second(100.0, 100.0)) == 0.0
    # racing: windows 100 +- 10 % whose whole interval lies below the 150 needed stop early; near it they go on
    noisy = one_second(100, 110, 90, 105)
    assert rules.window_stop(*noisy, 3, 8, 0.01, needed=150) == "below_band"
    assert rules.window_stop(*noisy, 3, 8, 0.01, needed=110) is None
    assert rules.window_stop(*noisy, 3, 8, None, needed=150) == "fixed"  # no precision asked: fixed windows
    # from two windows on, before the minimum: a clear miss (198 against 2200, PyTorch's defaults against the
    # knee) stops; a near one (two windows' t-interval is 12.7 standard errors wide) measures on
    assert rules.window_stop(*one_second(192, 204), 3, 8, 0.03, needed=2200) == "below_band"
    assert rules.window_stop(*one_second(192, 204), 3, 8, 0.03, needed=270) is None  # 198 + 38 %: 274
    assert rules.window_stop(*one_second(192), 3, 8, 0.03, needed=2200) is None  # one window: no interval
    assert rules.window_stop(*one_second(100, 100.5), 3, 8, 0.03) is None  # precise, but under the minimum
    # a baseline (what every gain is over) misses as clearly, but two windows 12 % apart have an interval of 75 %:
    # it measures on until its interval is within CLAIM_PRECISION (10 %), here at the fourth
    assert rules.window_stop(*one_second(528, 469), 3, 8, 0.03, needed=3500) == "below_band"
    assert rules.window_stop(*one_second(528, 469), 3, 8, 0.03, needed=3500, baseline=True) is None
    steady = one_second(528, 469, 505, 490)
    assert rules.rate_interval(*steady) <= rules.CLAIM_PRECISION < rules.rate_interval(*one_second(528, 469, 505))
    assert rules.window_stop(*steady, 3, 8, 0.03, needed=3500, baseline=True) == "below_band"
    assert rules.window_stop(*one_second(528, 469, 505), 3, 8, 0.03, needed=3500, baseline=True) is None


def test_a_trial_rate_weighs_every_second_once():
    """Windows close at the end of a loader round: a fast round joins the next in one long window, a slow one stays
    alone. Rounds of 16 batches, one fast (1.5 s) for every three slow (3 s): the median of the window rates reads
    the slow rounds' rate, the ratio of sums is the run's; the interval of equal windows is the t-interval of their
    mean."""
    from tunekit import rules

    samples, seconds = [], []
    for _ in range(4):
        samples += [32.0, 16.0, 16.0]  # a fast round merged with the next slow one, then two slow ones alone
        seconds += [4.5, 3.0, 3.0]
    truth = sum(samples) / sum(seconds)
    assert rules.window_rate(samples, seconds) == pytest.approx(truth)
    rates = [s / t for s, t in zip(samples, seconds, strict=True)]
    assert statistics.median(rates) < truth * 0.95  # what the median of windows read
    equal = [10.0, 12.0, 11.0, 9.0]
    mean = statistics.fmean(equal)
    t_interval = 3.182 * statistics.stdev(equal) / 2 / mean
    assert rules.rate_interval(equal, [1.0] * 4) == pytest.approx(t_interval)


def test_a_machine_change_is_hardware_or_software():
    """What makes another machine (exit 3) against what the same machine may upgrade (named); the test of the figure
    itself is tests/rules/test_evidence.py's."""
    hardware, software = rules.machine_changes(
        {"gpu": "NVIDIA H200", "gpus": 1, "cpus": 16, "memory_bytes": 100 * 2**30, "torch": "2.10", "driver": None},
        {"gpu": "NVIDIA H200", "gpus": 1, "cpus": 16, "memory_bytes": 98 * 2**30, "torch": "2.11", "driver": "580"},
    )
    assert hardware == [] and software == [("torch", "2.10", "2.11")]  # RAM within 5 %, an unknown driver
    hardware, _ = rules.machine_changes({"gpus": 1, "cpus": 16}, {"gpus": 8, "cpus": 16, "cpu": "AMD"})
    assert hardware == [("gpus", 1, 8)]


def test_gradient_sync_alone_is_not_an_input_bound():
    from tunekit import rules

    ceiling, *_ = rows_from_measurements([measurement(0, "compute", "compute", 400)])
    synced, waiting = rows_from_measurements(
        [
            measurement(1, "end_to_end", "train", 560, ranks=2, data_wait_frac=0.0, sync_share=0.3),
            measurement(2, "end_to_end", "train", 560, ranks=2, data_wait_frac=0.3),
        ]
    )
    assert not rules.input_bound(synced, ceiling) and rules.input_bound(waiting, ceiling)
