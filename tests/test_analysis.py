"""Knee selection on saved measurement fixtures (tests/fixtures/knee_cases.json)."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.conftest import REPO
from tunekit.analysis import choose_batch, select_knee, trials_frame
from tunekit.config import Selection
from tunekit.records import rows_from_measurements

CASES = json.loads((REPO / "tests" / "fixtures" / "knee_cases.json").read_text())
SELECTION = Selection(tolerance=0.03, min_headroom=0.10)


@pytest.mark.parametrize("name", sorted(CASES))
def test_knee_cases(name: str):
    case = CASES[name]
    result = select_knee(rows_from_measurements(case["trials"]), SELECTION)
    if case["expect_workers"] is None:
        assert result.knee is None
        assert result.reason.startswith("No recommendation") and case["reason"] in result.reason
        return
    assert result.knee is not None, result.reason
    assert result.knee.knobs.num_workers == case["expect_workers"], result.reason
    raw = {t["number"]: t["rate"] for t in case["trials"]}
    assert result.ratio == pytest.approx(raw[result.knee.number] / raw[result.best.number])
    assert 0 < result.ratio <= 1
    if "expect_best_workers" in case:
        assert result.best.knobs.num_workers == case["expect_best_workers"]
        assert [r.knobs.num_workers for r in result.over_headroom] == [8]


def test_plateau_knee_is_cheaper_than_best_and_says_why():
    result = select_knee(rows_from_measurements(CASES["plateau"]["trials"]), SELECTION)
    assert result.best.knobs.num_workers == 8 and result.knee.knobs.num_workers == 4
    assert "98.4% of the best" in result.reason and "4 workers" in result.reason


def test_noise_widens_the_band():
    rows = rows_from_measurements(CASES["noisy_plateau"]["trials"])
    assert select_knee(rows, SELECTION).knee.knobs.num_workers == 4  # 280 is 6.7 % below 300, noise 8 %
    quiet = rows_from_measurements([{**t, "noise_cv": 0.0} for t in CASES["noisy_plateau"]["trials"]])
    assert select_knee(quiet, SELECTION).knee.knobs.num_workers == 8  # without noise 280 is too far below


def test_cost_order_prefers_unpinned_and_less_prefetch():
    t = CASES["plateau"]["trials"][2]
    variants = [
        {**t, "number": 10, "params": {**t["params"], "pin_memory": True}, "rate": 301},
        {**t, "number": 11, "params": {**t["params"], "prefetch_factor": 4}, "rate": 302},
        t,
    ]
    result = select_knee(rows_from_measurements(variants), SELECTION)
    assert result.knee.number == t["number"]


def test_choose_batch_takes_the_smallest_within_tolerance_that_fits():
    def compute(n, batch, sps, headroom=0.5, status="ok"):
        return {
            "version": 2,
            "number": n,
            "stage": "compute",
            "mode": "compute",
            "status": status,
            "params": {"batch_size": batch},
            "rate": sps,
            "noise_cv": 0.01,
            "headroom": headroom,
        }

    rows = rows_from_measurements(
        [compute(0, 64, 800), compute(1, 128, 990), compute(2, 256, 1000), compute(3, 512, 1100, headroom=0.05)]
    )
    assert choose_batch(rows, SELECTION) == 128
    assert choose_batch(rows_from_measurements([compute(0, 64, 0, status="oom")]), SELECTION) is None


def test_trials_frame_has_one_row_per_trial_with_knobs_and_status():
    frame = trials_frame(rows_from_measurements(CASES["one_point"]["trials"]))
    assert list(frame["number"]) == [0, 1]
    assert {
        "stage",
        "num_workers",
        "prefetch_factor",
        "pin_memory",
        "batch_size",
        "grad_accum",
        "compile",
        "status",
        "reason",
        "rate",
        "unit",
    } <= set(frame.columns)
    assert "samples_per_s" not in frame.columns and "version" not in frame.columns
    assert frame.loc[1, "status"] == "oom" and "out of memory" in frame.loc[1, "reason"]


def test_an_erratic_cheap_trial_is_not_within_noise():
    """H200, configs/resnet-reduced.yaml: 12 workers, prefetch 4, pinned ran at 54 % of the best with 55 % window
    noise; its own noise must not make it the knee. The band is the noise of the upper half (7.2 % here)."""
    result = select_knee(rows_from_measurements(CASES["erratic_cheap_trial"]["trials"]), SELECTION)
    assert result.best.number == 6
    assert result.knee.number == 4  # 16 workers, prefetch 2, unpinned: 93.9 % of the best, within 7.2 %
    assert result.band == pytest.approx(0.072, abs=0.001)
    assert "median window noise 7.2%" in result.reason


def test_a_run_without_trials_still_has_a_trials_table_header():
    frame = trials_frame([])
    assert len(frame) == 0 and list(frame.columns[:4]) == ["number", "stage", "mode", "num_workers"]


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


def test_repeated_runs_pool_into_one_row_whose_spread_widens_the_band():
    """4 workers ran at 400 then 360/s, 8 workers at 410 then 405/s, the runs alternating: the spread between runs
    (5.3 %, pooled over both configs) is wider than the tolerance and the windows' 1 % noise, so 4 workers, 7 % below
    8 workers on their means, are no longer within noise of them; from the first runs alone 4 workers were the knee.
    Each pooled rate's interval is Student's t over that spread."""
    from tests.conftest import measurement
    from tunekit import rules
    from tunekit.analysis import pooled

    def runs(*rates_by_run):
        return rows_from_measurements(
            [
                measurement(i, "end_to_end", "train", rate, num_workers=w, run=run, rate_interval=0.01)
                for i, (w, rate, run) in enumerate(rates_by_run)
            ]
        )

    first = runs((4, 400, 0), (8, 410, 0))
    assert select_knee(first, SELECTION).knee.knobs.num_workers == 4
    both = runs((4, 400, 0), (8, 410, 0), (4, 360, 1), (8, 405, 1))
    rows = pooled(both)
    assert [(r.number, r.rate, r.runs) for r in rows] == [(0, 380, (400, 360)), (1, 407.5, (410, 405))]
    spread = rules.run_spread(rows)
    squares = (400 / 380 - 1) ** 2 + (360 / 380 - 1) ** 2 + (410 / 407.5 - 1) ** 2 + (405 / 407.5 - 1) ** 2
    expected = (squares / 2) ** 0.5
    assert spread == pytest.approx(expected) and spread > 0.05
    assert rules.band(rows, SELECTION) == pytest.approx(spread)
    choice = select_knee(rows, SELECTION)
    assert choice.knee.knobs.num_workers == 8 and "spread between repeated runs 5.3%" in choice.reason
    assert rows[0].interval == pytest.approx(4.303 * spread / 2**0.5)  # t for 2 degrees of freedom
    # a repeat that failed adds nothing, and no repeat is a row of its own
    failed = rows_from_measurements(
        [measurement(4, "end_to_end", "train", None, status="crashed", num_workers=8, run=2, reason="killed")]
    )
    assert [r.number for r in pooled(both + failed)] == [0, 1]
