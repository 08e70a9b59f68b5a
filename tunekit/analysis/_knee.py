from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tunekit import rules
from tunekit.analysis._runs import Evidence, pooled
from tunekit.config import Config, Selection
from tunekit.contract import Mode, Stage
from tunekit.records import TrialRow, compute_ceiling


@dataclass(frozen=True)
class Choice:
    """The selection's result. ``knee`` is None when there is no recommendation; ``reason`` says why either way."""

    knee: TrialRow | None
    """The cheapest config shown to be within the tolerance of the best (``rules.within_tolerance``)."""
    best: TrialRow | None
    """The fastest config that fits the headroom limit."""
    ratio: float | None
    """knee / best throughput."""
    band: float | None
    """The run's noise band (``rules.band``: max(tolerance, run noise, the candidates' run-to-run spread)): what the
    plan steered by, and what says the figures are disturbed when wide."""
    reason: str
    over_headroom: tuple[TrialRow, ...] = ()
    """Completed trials left out because they used memory beyond the headroom limit."""
    kept: bool = False
    """Script mode: no measured config beats the script's own settings beyond doubt (``rules.beats``), so the
    recommendation is to keep them: ``knee`` is the script's own trial (stage ``baseline``)."""
    undecided: tuple[TrialRow, ...] = ()
    """Configs cheaper than the knee whose interval against the best straddles the tolerance: more runs may show
    one within it (the plan repeats the cheapest; a budget that ends first leaves the choice provisional)."""
    gain: rules.Ratio | None = None
    """Script mode: the knee's rate over the script's own settings, at 95 % (the test ``kept`` was decided by)."""
    own_over_headroom: TrialRow | None = None
    """Script mode: the script's own settings, completed but leaving less memory free than the headroom limit."""


def cost_key(row: TrialRow) -> tuple[Any, ...]:
    """The cost order: fewer workers, then less prefetch, no pinning, less compile time, smaller batch."""
    k = row.knobs
    return (k.num_workers, k.prefetch_factor or 0, k.pin_memory, round(row.compile_s, 1), k.batch_size, k.grad_accum)


def _no_knee(
    rows: list[TrialRow], fitting: list[TrialRow], too_tight: tuple[TrialRow, ...], selection: Selection
) -> Choice | None:
    """The choice when there is nothing to choose from (no completed config, or fewer than ``MIN_POINTS`` that
    fit), else None."""
    if not fitting and not too_tight:
        failed = [r for r in rows if not r.ok]
        why = f"all {len(failed)} trials failed" if failed else "no end-to-end trial has run"
        return Choice(None, None, None, None, f"No recommendation: {why}.")
    if len(fitting) < rules.MIN_POINTS:
        extra = (
            f" ({len(too_tight)} more left less than {selection.min_headroom:.0%} memory headroom)" if too_tight else ""
        )
        return Choice(
            None,
            max(fitting, key=lambda r: r.rate) if fitting else None,
            None,
            None,
            f"No recommendation: only {len(fitting)} config completed within the headroom limit{extra}; "
            f"a knee needs at least {rules.MIN_POINTS} to compare.",
            too_tight,
        )
    return None


def working_knee(rows: list[TrialRow], selection: Selection) -> TrialRow | None:
    """What the plan steers by while it measures: the cheapest completed config within the run's band
    (``rules.band``) of the best on the figures so far (the best while there is no second config); the decision
    itself is :func:`select_knee`'s test."""
    fitting = [r for r in rows if r.ok and r.mode == Mode.train and rules.fits(r, selection)]
    if not fitting:
        return None
    best = max(fitting, key=lambda r: r.rate)
    target = rules.needed(best, rules.band(fitting, selection))
    return min((r for r in fitting if r.rate >= target), key=cost_key)


def select_knee(rows: list[TrialRow], selection: Selection, evidence: Evidence | None = None) -> Choice:
    """The cheapest config shown to be within ``selection.tolerance`` of the best: the one-sided 95 % lower bound
    of its rate over the best's at least 1 - tolerance (``rules.within_tolerance``, on ``evidence``: the whole
    run's, when the rows are only some of its trials). Cheaper configs whose bound straddles the tolerance are
    ``undecided``; the best itself always qualifies."""
    completed = [r for r in rows if r.ok and r.mode == Mode.train]
    fitting = [r for r in completed if rules.fits(r, selection)]
    too_tight = tuple(r for r in completed if not rules.fits(r, selection))
    none = _no_knee(rows, fitting, too_tight, selection)
    if none is not None:
        return none
    evidence = evidence or Evidence.of(fitting)
    best = max(fitting, key=lambda r: r.rate)
    undecided: list[TrialRow] = []
    knee, test = best, None
    for row in sorted(fitting, key=cost_key):
        if row is best:
            break
        r = evidence.ratio(row, best)
        verdict = rules.within_tolerance(r, selection.tolerance)
        if verdict:
            knee, test = row, r
            break
        if verdict is None:
            undecided.append(row)
    allowed = rules.band(fitting, selection, evidence.candidates.sd if evidence.candidates.measured else 0.0)
    reason = _knee_reason(knee, best, test, len(fitting), selection, evidence)
    if undecided:
        r = evidence.ratio(undecided[0], best)
        reason += (
            f" Undecided between {undecided[0].knobs.describe()} ({r.value:.1%} of the best, {r.low:.1%}-"
            f"{r.high:.1%} at 95 %) and {knee.knobs.describe()}: more runs may show the cheaper one within "
            f"{selection.tolerance:.1%}."
        )
    return Choice(knee, best, knee.rate / best.rate, allowed, reason, too_tight, undecided=tuple(undecided))


def _knee_reason(
    knee: TrialRow, best: TrialRow, test: rules.Ratio | None, configs: int, selection: Selection, evidence: Evidence
) -> str:
    """Why ``knee`` is the knee: the best with no cheaper config shown within the tolerance, or a cheaper one that
    is (``test``: its ratio to the best)."""
    tolerance = f"{selection.tolerance:.1%}"
    if test is None:
        why = (
            f"no cheaper config is shown to be within {tolerance} of it; {evidence.candidates.describe()}."
            if configs > 1
            else "the only config."
        )
        return f"The best config, {best.knobs.describe()} ({best.rate:.1f} {best.unit}/s), is the knee: {why}"
    return (
        f"Knee: {knee.knobs.describe()} reaches {test.value:.1%} of the best ({knee.rate:.1f} vs "
        f"{best.rate:.1f} {best.unit}/s; at least {test.lower:.1%} at 95 %, {test.basis()}), within the "
        f"{tolerance} tolerance, and it is cheaper than {best.knobs.describe()}."
    )


def select(cfg: Config, rows: list[TrialRow]) -> Choice:
    """The run's recommendation: the knee over the knee stages, each config measured more than once pooled
    (:func:`pooled`); with ``search.target_effective_batch``, only among trials that reach that effective batch, the
    accumulation stage deciding when it ran. In script mode, then, against the script's own settings whenever they
    completed (over the headroom limit or at another effective batch too, said): keep them unless beaten beyond
    doubt, and their batch where the batch does not matter."""
    rows = pooled(rows)
    evidence = Evidence.of(rows)
    choice = _select(cfg, rows, evidence)
    own = _own(rows)
    if own is None:
        return choice
    return against_own(_your_batch(cfg, choice, rows, own, evidence), rows, cfg, evidence)


def _own(rows: list[TrialRow]) -> TrialRow | None:
    """The script's own settings (its ``baseline`` trial), completed end to end."""
    return next((r for r in rows if r.stage == Stage.baseline and r.ok and r.mode == Mode.train), None)


def _your_batch(cfg: Config, choice: Choice, rows: list[TrialRow], own: TrialRow, evidence: Evidence) -> Choice:
    """A knee at another batch than the script's own, where the step is not the bound (``rules.input_bound``: it
    runs below NEAR_CEILING of its compute ceiling), gives way to the cheapest config at the script's batch (and at
    ``search.target_effective_batch`` when one is set) shown within the tolerance of the best by the knee's own test:
    there the batch changes the rate by no more than the tolerance, and the script keeps the batch its optimizer
    settings were tuned for."""
    knee, best, selection = choice.knee, choice.best, cfg.selection
    target = cfg.search.target_effective_batch
    if knee is None or best is None or knee.knobs.batch_size == own.knobs.batch_size:
        return choice
    if not rules.input_bound(knee, compute_ceiling(rows, knee.knobs.batch_size)):
        return choice
    same = [
        r
        for r in rows
        if r.stage.knee
        and r.ok
        and r.mode == Mode.train
        and rules.fits(r, selection)
        and not rules.changes_result(r)
        and r.knobs.batch_size == own.knobs.batch_size
        and (not target or r.knobs.effective_batch == target)
        and (r is best or rules.within_tolerance(evidence.ratio(r, best), selection.tolerance))
    ]
    if not same:
        return choice
    mine = min(same, key=cost_key)
    ceiling = compute_ceiling(rows, knee.knobs.batch_size)
    return Choice(
        mine,
        best,
        mine.rate / best.rate,
        choice.band,
        f"Your batch: {mine.knobs.describe()} keeps the script's own batch {own.knobs.batch_size} and "
        f"reaches {mine.rate / best.rate:.1%} of the best ({mine.rate:.1f} vs {best.rate:.1f} "
        f"{best.unit}/s), within the {selection.tolerance:.1%} tolerance at 95 %; the cheaper "
        f"{knee.knobs.describe()} changes the batch, which matters only where the step is the bound, and it runs "
        f"at {rules.of_ceiling(knee, ceiling):.0%} of its compute ceiling.",
        choice.over_headroom,
    )


def against_own(choice: Choice, rows: list[TrialRow], cfg: Config, evidence: Evidence | None = None) -> Choice:
    """Script mode: the choice against the script's own settings (its ``baseline`` trial, whatever its headroom or
    effective batch). A knee whose rate over theirs is not above 1 at 95 % (``rules.beats``, on the interval the
    report prints) is no gain: keep them, never recommend a config measured no faster. Without a knee for want of
    a second config, the one measured is compared with them the same way."""
    own = _own(rows)
    if own is None:
        return choice
    evidence = evidence or Evidence.of(rows)
    knee = choice.knee or choice.best  # the one config measured end to end: it must beat the script's own
    if knee is None:
        return choice
    selection, target = cfg.selection, cfg.search.target_effective_batch
    gain = evidence.ratio(knee, own)
    tight = None if rules.fits(own, selection) else own
    first = _own_notes(own, selection, target)
    if rules.beats(gain):
        if choice.knee is not None:
            return dataclasses.replace(choice, gain=gain, own_over_headroom=tight, reason=first + choice.reason)
        return Choice(
            knee,
            knee,
            1.0,
            choice.band,
            first + f"The one config measured end to end besides the script's own settings, "
            f"{knee.knobs.describe()}, runs {gain.value:.2f}x theirs ({gain.low:.2f}-{gain.high:.2f}x at 95 %; "
            f"{knee.rate:.1f} against {own.rate:.1f} {knee.unit}/s).",
            choice.over_headroom,
            gain=gain,
            own_over_headroom=tight,
        )
    best = choice.best or knee
    return Choice(
        own,
        best,
        own.rate / best.rate if best.rate else None,
        choice.band,
        first + f"Keep your settings: no config measured beats the script's own ({own.knobs.describe()}, "
        f"{own.rate:.1f} {own.unit}/s, trial {own.number}) beyond doubt: {knee.knobs.describe()} runs "
        f"{gain.value:.2f}x theirs, {gain.low:.2f}-{gain.high:.2f}x at 95 %; the fastest, "
        f"{best.knobs.describe()}, measured {best.rate:.1f} {best.unit}/s (trial {best.number}).",
        choice.over_headroom,
        kept=True,
        gain=gain,
        own_over_headroom=tight,
    )


def _own_notes(own: TrialRow, selection: Selection, target: int | None) -> str:
    """What is said first of the script's own settings compared: over the headroom limit, another effective
    batch than the target."""
    notes = ""
    if not rules.fits(own, selection):
        notes += (
            f"Your settings leave {own.headroom:.0%} of memory free, under the {selection.min_headroom:.0%} "
            "headroom limit: they are compared all the same. "
        )
    if target and own.knobs.effective_batch != target:
        notes += (
            f"Your settings train at effective batch {own.knobs.effective_batch}, not "
            f"search.target_effective_batch = {target}: they are compared all the same. "
        )
    return notes


def _select(cfg: Config, rows: list[TrialRow], evidence: Evidence) -> Choice:
    target = cfg.search.target_effective_batch
    candidates = [r for r in rows if r.stage.knee and not rules.changes_result(r)]
    if not any(r.ok for r in candidates) and not any(r.mode == Mode.train for r in rows):
        ceilings = [r for r in rows if r.mode == Mode.compute and r.status != "skipped"]
        if ceilings and not any(r.ok for r in ceilings):  # the sweep stopped at its first stage: say why
            first = ceilings[0]
            return Choice(
                None,
                None,
                None,
                None,
                f"No recommendation: the compute ceiling failed (trial {first.number}, {first.status}: "
                f"{first.reason}), so no end-to-end trial ran; fix that and rerun to resume.",
            )
    if not target:
        return select_knee(candidates, cfg.selection, evidence)
    accumulation = [r for r in rows if r.stage == Stage.accumulation and r.ok and rules.fits(r, cfg.selection)]
    if accumulation:  # same loader settings, different micro-batch x steps: the fastest wins
        best = max(accumulation, key=lambda r: r.rate)
        return Choice(
            best,
            best,
            1.0,
            None,
            f"Effective batch {target} is reached fastest with micro-batch {best.knobs.batch_size} x "
            f"{best.knobs.grad_accum} accumulation steps ({best.rate:.1f} {best.unit}/s).",
        )
    reaching = [r for r in candidates if r.knobs.effective_batch == target]
    if not any(r.ok for r in reaching):
        return Choice(
            None,
            None,
            None,
            None,
            f"No recommendation: no completed trial reaches search.target_effective_batch = {target}.",
        )
    return select_knee(reaching, cfg.selection, evidence)


def choose_batch(compute_rows: list[TrialRow], selection: Selection) -> int | None:
    """The batch for the end-to-end stages: the smallest whose compute-ceiling throughput is within the band of the
    best batch that fits the headroom limit."""
    fitting = [r for r in compute_rows if r.ok and rules.fits(r, selection)]
    if not fitting:
        return None
    best = max(fitting, key=lambda r: r.rate)
    target = rules.needed(best, rules.band(fitting, selection))
    return min(r.knobs.batch_size for r in fitting if r.rate >= target)


def single_gpu_twin(rows: list[TrialRow], row: TrialRow) -> TrialRow | None:
    """The completed one-GPU trial of a multi-rank trial's per-rank config (the scaling stage's), or None."""
    if row.knobs.ranks < 2:
        return None
    want = {**row.knobs.to_dict(), "ranks": 1}
    return next((r for r in rows if r.ok and r.mode == Mode.train and r.knobs.to_dict() == want), None)


def defaults_trial(rows: list[TrialRow], knee: TrialRow | None) -> TrialRow | None:
    """The completed PyTorch-defaults trial (0 workers, no pinning, eager, the job's own pipeline and thread
    counts: a 0-worker trial of a user knob's other value is another pipeline, not the baseline): at the knee's
    batch and accumulation when there is one, else the end-to-end one (the batch stage can move the knee off the
    swept batch). A script's own settings that are PyTorch's defaults serve as it when no other trial measured
    them (one config, one figure: the plan then runs no second trial of it)."""
    ranks = knee.knobs.ranks if knee is not None else max((r.knobs.ranks for r in rows), default=1)
    found = [r for r in rows if r.ok and r.mode == Mode.train and r.knobs.pytorch_defaults and r.knobs.ranks == ranks]
    if knee is not None:
        same = [
            r
            for r in found
            if (r.knobs.batch_size, r.knobs.grad_accum) == (knee.knobs.batch_size, knee.knobs.grad_accum)
        ]
        if same:
            found = same
    found.sort(key=lambda r: (r.stage == Stage.baseline, r.stage != Stage.end_to_end, r.number))
    return found[0] if found else None
