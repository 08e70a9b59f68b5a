"""``tunekit check --retune``: a sweep on a search narrowed around the committed knee (``plan.retune_search``),
seeded with the check's own trial and, on the same machine, the ceilings of the sweep that wrote the file (those
that still bound the job), writing ``recommended.retuned.yaml`` beside it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunekit import _api, plan
from tunekit import config as config_mod
from tunekit._files import write_text_atomic
from tunekit.contract import Knobs, Measurement, Mode, Stage, Strategy
from tunekit.recommended import Recommended
from tunekit.records import TrialRow

if TYPE_CHECKING:
    from tunekit._check import CheckOutcome, MachineCheck

Change = tuple[str, Any, Any]
"""A knob that moved: its name, the committed value, the one found."""


@dataclass(frozen=True)
class RetuneOutcome:
    """What the narrowed sweep found, and what it cost against the sweep that wrote the recommendation."""

    run_dir: Path
    written: Path | None
    """recommended.retuned.yaml beside the committed file; None without a recommendation."""
    before: dict[str, Any]
    after: dict[str, Any] | None
    """The knobs (and user-defined knobs, by config key) committed and found; None without a knee."""
    changes: tuple[Change, ...]
    rate: float | None
    unit: str
    trials_run: int
    """Trials the retune launched (skipped and seeded ones not counted)."""
    reused: int
    """Ceilings of the committed sweep recorded first (same machine)."""
    check_trial_reused: bool
    full_trials: int | None
    """Trials the committed sweep ran (recommended.yaml's ``evidence.run``), None when it does not say."""
    reason: str
    stop_reason: str
    interrupted: bool


def _ceilings(rec_path: Path, machine: MachineCheck) -> list[TrialRow]:
    """The finished ceilings of the sweep that wrote the recommendation (its study.db beside it), when this is the
    same machine with the same software; [] otherwise, or without a readable study."""
    if machine.hardware or machine.software or not (rec_path.parent / "study.db").is_file():
        return []
    from tunekit import store
    from tunekit.errors import TunekitError

    try:
        rows = store.load_run(rec_path.parent).rows()
    except TunekitError:
        return []
    return [r for r in rows if r.ok and r.mode.ceiling]


def _with_retune(
    outcome: CheckOutcome,
    rec: Recommended,
    config: Any,
    cfg: config_mod.Config,
    overrides: dict[str, Any] | None,
    knobs: dict[str, Any] | None,
    out_dir: Path,
    quiet: bool,
) -> CheckOutcome:
    """The check with a retune: a sweep of the config on a search narrowed around the committed knee, seeded with
    the check's own trial and (same machine, the knee no faster: the old ceilings still bound the job from above,
    so a skip on them stays sound) the committed sweep's ceilings that lie in that search."""
    knee = Knobs.of(**rec.knobs)
    bounds = _bounding_ceilings(outcome, rec)
    narrowed = plan.retune_search(cfg, knee, rec.config, {r.knobs.num_workers for r in bounds if r.mode == Mode.loader})
    cfg_r = config_mod.load(config, overrides={**(overrides or {}), **narrowed, **_api.fixed_knobs(knobs)})
    reused, own = _reused_ceilings(outcome, bounds, cfg_r), _own_trial(outcome, cfg_r, knee)
    seeds = [*reused, *own]
    run_dir = out_dir / "retune"
    swept = _api.sweep_config(cfg_r, out=run_dir, strategy=Strategy.staged.value, resume=False, quiet=quiet, seed=seeds)
    rows = swept.summary.rows
    new = swept.recommendation
    before = {**rec.knobs, **rec.config}
    after = {**new.knobs, **new.config} if new is not None else None
    run = rec.evidence.get("run") if isinstance(rec.evidence.get("run"), dict) else {}
    full = run.get("trials_run", run.get("trials"))
    result = RetuneOutcome(
        run_dir=run_dir,
        written=_write_retuned(outcome.recommended, run_dir) if new is not None else None,
        before=before,
        after=after,
        changes=tuple(
            (k, before.get(k), after.get(k))
            for k in sorted(set(before) | set(after or {}))
            if after is not None and before.get(k) != after.get(k)
        ),
        rate=new.evidence.get("rate") if new is not None else None,
        unit=cfg_r.unit,
        trials_run=sum(1 for r in rows if r.status != "skipped") - len(seeds),
        reused=len(reused),
        check_trial_reused=bool(own),
        full_trials=full if isinstance(full, int) else None,
        reason=swept.reason,
        stop_reason=swept.summary.stop_reason,
        interrupted=swept.interrupted,
    )
    return dataclasses.replace(outcome, retune=result)


def _write_retuned(committed: Path, run_dir: Path) -> Path:
    """recommended.retuned.yaml beside the committed file: the retune's recommendation, headed by where it came
    from."""
    written = committed.with_name(f"{committed.stem}.retuned{committed.suffix}")
    text = (run_dir / "recommended.yaml").read_text()
    write_text_atomic(written, f"# retuned from {committed} by tunekit check --retune (run: {run_dir})\n{text}")
    return written


def _bounding_ceilings(outcome: CheckOutcome, rec: Recommended) -> list[TrialRow]:
    """The committed sweep's ceilings that still bound the job from above: on the same machine with the same
    software, for a knee that got no faster, measured with the knee's user-defined knobs (and one rank, no thread
    counts)."""
    machine = outcome.machine
    if not machine.same or machine.software or outcome.status not in ("holds", "regressed"):
        return []
    return [
        r
        for r in _ceilings(outcome.recommended, machine)
        if dict(r.knobs.extra) == rec.config
        and r.knobs.ranks == 1
        and r.knobs.threads is None
        and r.knobs.worker_threads is None
    ]


def _reused_ceilings(outcome: CheckOutcome, bounds: list[TrialRow], cfg: config_mod.Config) -> list[Measurement]:
    """Those of ``bounds`` that lie in the narrowed search, as the retune records them."""
    s, own_batch = cfg.search, cfg.own_batch
    seeds = []
    for row in bounds:
        k = row.knobs
        if not (
            (k.batch_size in s.batch_size or own_batch)
            and (k.num_workers in s.num_workers or not k.num_workers)
            and (k.prefetch_factor is None or k.prefetch_factor in s.prefetch_factor)
            and k.pin_memory in s.pin_memory
            and k.compile in s.compile
            and k.grad_accum in s.grad_accum
        ):
            continue
        m = row.measurement
        seeds.append(
            dataclasses.replace(
                m,
                params={**m.params, "extra": {}},  # the knee's user-defined knobs are the retune's baseline
                warnings=[
                    *(m.warnings or []),
                    f"reused from {outcome.recommended.parent} trial {row.number}: the same "
                    "machine, and the committed knee got no faster, so this ceiling still bounds the job",
                ],
                other={**m.other, "reused_from": {"run": str(outcome.recommended.parent), "trial": row.number}},
            )
        )
    return seeds


def _own_trial(outcome: CheckOutcome, cfg: config_mod.Config, knee: Knobs) -> list[Measurement]:
    """The check's own trial (a full-fidelity trial of the knee, measured now) as the end-to-end trial the walk
    asks for at the knee's workers, or as the prefetch stage's trial of the knee's factor when it is not the first
    listed."""
    m = outcome.measurement
    if m is None or m.status != "ok" or outcome.status == "other_machine":
        return []
    first = cfg.search.prefetch_factor[0]
    stage = Stage.end_to_end if knee.num_workers == 0 or knee.prefetch_factor == first else Stage.prefetch
    return [
        dataclasses.replace(
            m,
            stage=stage,
            params={**m.params, "extra": {}},
            warnings=[*(m.warnings or []), f"the check's own trial ({outcome.trial_dir}), recorded first"],
        )
    ]
