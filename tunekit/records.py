"""Finished trials as the analysis, the plan and the report see them: one typed row per trial.

The bottom of the read side: built from measurements (contract.Measurement), imported by every stage above.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tunekit.contract import Knobs, Measurement, Mode, Stage

__all__ = ["TrialRow", "rows_from_measurements", "compute_ceiling"]


@dataclass(frozen=True)
class TrialRow:
    """One finished trial: its stage, mode, knobs and how it ended, with the figures every rule reads."""

    number: int
    stage: Stage
    mode: Mode
    knobs: Knobs
    status: str
    measurement: Measurement = field(compare=False, repr=False)
    """The whole measurement, for the figures only the report and the diagnosis read."""
    reason: str = ""
    rate: float = 0.0
    """Throughput (``unit``/s) over the kept windows (rules.window_rate); 0 for a trial that was not measured."""
    noise_cv: float = 0.0
    """Coefficient of variation of the trial's window throughputs."""
    headroom: float | None = None
    """Share of memory left free at the peak (device memory on a GPU, host memory on the CPU)."""
    compile_s: float = 0.0
    run: int = 0
    """0 for a config's first measurement, k for its k-th repeat (``Measurement.run``)."""
    interval: float | None = field(default=None, compare=False)
    """Relative half-width of the rate's 95 % interval: the trial's windows' (``rate_interval``) as measured; once
    read by the decisions (``analysis.pooled``), that of the config's mean rate with the run-to-run spread in it
    (``rules.mean_interval``)."""
    window_interval: float | None = field(default=None, compare=False)
    """The windows' own 95 % half-width (``rate_interval``; for pooled runs, theirs combined): what one trial's
    windows vary by, without the runs' spread."""
    runs: tuple[float, ...] = field(default=(), compare=False)
    """The rate of each run pooled into this row (``analysis.pooled``); empty for a single trial."""
    blocks: tuple[int, ...] = field(default=(), compare=False)
    """The run index (``run``) of each of ``runs``: the block it ran in, where a paired comparison meets it."""
    collapsed: tuple[tuple[int, float], ...] = field(default=(), compare=False)
    """Runs set aside as collapsed (``rules.collapsed``), as (run, rate): measured again, never pooled."""

    @property
    def by_run(self) -> dict[int, float]:
        """This config's rate in each block it ran in: its pooled runs, or this trial alone."""
        return dict(zip(self.blocks, self.runs, strict=True)) if self.runs else {self.run: self.rate}

    def __post_init__(self) -> None:
        # the words a file holds: a stage or mode no plan has (a typo, an edited file) is an error, not a row
        object.__setattr__(self, "stage", Stage(self.stage))
        object.__setattr__(self, "mode", Mode(self.mode))

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def unit(self) -> str:
        """What the throughput counts (``workload.unit``): samples unless the workload counts tokens, say."""
        return self.measurement.unit or "samples"

    @property
    def item(self) -> str:
        """One of ``unit``, for labels: ``sample``, ``token``."""
        return self.unit.removesuffix("s")

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two trials the same trial: stage, mode, knobs and run."""
        return (self.stage, self.mode, self.knobs, self.run)

    @property
    def asked_key(self) -> tuple[Any, ...] | None:
        """The trial the plan asked for, when the script ran other knobs (``Measurement.asked``): asked and run, it
        is not asked again."""
        asked = self.measurement.asked
        if not asked:
            return None
        return (self.stage, self.mode, Knobs.of(**{**self.knobs.to_dict(), **asked}), self.run)

    @classmethod
    def from_measurement(cls, m: Measurement) -> TrialRow:
        params = {k: v for k, v in m.params.items() if k in Knobs.__dataclass_fields__}
        return cls(
            number=m.number,
            stage=m.stage,
            mode=m.mode,
            knobs=Knobs.of(**params),
            status=m.status,
            reason=m.reason or "",
            rate=float(m.rate or 0.0) if m.status == "ok" else 0.0,
            noise_cv=float(m.noise_cv or 0.0),
            headroom=m.headroom,
            compile_s=float(m.compile_s or 0.0),
            run=int(m.run or 0),
            interval=m.rate_interval,
            window_interval=m.rate_interval,
            measurement=m,
        )


def rows_from_measurements(measurements: Iterable[Measurement | Mapping[str, Any]]) -> list[TrialRow]:
    """Rows of measurements, records or measurement.json dicts (read through ``Measurement.from_dict``)."""
    return [
        TrialRow.from_measurement(m if isinstance(m, Measurement) else Measurement.from_dict(m)) for m in measurements
    ]


def compute_ceiling(rows: Iterable[TrialRow], batch: int) -> TrialRow | None:
    """The completed compute ceiling (the model on a batch staged on the device) at ``batch``, or None."""
    return next((r for r in rows if r.ok and r.mode == Mode.compute and r.knobs.batch_size == batch), None)
