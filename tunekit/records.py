"""Finished trials as the analysis, the plan and the report see them: one typed row per trial.

The bottom of the read side: built from measurement.json dicts (contract.py), imported by every stage above.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tunekit.contract import Knobs

__all__ = ["TrialRow", "rows_from_measurements", "compute_ceiling"]


@dataclass(frozen=True)
class TrialRow:
    """One finished trial: its stage, mode, knobs and how it ended, with the figures every rule reads."""

    number: int
    stage: str
    mode: str
    knobs: Knobs
    status: str
    reason: str = ""
    rate: float = 0.0
    """Throughput (``unit``/s) over the kept windows (rules.window_rate); 0 for a trial that was not measured."""
    noise_cv: float = 0.0
    """Coefficient of variation of the trial's window throughputs."""
    headroom: float | None = None
    """Share of memory left free at the peak (device memory on a GPU, host memory on the CPU)."""
    compile_s: float = 0.0
    measurement: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The whole measurement.json, for the figures only the report and the diagnosis read."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def unit(self) -> str:
        """What the throughput counts (``workload.unit``): samples unless the workload counts tokens, say."""
        return str(self.measurement.get("unit") or "samples")

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two trials the same trial: stage, mode and knobs."""
        return (self.stage, self.mode, self.knobs)

    def figure(self, name: str, default: float | None = None) -> float | None:
        """A numeric field of the measurement as a float (``default`` when it is missing or null)."""
        value = self.measurement.get(name)
        return default if value is None else float(value)

    @classmethod
    def from_measurement(cls, m: dict[str, Any]) -> TrialRow:
        params = {k: v for k, v in (m.get("params") or {}).items() if k in Knobs.__dataclass_fields__}
        status = str(m.get("status"))
        return cls(
            number=int(m.get("number", -1)),
            stage=str(m.get("stage", "")),
            mode=str(m.get("mode", "train")),
            knobs=Knobs(**params),
            status=status,
            reason=str(m.get("reason") or ""),
            rate=float(m.get("samples_per_s") or 0.0) if status == "ok" else 0.0,
            noise_cv=float(m.get("noise_cv") or 0.0),
            headroom=m.get("headroom"),
            compile_s=float(m.get("compile_s") or 0.0),
            measurement=m,
        )


def rows_from_measurements(measurements: list[dict[str, Any]]) -> list[TrialRow]:
    return [TrialRow.from_measurement(m) for m in measurements]


def compute_ceiling(rows: Iterable[TrialRow], batch: int) -> TrialRow | None:
    """The completed compute ceiling (the model on a batch staged on the device) at ``batch``, or None."""
    return next((r for r in rows if r.ok and r.mode == "compute" and r.knobs.batch_size == batch), None)
