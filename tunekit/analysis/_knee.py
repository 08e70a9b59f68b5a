from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunekit import rules
from tunekit.analysis._runs import pooled
from tunekit.config import Config, Selection
from tunekit.contract import Mode, Stage
from tunekit.records import TrialRow, compute_ceiling


@dataclass(frozen=True)
class Choice:
    """The selection's result. ``knee`` is None when there is no recommendation; ``reason`` says why either way."""

    knee: TrialRow | None
    """The cheapest config within the band of the best."""
    best: TrialRow | None
    """The fastest config that fits the headroom limit."""
    ratio: float | None
    """knee / best throughput."""
    band: float | None
    """The band the knee was chosen with: max(tolerance, run noise, run-to-run spread) (rules.band)."""
    reason: str
    over_headroom: tuple[TrialRow, ...] = ()
    """Completed trials left out because they used memory beyond the headroom limit."""
    kept: bool = False
    """Script mode: no measured config beats the script's own settings beyond doubt (rules.gain_margin), so the
    recommendation is to keep them: ``knee`` is the script's own trial (stage ``baseline``)."""


def cost_key(row: TrialRow) -> tuple[Any, ...]:
    """The cost order: fewer workers, then less prefetch, no pinning, less compile time, smaller batch."""
    k = row.knobs
    return (k.num_workers, k.prefetch_factor or 0, k.pin_memory, round(row.compile_s, 1), k.batch_size, k.grad_accum)


def select_knee(rows: list[TrialRow], selection: Selection, spread: float | None = None) -> Choice:
    """The cheapest config within the run's band of the best (see the package docstring); ``spread``: the run-to-run
    spread of the whole run's repeats (``rules.band``), when the rows are only some of them."""
    completed = [r for r in rows if r.ok and r.mode == Mode.train]
    fitting = [r for r in completed if rules.fits(r, selection)]
    too_tight = tuple(r for r in completed if not rules.fits(r, selection))
    if not completed:
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
    best = max(fitting, key=lambda r: r.rate)
    noise = rules.run_noise(fitting)
    spread = rules.run_spread(fitting) if spread is None else spread
    allowed = rules.band(fitting, selection, spread)
    knee = min((r for r in fitting if r.rate >= rules.needed(best, allowed)), key=cost_key)
    ratio = knee.rate / best.rate
    parts = (
        f"max(tolerance {selection.tolerance:.1%}, the run's median window noise {noise:.1%}"
        + (f", the spread between repeated runs {spread:.1%}" if spread else "")
        + ")"
    )
    if knee is best:
        reason = (
            f"The best config is also the cheapest within {allowed:.1%} of it ({parts}; {best.rate:.1f} {best.unit}/s)."
        )
    else:
        reason = (
            f"Knee: {knee.knobs.describe()} reaches {ratio:.1%} of the best ({knee.rate:.1f} vs "
            f"{best.rate:.1f} {best.unit}/s); the shortfall is within {parts}, and it is cheaper than "
            f"{best.knobs.describe()}."
        )
    return Choice(knee, best, ratio, allowed, reason, too_tight)


def select(cfg: Config, rows: list[TrialRow]) -> Choice:
    """The run's recommendation: the knee over the knee stages, each config measured more than once pooled
    (:func:`pooled`); with ``search.target_effective_batch``, only among trials that reach that effective batch, the
    accumulation stage deciding when it ran. In script mode, then, against the script's own settings (when they
    reach the target too): keep them unless beaten beyond doubt, and their batch where the batch does not matter."""
    rows = pooled(rows)
    choice = _select(cfg, rows)
    target = cfg.search.target_effective_batch
    own = _own(rows, cfg.selection)
    if own is None or (target and own.knobs.effective_batch != target):
        return choice
    return against_own(_your_batch(choice, rows, own, cfg.selection), rows, cfg.selection)


def _own(rows: list[TrialRow], selection: Selection) -> TrialRow | None:
    """The script's own settings (its ``baseline`` trial), completed end to end and within the headroom limit."""
    own = next((r for r in rows if r.stage == Stage.baseline and r.ok and r.mode == Mode.train), None)
    return own if own is not None and rules.fits(own, selection) else None


def _your_batch(choice: Choice, rows: list[TrialRow], own: TrialRow, selection: Selection) -> Choice:
    """A knee at another batch than the script's own, where the step is not the bound (``rules.input_bound``: it
    runs below NEAR_CEILING of its compute ceiling), gives way to the cheapest config at the script's batch within
    the same band of the best: there the batch changes the rate by no more than noise, and the script keeps the
    batch its optimizer settings were tuned for."""
    knee, best = choice.knee, choice.best
    if knee is None or best is None or choice.band is None or knee.knobs.batch_size == own.knobs.batch_size:
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
        and r.rate >= rules.needed(best, choice.band)
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
        f"{best.unit}/s), within the band ({choice.band:.1%}); the cheaper {knee.knobs.describe()} changes "
        f"the batch, which matters only where the step is the bound, and it runs at "
        f"{rules.of_ceiling(knee, ceiling):.0%} of its compute ceiling.",
        choice.over_headroom,
    )


def against_own(choice: Choice, rows: list[TrialRow], selection: Selection) -> Choice:
    """Script mode: the choice against the script's own settings (its ``baseline`` trial). A knee that does not beat
    them by more than ``rules.gain_margin`` (the band, or the two rates' intervals) is no gain: keep them, never
    recommend a config measured no faster. Without a knee for want of a second config, the one measured is compared
    with them the same way."""
    own = _own(rows, selection)
    if own is None:
        return choice
    knee = choice.knee
    if knee is None:
        if choice.best is None:
            return choice
        knee = choice.best  # the one config measured end to end: it must beat the script's own to be chosen
    margin = rules.gain_margin(choice.band if choice.band is not None else selection.tolerance, knee, own)
    if knee.rate > own.rate * (1.0 + margin):
        if choice.knee is not None:
            return choice
        return Choice(
            knee,
            knee,
            1.0,
            margin,
            f"The one config measured end to end besides the script's own settings, "
            f"{knee.knobs.describe()}, runs {knee.rate / own.rate:.2f}x theirs ({knee.rate:.1f} against "
            f"{own.rate:.1f} {knee.unit}/s), beyond the {margin:.1%} that can part two measurements.",
            choice.over_headroom,
        )
    best = choice.best or knee
    return Choice(
        own,
        best,
        own.rate / best.rate if best.rate else None,
        margin,
        f"Keep your settings: no config measured beats the script's own ({own.knobs.describe()}, "
        f"{own.rate:.1f} {own.unit}/s, trial {own.number}) by more than {margin:.1%} (the run's band, or "
        f"the two rates' 95 % intervals together); the fastest, {best.knobs.describe()}, measured "
        f"{best.rate:.1f} {best.unit}/s (trial {best.number}).",
        choice.over_headroom,
        kept=True,
    )


def _select(cfg: Config, rows: list[TrialRow]) -> Choice:
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
    spread = rules.run_spread(rows)  # every repeated config's, the script's own settings too
    if not target:
        return select_knee(candidates, cfg.selection, spread)
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
    return select_knee(reaching, cfg.selection, spread)


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
    swept batch)."""
    ranks = knee.knobs.ranks if knee is not None else max((r.knobs.ranks for r in rows), default=1)
    # a script's own baseline may run PyTorch's loader defaults too, but it is the script's settings, reported apart
    found = [
        r
        for r in rows
        if r.ok
        and r.mode == Mode.train
        and r.knobs.pytorch_defaults
        and r.knobs.ranks == ranks
        and r.stage != Stage.baseline
    ]
    if knee is not None:
        same = [
            r
            for r in found
            if (r.knobs.batch_size, r.knobs.grad_accum) == (knee.knobs.batch_size, knee.knobs.grad_accum)
        ]
        if same:
            return same[0]
    found.sort(key=lambda r: (r.stage != Stage.end_to_end, r.number))
    return found[0] if found else None
