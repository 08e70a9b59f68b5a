from __future__ import annotations

from typing import Any

from tunekit import rules
from tunekit.analysis import defaults_trial
from tunekit.config import Selection
from tunekit.contract import Mode
from tunekit.diagnosis._facts import Trials
from tunekit.diagnosis._verdicts import Verdict, verdict
from tunekit.records import TrialRow


def run_verdicts(
    rows: list[TrialRow],
    knee: TrialRow | None,
    per_trial: dict[int, Verdict],
    selection: Selection,
    env: dict[str, Any] | None = None,
) -> list[Verdict]:
    """The run's verdicts, the primary one first: the knee's own, why the PyTorch defaults were slow (when that
    differs), then what the rest of the run shows (other processes on the GPU, the memory boundary, per-step
    overhead at the chosen batch). ``per_trial`` is :func:`trial_verdicts` of the same rows."""
    trials = Trials(rows, selection)
    found: list[Verdict] = []
    if knee is not None and knee.number in per_trial:
        found.append(per_trial[knee.number])
    defaults = defaults_trial(rows, knee) if knee is not None else None
    if defaults is not None and knee is not None and defaults.number in per_trial and defaults.number != knee.number:
        found.append(per_trial[defaults.number])
    for check in (_other_processes(rows, env), _memory_boundary(rows, trials), _overhead(knee, trials)):
        if check is not None:
            found.append(check)
    seen: set[str] = set()
    return [v for v in found if not (v.name in seen or seen.add(v.name))]


def _other_processes(rows: list[TrialRow], env: dict[str, Any] | None) -> Verdict | None:
    used = {str(r.measurement.device_uuid).lower() for r in rows if r.measurement.device_uuid}
    gpus = [
        g
        for g in ((env or {}).get("gpus") or [])
        if not used or str(g.get("uuid") or "").lower().removeprefix("gpu-") in used
    ]  # only the GPU we used
    procs = sum(len(g.get("processes") or []) for g in gpus)
    return verdict("shared-gpu", {"other processes on the GPU at sweep start": procs}) if procs else None


def _memory_boundary(rows: list[TrialRow], trials: Trials) -> Verdict | None:
    """The memory boundary the compute stage found: the smallest batch that ran out of memory, else the smallest
    that completed over the headroom limit."""
    if trials.oom_batches:
        wall = trials.oom_batches[0]
        # the compute stage walks down past the memory limit: a batch below the OOM may be over the headroom limit
        fitting = [b for b, r in trials.compute.items() if b < wall and rules.fits(r, trials.selection)]
        return verdict("memory-wall", {"OOM at batch": wall, "largest batch that fits": max(fitting, default=None)})
    tight = sorted(
        (r for r in rows if r.mode == Mode.compute and rules.past_memory_limit(r, trials.selection)),
        key=lambda r: r.knobs.batch_size,
    )
    if not tight:
        return None
    wall = tight[0]
    fitting = [b for b, r in trials.compute.items() if b < wall.knobs.batch_size and rules.fits(r, trials.selection)]
    return verdict(
        "memory-wall",
        {
            f"headroom at batch {wall.knobs.batch_size}": wall.headroom,
            "limit": trials.selection.min_headroom,
            "largest batch that fits": max(fitting, default=None),
        },
    )


def _overhead(knee: TrialRow | None, trials: Trials) -> Verdict | None:
    """The chosen batch still pays a fixed per-step cost that a larger one would amortise (not when the knee is
    input-bound: a larger batch was then measured slower end to end)."""
    if knee is None or len(trials.per_sample) < 2:
        return None
    batch = knee.knobs.batch_size
    if rules.input_bound(knee, trials.compute.get(batch)):
        return None
    ratio = trials.overhead_ratio(batch)
    if ratio is None or ratio <= rules.OVERHEAD_RATIO:
        return None
    return verdict("overhead-bound", {f"per-{knee.item} time at batch {batch} vs the best batch": f"{ratio:.2f}x"})
