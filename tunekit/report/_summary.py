from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from tunekit import rules
from tunekit.analysis import Choice, Evidence, defaults_trial, pooled, select, select_knee, single_gpu_twin
from tunekit.command import set_on_loader
from tunekit.config import Config, ExtraKnob, Selection, extra_knobs
from tunekit.contract import Measurement, Mode, Stage
from tunekit.diagnosis import Verdict, run_verdicts, trial_verdicts
from tunekit.env import datasheet_flops, machine_fingerprint, matmul_peaks
from tunekit.records import TrialRow, compute_ceiling


class Peak(NamedTuple):
    """The matmul peak a trial's share is of: the trial that measured it, the figure, its precision and the
    datasheet's figure for the device beside it (None where the device is not listed)."""

    trial: int
    flops: float
    precision: str
    datasheet_flops: float | None


class Scaling(NamedTuple):
    """A multi-rank knee against its per-rank config on one GPU, measured in the same sweep."""

    ranks: int
    single: TrialRow
    efficiency: float
    """Knee throughput over ranks x the one-GPU trial's."""


@dataclass(frozen=True)
class RunSummary:
    """What a run found, computed once: the knee, the PyTorch-defaults baseline, the verdicts. The writers only
    format it."""

    name: str
    strategy: str
    choice: Choice
    defaults: TrialRow | None
    rows: tuple[TrialRow, ...]
    device: str | None
    versions: dict[str, Any]
    date: str
    min_headroom: float
    tolerance: float = 0.03
    """selection.tolerance."""
    unit: str = "samples"
    """What throughput counts (workload.unit)."""
    counted: bool = False
    """The job counts its own items (``workload.count``): tokens, say, rather than the batch's samples."""
    stop_reason: str = ""
    verdicts: tuple[Verdict, ...] = ()
    trial_verdicts: dict[int, Verdict] = field(default_factory=dict)
    per_hour: float | None = None
    warnings: tuple[str, ...] = ()
    scaling: Scaling | None = None
    extra_knobs: tuple[ExtraKnob, ...] = ()
    """The user-defined knobs of search.extra."""
    knee_before_extra: TrialRow | None = None
    """The knee of the stages before the user-defined knobs: what they are measured against."""
    script_baseline: TrialRow | None = None
    """Script mode: the script run with its own settings (stage baseline)."""
    script_command: tuple[str, ...] = ()
    """Script mode: the command with the knee's knobs filled in."""
    set_on_loader: dict[str, Any] = field(default_factory=dict)
    """Script mode: the knee's settings tunekit set on the training DataLoader (no placeholder for them)."""
    real_epoch_items: int | None = None
    """Script mode: ``script.epoch_items``, the items of the script's real epoch."""
    loader_site: dict[str, str] = field(default_factory=dict)
    """Script mode: where the script builds its training DataLoader, the line to change for ``set_on_loader``
    (``built_at``, relative to the script's folder when inside it) and the package that builds it for the script
    (``built_by``), as the knee's trial found them."""
    machine: dict[str, Any] = field(default_factory=dict)
    """The machine the knee was measured on (env.machine_fingerprint: the run's snapshot and the knee's own facts),
    which recommended.yaml records and ``tunekit check`` compares."""
    peaks: tuple[dict[str, Any], ...] = ()
    """Every matmul probe of the run (env.matmul_peaks: env.json's ``matmul_peak``)."""
    remeasure: bool = True
    """``trial.remeasure_disturbed``: a resume measures the disturbed trials again."""

    def flop_share(self, row: TrialRow | None) -> float | None:
        """Model FLOP utilisation of a trial: its throughput per rank x FLOPs per item over its device's measured
        matmul peak (rules.flop_share); None without a count or a peak."""
        return None if row is None else rules.flop_share(row, self.rows)

    def peak(self, row: TrialRow | None) -> Peak | None:
        """The measured matmul peak ``row``'s share is of, with the datasheet's figure beside it."""
        found = None if row is None else rules.peak_trial(self.rows, row)
        if found is None:
            return None
        m = found.measurement
        return Peak(
            found.number,
            float(m.matmul_peak_flops or 0.0),
            m.matmul_peak_precision or "",
            datasheet_flops(m.device_name, m.matmul_peak_precision),
        )

    @property
    def disturbances(self) -> tuple[str, ...]:
        """What says the figures are disturbed, said first wherever the run is reported: a noise band wider than
        rules.DISTURBED_BAND, trials other processes kept the CPUs busy for, trials above their own compute
        ceiling."""
        out = []
        band = self.choice.band
        if band is not None and band > rules.DISTURBED_BAND:
            again = [r.number for r in self.rows if rules.disturbed(r)] if self.remeasure else []
            resumed = (
                f"the same command alone resumes the run, measuring again trial(s) {again}, whose own figures "
                "were disturbed, and keeping the rest"
                if again
                else "the same command alone resumes the run and re-reads these figures"
            )
            out.append(
                f"the figures are disturbed: the run's noise band is {band:.1%}, over {rules.DISTURBED_BAND:.0%}"
                ", so configs that far apart cannot be told apart and the pick is uncertain; rerun on a quiet "
                f"machine with --no-resume ({resumed})"
            )
        busy = [r for r in self.rows if r.ok and rules.busy_host(r)]
        if busy:
            worst = max(busy, key=lambda r: r.measurement.other_cpu_cores or 0.0)
            out.append(
                f"other processes kept the CPUs busy during {len(busy)} of the trials (up to "
                f"{worst.measurement.other_cpu_cores:.1f} of {worst.measurement.cpu_count} usable CPUs, "
                f"trial {worst.number}): their figures are disturbed"
                + (", and the same command measures them again (it resumes the run)" if self.remeasure else "")
            )
        for row in self.rows:
            ceiling = compute_ceiling(self.rows, row.knobs.batch_size) if row.ok and row.mode == Mode.train else None
            if (
                ceiling is not None
                and row.knobs.ranks == 1
                and row.rate
                > ceiling.rate * (1 + rules.trial_margin(Selection(tolerance=self.tolerance), row, ceiling))
            ):
                out.append(
                    f"trial {row.number} ran at {row.rate / ceiling.rate:.0%} of its own compute ceiling "
                    f"(trial {ceiling.number}): a pipeline cannot outrun its model on a ready batch, so one "
                    "of the two measurements was disturbed"
                )
        return tuple(out)

    def gain(self, against: TrialRow | None) -> rules.Ratio | None:
        """The knee's rate over ``against``'s at 95 % (``analysis.Evidence.ratio``: paired over the blocks of
        alternated runs both ran in, the run that chose the knee left out where others exist); None without
        either."""
        knee = self.choice.knee
        if knee is None or against is None or not against.ok or not against.rate:
            return None
        if knee.key == against.key:
            return None
        return self.evidence.ratio(knee, against)

    @cached_property
    def evidence(self) -> Evidence:
        """The run's evidence as the choice read it (its trials pooled, ``analysis.Evidence``), made once."""
        return Evidence.of(pooled(self.rows))

    @property
    def speedup_vs_script(self) -> float | None:
        """The knee over the script's own settings (the gain's figure)."""
        gain = self.gain(self.script_baseline)
        return gain.value if gain else None

    @property
    def failed(self) -> int:
        return sum(1 for r in self.rows if not r.ok and r.status != "skipped")

    @property
    def skipped(self) -> int:
        return sum(1 for r in self.rows if r.status == "skipped")

    def per_money(self, rate: float | None) -> float | None:
        """Items of ``unit`` per unit of money at ``cost.per_hour`` for a rate in ``unit``/s, or None without a
        price."""
        return None if not self.per_hour or rate is None else rate * 3600 / self.per_hour

    @property
    def speedup_vs_defaults(self) -> float | None:
        gain = self.gain(self.defaults)
        return gain.value if gain else None

    def gain_text(self, against: TrialRow | None) -> str:
        """The knee's gain over ``against`` with its 95 % interval and what it rests on ("1.90x, 1.80-2.01x at
        95 %, paired over 2 blocks"); "" without one."""
        gain = self.gain(against)
        if gain is None:
            return ""
        return f"{gain.value:.2f}x, {gain.low:.2f}-{gain.high:.2f}x at 95 % ({gain.basis()})"


def summarize(
    cfg: Config,
    rows: list[TrialRow],
    *,
    strategy: str,
    stop_reason: str = "",
    date: str | None = None,
    env: dict[str, Any] | None = None,
    warnings: tuple[str, ...] = (),
) -> RunSummary:
    """Select the knee, find the baseline and diagnose the run."""
    choice = select(cfg, rows)
    decided = pooled(rows)  # each config's repeats as one row, as the choice read them
    ref = choice.knee or choice.best or next((r for r in rows if r.ok), None)
    m = ref.measurement if ref else None
    per_trial = trial_verdicts(rows, cfg.selection)
    knobs = tuple(extra_knobs(cfg))
    return RunSummary(
        name=cfg.name,
        strategy=strategy,
        choice=choice,
        defaults=defaults_trial(decided, choice.knee) if choice.knee else None,
        rows=tuple(rows),
        device=m.device_name if m else None,
        versions=(m.versions if m else None) or {},
        machine=_machine(env, m),
        date=date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        min_headroom=cfg.selection.min_headroom,
        tolerance=cfg.selection.tolerance,
        unit=cfg.unit,
        counted=cfg.count is not None,
        stop_reason=stop_reason,
        verdicts=tuple(run_verdicts(rows, choice.knee, per_trial, cfg.selection, env)),
        trial_verdicts=per_trial,
        per_hour=cfg.cost.per_hour,
        warnings=tuple(warnings),
        scaling=_scaling(rows, choice.knee),
        extra_knobs=knobs,
        knee_before_extra=_knee_before_extra(cfg, decided) if knobs else None,
        **_script_fields(cfg, decided, choice.knee),
        peaks=tuple(matmul_peaks(rows)),
        remeasure=cfg.trial.remeasure_disturbed,
    )


def _machine(env: dict[str, Any] | None, m: Measurement | None) -> dict[str, Any]:
    """The machine the run was measured on (recommended.yaml's ``machine``), from a trial's record and env.json."""
    if m is None:
        return {}
    return machine_fingerprint(
        env, device=m.device_name, cpus=m.cpu_count, memory_bytes=m.host_mem_total_bytes, versions=m.versions
    )


def _knee_before_extra(cfg: Config, decided: list[TrialRow]) -> TrialRow | None:
    """The knee before the user's own knobs were tried (the stages up to ``extra``)."""
    return select_knee([r for r in decided if r.stage in rules.knee_stages(Stage.extra)], cfg.selection).knee


def _script_fields(cfg: Config, rows: list[TrialRow], knee: TrialRow | None) -> dict[str, Any]:
    """Script mode: the script's own baseline, the command with the knee filled in, what is set on its loader."""
    if cfg.script is None:
        return {}
    from tunekit.contract import TrialSpec
    from tunekit.launch import script_command

    base = next((r for r in rows if r.stage == Stage.baseline), None)
    if knee is None:
        return {"script_baseline": base, "real_epoch_items": cfg.script.epoch_items}
    spec = TrialSpec(number=knee.number, stage=Stage.end_to_end, mode=knee.mode, knobs=knee.knobs, config=cfg.to_dict())
    loader = knee.measurement.loader_measured or {}
    setting = {k: loader.get(k, getattr(knee.knobs, k)) for k in set_on_loader(cfg.script.command)}
    if knee.stage == Stage.baseline:  # keep your settings: the loader stays as the script builds it
        setting = {}
    if setting and loader.get("persistent_workers"):  # the trial kept its workers across epochs: so must the script
        setting["persistent_workers"] = True
    own = (base.measurement.loader_measured or {}) if base is not None and base.ok else {}
    # a value the script already has as its own default needs no flag
    same = {k for k in ("num_workers", "batch_size") if k in own and own[k] == getattr(knee.knobs, k)}
    command = script_command(spec, trial=False, leave_out=same)
    return {
        "script_baseline": base,
        "script_command": tuple(command),
        "set_on_loader": setting,
        "real_epoch_items": cfg.script.epoch_items,
        "loader_site": _site(loader, cfg.script.cwd),
    }


def where_built(site: dict[str, str]) -> str:
    """The words that name where to set what the script has no flag for (``RunSummary.loader_site``): its own line,
    or the package that builds the loader for it, whose arguments set them."""
    at, by = site.get("built_at"), site.get("built_by")
    if by:
        return f" ({by} builds it" + (f", called from {at}" if at else "") + ": set them through its arguments)"
    return f" (the script builds it at {at})" if at else ""


def _site(loader: dict[str, Any], folder: str | None) -> dict[str, str]:
    """Where the script builds its training loader, its file relative to ``folder`` when it lies inside."""
    site = {k: loader[k] for k in ("built_at", "built_by") if loader.get(k)}
    if "built_at" in site and folder:
        path, _, line = site["built_at"].rpartition(":")
        relative = os.path.relpath(path, folder)
        if not relative.startswith(os.pardir):
            site["built_at"] = f"{relative}:{line}"
    return site


def _scaling(rows: list[TrialRow], knee: TrialRow | None) -> Scaling | None:
    single = single_gpu_twin(rows, knee) if knee is not None else None
    efficiency = rules.scaling_efficiency(knee, single) if knee is not None and single is not None else None
    return None if single is None or efficiency is None else Scaling(knee.knobs.ranks, single, efficiency)
