"""A measurement's checks and the records of trials without figures: what makes a record unusable as a measurement
(``measurement_problem``, ``REQUIRED_FIELDS``), a failed trial's record and a skipped one's."""

from __future__ import annotations

import math
from typing import Any

from tunekit.contract._measurement import STATUSES, Measurement
from tunekit.contract._spec import TrialSpec

__all__ = ["REQUIRED_FIELDS", "measurement_problem", "failed_measurement", "skipped_measurement"]

REQUIRED_FIELDS = ("rate", "rate_windows", "noise_cv", "step_time_s", "data_wait_frac", "headroom", "warmup_s")
"""The fields every completed measurement holds."""


def measurement_problem(m: Measurement, complete: bool = True) -> str | None:
    """What makes a record unusable as a measurement, or None: a completed one lacking a required field (with
    ``complete``: what a worker writes now; records of older runs may lack some), holding a non-finite or negative
    figure, or no positive rate (a worker's bug, or a study edited by hand); a failed one without a reason. The
    launcher checks what a worker wrote, the store what it reads back."""
    if m.status != "ok":
        return None if m.reason or not complete else "a failed measurement without a reason"
    for name in REQUIRED_FIELDS:
        value = getattr(m, name)
        if value is None:
            if complete or name == "rate":
                return f"it lacks {name}"
            continue
        values = value if isinstance(value, list) else [value]
        if any(not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 for v in values):
            return f"{name} = {value} is not a finite, non-negative figure"
    if m.rate <= 0:
        return f"rate = {m.rate} is not positive"
    return None


def failed_measurement(spec: TrialSpec, status: str, reason: str, **extra: Any) -> Measurement:
    """The measurement of a trial that ran and produced no numbers: a failed trial is data, with its reason.
    ``extra`` sets further fields (``exception``, ``failed_at``)."""
    assert status in STATUSES and status not in ("ok", "skipped"), status
    return _unmeasured(spec, status, reason, **extra)


def skipped_measurement(spec: TrialSpec, reason: str, bound: tuple[float, int] | None = None) -> Measurement:
    """The record of a trial the plan did not run, with the evidence that it could not be the knee (and the upper
    bound the plan inferred for it, with the trial that shows it, when there is one)."""
    extra = {"skip_bound": bound[0], "skip_bound_trial": bound[1]} if bound else {}
    return _unmeasured(spec, "skipped", reason, **extra)


def _unmeasured(spec: TrialSpec, status: str, reason: str, **extra: Any) -> Measurement:
    return Measurement(
        status=status,
        reason=reason,
        number=spec.number,
        stage=spec.stage,
        mode=spec.mode,
        run=spec.run,
        params=spec.knobs.to_dict(),
        **extra,
    )
