"""The evidence rules on simulated sweeps with a known truth: how often each 95 % claim covers it, how often the
knee lands 5 % or more below the best, and how often ``tunekit check`` cries wolf or catches a 10 % regression.

A sweep here is what the staged plan leaves for its decisions: one run of each walked config (numbered in time),
then the repeats and deciding blocks that ``plan.repeat_requests`` asks (the real plan), every decision by the
real ``analysis.select`` and every interval by the real ``rules`` / ``analysis.Evidence``. Each trial's windows are
drawn with autocorrelation; each run carries its own shock, a host state that drifts slowly from trial to trial
(shocks common to the configs measured close in time) and, per scenario, a linear drift or rare collapses.

    python benchmarks/evidence.py [--sweeps 400] [--checks 400]

prints one line per scenario (the README's table "What the intervals are worth").
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from tunekit import analysis, rules
from tunekit.config import from_dict
from tunekit.plan._staged import repeat_requests
from tunekit.records import rows_from_measurements

TRUTH = {0: 100.0, 2: 190.0, 4: 280.0, 6: 294.0, 8: 300.0, 16: 306.0}
"""True rate of each worker count: 8 workers are the knee (98 % of 16's), 6 lie 4 % below the best, 4 lie 8.5 %."""
OWN_TRUTH = 170.0
"""The script's own settings (2 workers, batch 64, pinned): starved, and the noisiest config."""
WINDOWS = 5


@dataclass(frozen=True)
class Scenario:
    name: str
    window_cv: float
    """Each window's relative noise."""
    window_ar: float
    """Lag-one autocorrelation of the windows' noise."""
    run: float
    """Each run's own shock (relative standard deviation)."""
    host: float = 0.0
    """The host state's standard deviation: an AR(1) over trials (``host_ar``), shared by trials close in time."""
    host_ar: float = 0.8
    drift: float = 0.0
    """Linear drift per trial (relative)."""
    collapse: float = 0.0
    """Probability that a run collapses to 15 % of its rate (a stall of the host)."""
    own_extra: float = 0.04
    """The script's own settings' extra run shock (a starved loader is the noisiest config)."""


SCENARIOS = (
    Scenario("quiet", window_cv=0.01, window_ar=0.3, run=0.01),
    Scenario("typical", window_cv=0.02, window_ar=0.5, run=0.03),
    Scenario("loaded 2-core", window_cv=0.04, window_ar=0.6, run=0.045),
    Scenario("common shocks", window_cv=0.02, window_ar=0.5, run=0.015, host=0.05, host_ar=0.5),
    Scenario("slow drift", window_cv=0.02, window_ar=0.5, run=0.015, drift=-0.002),
    Scenario("collapses", window_cv=0.02, window_ar=0.5, run=0.03, collapse=0.05),
)


def config(repeats: int = 1) -> object:
    return from_dict(
        {
            "name": "sim",
            "device": "cpu",
            "workload": {
                "model": "tunekit.workloads.synthetic:sleepy_model",
                "dataset": "tunekit.workloads.synthetic:sleepy_dataset",
            },
            "search": {"num_workers": sorted(TRUTH), "batch_size": [64], "pin_memory": [False]},
            "selection": {"repeats": repeats},
        },
        source="simulation",
    )


class _Host:
    """The machine's state over a sweep's trials: the host AR(1), the drift, the collapses."""

    def __init__(self, s: Scenario, rng: random.Random):
        self.s, self.rng, self.t, self.state = s, rng, 0, rng.gauss(0, s.host)
        self.states: list[float] = []

    @property
    def level(self) -> float:
        """What the machine delivered during the sweep, over its base: the host state's and the drift's mean
        factor (a rate is a claim about this machine as it was during the sweep)."""
        host = sum(math.exp(x) for x in self.states) / max(len(self.states), 1)
        return host * (1.0 + self.s.drift * (self.t - 1) / 2)

    def trial(self, truth: float, own: bool = False) -> tuple[float, list[float]]:
        """One trial's windows (items per 1-s window) at this moment; returns the run's mean level and them."""
        s, rng = self.s, self.rng
        self.state = s.host_ar * self.state + math.sqrt(1 - s.host_ar**2) * rng.gauss(0, s.host)
        self.states.append(self.state)
        level = truth * math.exp(self.state + rng.gauss(0, math.hypot(s.run, s.own_extra if own else 0.0)))
        level *= 1.0 + s.drift * self.t
        if rng.random() < s.collapse:
            level *= 0.15
        self.t += 1
        e, windows = rng.gauss(0, s.window_cv), []
        for _ in range(WINDOWS):
            e = s.window_ar * e + math.sqrt(1 - s.window_ar**2) * rng.gauss(0, s.window_cv)
            windows.append(level * (1 + e))
        return level, windows


def _measurement(n: int, stage: str, workers: int, windows: list[float], run: int, pinned: bool) -> dict:
    rate = rules.window_rate(windows, [1.0] * len(windows))
    mean = sum(windows) / len(windows)
    cv = (sum((w - mean) ** 2 for w in windows) / (len(windows) - 1)) ** 0.5 / mean
    return {
        "version": 2,
        "number": n,
        "stage": stage,
        "mode": "train",
        "status": "ok",
        "params": {
            "num_workers": workers,
            "prefetch_factor": 2 if workers else None,
            "pin_memory": pinned,
            "batch_size": 64,
            "grad_accum": 1,
            "compile": "none",
        },
        "rate": rate,
        "noise_cv": cv,
        "rate_interval": rules.rate_interval(windows, [1.0] * len(windows)),
        "headroom": 0.5,
        "run": run,
        "cpu_count": 16,
    }


@dataclass
class Sweep:
    rows: list
    choice: analysis.Choice
    host: _Host
    drift_mid: float


def sweep(s: Scenario, rng: random.Random, cfg: object, max_trials: int = 40) -> Sweep:
    """One simulated sweep: the script's own settings, the walk's configs once each (in a shuffled order, as a walk
    visits them), then the plan's repeats until it asks none or ``max_trials`` ran."""
    host = _Host(s, rng)
    ms: list[dict] = []

    def measure(stage: str, workers: int, run: int) -> None:
        own = stage == "baseline"
        _, windows = host.trial(OWN_TRUTH if own else TRUTH[workers], own=own)
        ms.append(_measurement(len(ms), stage, workers, windows, run, pinned=own))

    measure("baseline", 2, 0)
    for w in rng.sample(sorted(TRUTH), len(TRUTH)):
        measure("end_to_end", w, 0)
    while len(ms) < max_trials:
        reqs = repeat_requests(cfg, rows_from_measurements(ms), cuda=False)
        if not reqs:
            break
        for req in reqs:
            measure(str(req.stage), 2 if req.stage == "baseline" else req.knobs.num_workers, req.run)
    rows = rows_from_measurements(ms)
    return Sweep(rows, analysis.select(cfg, rows), host, host.level)


@dataclass
class Rates:
    rate: float
    """Share of knee rate intervals that hold the knee's true rate."""
    gain_own: float
    gain_defaults: float
    below: float
    """Share of sweeps whose knee lies 5 % or more below the best's true rate."""
    undecided: float
    """Share of sweeps that ended with a cheaper config undecided."""
    trials: float
    """Mean trials per sweep."""


def _truth(row) -> float:
    return OWN_TRUTH if row.stage == "baseline" else TRUTH[row.knobs.num_workers]


def _covers(low: float, high: float, truth: float) -> bool:
    return low <= truth <= high


def coverage(s: Scenario, sweeps: int, seed: int = 1) -> Rates:
    rng, cfg = random.Random(seed), config()
    rate = own = defaults = below = undecided = trials = 0
    best_truth = max(TRUTH.values())
    for _ in range(sweeps):
        sw = sweep(s, rng, cfg)
        knee, choice = sw.choice.knee, sw.choice
        trials += len(sw.rows)
        decided = analysis.pooled(sw.rows)
        evidence = analysis.Evidence.of(decided)
        truth = _truth(knee) * sw.drift_mid
        rate += _covers(knee.rate / (1 + knee.interval), knee.rate * (1 + knee.interval), truth)
        own_row = next(r for r in decided if r.stage == "baseline")
        g = evidence.ratio(knee, own_row) if knee is not own_row else None
        own += g is None or _covers(g.low, g.high, _truth(knee) / OWN_TRUTH)
        d = analysis.defaults_trial(decided, knee)
        g = evidence.ratio(knee, d) if d is not None and d is not knee else None
        defaults += g is None or _covers(g.low, g.high, _truth(knee) / TRUTH[0])
        below += knee.stage != "baseline" and _truth(knee) < 0.95 * best_truth
        undecided += bool(choice.undecided)
    n = sweeps
    return Rates(rate / n, own / n, defaults / n, below / n, undecided / n, trials / n)


@dataclass
class CheckRates:
    false_alarm: float
    """Share of checks of an unchanged config that said ``regressed``."""
    detected: float
    """Share of checks of a config 10 % slower that said ``regressed``."""
    inconclusive: float
    """Share of checks of an unchanged config that said ``inconclusive``."""


def check_rates(s: Scenario, checks: int, runs: int = 1, seed: int = 2) -> CheckRates:
    """Each check: a sweep records its knee (rate, interval, the candidates' spread), then ``runs`` fresh runs of
    it, unchanged and 10 % slower, on the same host later, go through ``rules.check_test``."""
    rng, cfg = random.Random(seed), config()
    alarms = detected = inconclusive = 0
    for _ in range(checks):
        sw = sweep(s, rng, cfg)
        knee = sw.choice.knee
        if knee.stage == "baseline":  # kept: the check re-measures the script's own settings
            truth = OWN_TRUTH
        else:
            truth = TRUTH[knee.knobs.num_workers]
        spread = analysis.Evidence.of(analysis.pooled(sw.rows)).spread_for(knee)
        tolerance = max(rules.CHECK_TOLERANCE, cfg.selection.tolerance)  # as tunekit check takes it
        for slower, counter in ((1.0, "same"), (0.9, "slow")):
            rates, wins = [], []
            for _ in range(runs):
                _, windows = sw.host.trial(truth * slower, own=knee.stage == "baseline")  # right after the sweep
                rates.append(rules.window_rate(windows, [1.0] * len(windows)))
                wins.append(rules.rate_interval(windows, [1.0] * len(windows)))
            window = rules.mean_windows(wins)
            test = rules.check_test(knee.rate, knee.interval, spread, rates, window, tolerance)
            if counter == "same":
                alarms += test.status == "regressed"
                inconclusive += test.status == "inconclusive"
            else:
                detected += test.status == "regressed"
    return CheckRates(alarms / checks, detected / checks, inconclusive / checks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=400)
    parser.add_argument("--checks", type=int, default=400)
    parser.add_argument("--runs", type=int, default=1, help="fresh runs per check (tunekit check --runs)")
    args = parser.parse_args()
    print(
        "| scenario | knee rate covered | gain over own covered | gain over defaults covered | knee ≥ 5 % below best "
        "| undecided | trials per sweep | check: false regressed | check: 10 % caught | check: inconclusive |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in SCENARIOS:
        r = coverage(s, args.sweeps)
        c = check_rates(s, args.checks, args.runs)
        print(
            f"| {s.name} | {r.rate:.1%} | {r.gain_own:.1%} | {r.gain_defaults:.1%} | {r.below:.1%} | "
            f"{r.undecided:.1%} | {r.trials:.1f} | {c.false_alarm:.1%} | {c.detected:.1%} | {c.inconclusive:.1%} |"
        )


if __name__ == "__main__":
    main()
