"""rules/_evidence.py: the run-to-run spread and its prior, paired gains, the knee's test, the check's test; and the
simulation harness (benchmarks/evidence.py) that feeds the real plan, analysis and rules with a known truth."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path

import pytest

from tests.conftest import measurement
from tunekit import analysis, rules
from tunekit.config import Selection
from tunekit.records import rows_from_measurements

_BENCHMARKS = Path(__file__).resolve().parent.parent.parent / "benchmarks"
sys.path.insert(0, str(_BENCHMARKS))
_spec = importlib.util.spec_from_file_location("evidence_benchmark", _BENCHMARKS / "evidence.py")
sim = importlib.util.module_from_spec(_spec)
sys.modules["evidence_benchmark"] = sim  # its dataclasses look their module up
_spec.loader.exec_module(sim)


def test_the_spread_is_never_zero_below_two_degrees_of_freedom():
    """No repeats, or one repeated config (one degree of freedom): the stated prior, blended with what was measured;
    from two degrees of freedom on the measured spread alone, on a log scale."""
    none = rules.spread([])
    assert none.sd == rules.RUN_SPREAD_PRIOR and none.df == rules.PRIOR_DF and not none.measured
    same = rules.spread([(100.0, 100.0)])  # two identical runs say little: the prior still speaks
    assert same.sd == pytest.approx(rules.RUN_SPREAD_PRIOR * math.sqrt(4 / 5)) and same.df == 5
    two = rules.spread([(100.0, 110.0), (200.0, 196.0)])
    squares = 2 * (math.log(1.1) / 2) ** 2 + 2 * (math.log(200 / 196) / 2) ** 2
    assert two.measured and two.df == 2 and two.sd == pytest.approx(math.sqrt(squares / 2))


def test_a_2x_gain_paired_over_blocks_holds_2x_and_narrows_when_both_slow_together():
    """The knee runs exactly twice the own settings in every block, while the blocks differ by 30 % (both slow
    together): paired, the gain is 2.00x and its interval holds 2x; compared unpaired, the same runs give an
    interval several times wider."""
    rows = []
    for run, level in enumerate((1.0, 0.7, 1.0, 0.75)):
        rows.append(measurement(2 * run, "baseline", "train", 100 * level, num_workers=1, run=run))
        rows.append(measurement(2 * run + 1, "end_to_end", "train", 200 * level, num_workers=2, run=run))
    pooled = analysis.pooled(rows_from_measurements(rows))
    own, knee = (next(r for r in pooled if r.knobs.num_workers == w) for w in (1, 2))
    evidence = analysis.Evidence.of(pooled)
    gain = evidence.ratio(knee, own)
    assert gain.paired and gain.blocks == 3 and gain.value == pytest.approx(2.0)
    assert gain.low <= 2.0 <= gain.high and rules.beats(gain)
    unpaired = rules.ratio(
        {0: knee.rate}, {0: own.rate}, paired=(evidence.candidates,) * 2, unpaired=(evidence.own, evidence.candidates)
    )
    assert (unpaired.high - unpaired.low) > 3 * (gain.high - gain.low)


def test_the_knee_test_decides_out_within_or_undecided():
    spread = rules.Spread(0.01, 10, 10)
    within = rules.ratio({1: 99.0, 2: 99.2}, {1: 100.0, 2: 100.0}, paired=(spread, spread), unpaired=(spread, spread))
    assert rules.within_tolerance(within, 0.03) is True
    out = rules.ratio({1: 90.0, 2: 90.5}, {1: 100.0, 2: 100.0}, paired=(spread, spread), unpaired=(spread, spread))
    assert rules.within_tolerance(out, 0.03) is False
    prior = rules.spread([])
    unsure = rules.ratio({0: 98.0}, {0: 100.0}, paired=(prior, prior), unpaired=(prior, prior))
    assert rules.within_tolerance(unsure, 0.03) is None and unsure.selected and not unsure.paired


def test_a_collapsed_run_is_one_far_below_the_fastest_other():
    assert rules.collapsed([143.8, 17.5]) == [1]
    assert rules.collapsed([100.0, 87.0]) == []  # a starved config's 13 % is spread, not a collapse
    assert rules.collapsed([100.0]) == []


@pytest.mark.parametrize(
    ("rates", "status"),
    [((100.0, 100.5), "holds"), ((80.0, 79.0), "regressed"), ((96.0, 95.0), "inconclusive"), ((120, 121), "faster")],
)
def test_the_check_decides_by_one_sided_bounds(rates, status):
    test = rules.check_test(100.0, 0.01, rules.Spread(0.01, 8, 8), rates, 0.005, 0.05)
    assert test.status == status and test.lower <= test.change <= test.upper


def test_the_check_on_a_box_as_noisy_as_the_prior_is_inconclusive_not_regressed_at_no_change():
    test = rules.check_test(100.0, 0.15, rules.spread([]), [99.0], 0.02, 0.05)
    assert test.status == "inconclusive"


# --- the simulation: the real plan's repeats, the real select and intervals, a known truth ----------------------

SWEEPS = 120


@pytest.fixture(scope="module")
def rates() -> dict[str, object]:
    return {s.name: sim.coverage(s, SWEEPS) for s in sim.SCENARIOS}


@pytest.mark.parametrize("scenario", [s.name for s in sim.SCENARIOS])
def test_gain_intervals_cover_the_truth_and_the_knee_lands_within_5_percent(rates, scenario):
    """The gain over the own settings (paired over alternated blocks) holds the true gain in at least 93 % of
    sweeps in every scenario; the gain over the defaults (one unrepeated run, unpaired) where shocks are not common
    to configs measured close in time and no run collapses; the knee lands 5 % or more below the best in at most
    5 %. What falls short (the defaults' gain under common shocks or collapses, 90-93 %; the knee's own rate
    interval, 87-97 %: the config chosen as the knee is the one whose runs looked fast) is printed by
    benchmarks/evidence.py and given in the README."""
    r = rates[scenario]
    assert r.gain_own >= 0.93, r
    if scenario not in ("collapses", "common shocks"):
        assert r.gain_defaults >= 0.93, r
    assert r.below <= 0.05, r


def test_the_check_rarely_cries_wolf_and_catches_a_10_percent_regression_on_a_quiet_box():
    quiet = next(s for s in sim.SCENARIOS if s.name == "quiet")
    c = sim.check_rates(quiet, 100)
    assert c.false_alarm <= 0.05 and c.detected >= 0.90, c
    loaded = next(s for s in sim.SCENARIOS if s.name == "loaded 2-core")
    assert sim.check_rates(loaded, 100).false_alarm <= 0.05


def test_the_simulated_sweep_runs_the_real_plan_to_a_decision():
    sweep = sim.sweep(sim.SCENARIOS[0], random.Random(3), sim.config())
    runs = {r.run for r in sweep.rows}
    assert max(runs) >= 1 and sweep.choice.knee is not None  # the plan asked repeats, select decided
    assert Selection().tolerance == 0.03
