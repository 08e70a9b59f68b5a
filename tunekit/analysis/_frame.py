from __future__ import annotations

import dataclasses
from typing import Any

from tunekit.contract import KNOB_NAMES, Measurement
from tunekit.records import TrialRow

_SCALAR_TYPES = (int, float, str, bool, type(None))
_JOINED = ("rate_windows", "changes_result")
"""List fields written as one space-separated cell."""
_NESTED = frozenset(
    f.name
    for f in dataclasses.fields(Measurement)
    if str(f.type).startswith(("list", "dict")) and f.name not in _JOINED
)
"""Fields holding lists or mappings (windows, NVML, per rank): no column, null or not."""


def trials_frame(
    rows: list[TrialRow], extra: dict[int, dict[str, Any]] | None = None, user_knobs: dict[str, Any] | None = None
) -> Any:
    """A tidy pandas DataFrame, one row per trial: stage, mode, every knob (each user-defined knob of
    ``user_knobs``, config key to baseline, in a column named by its key), status, reason, every scalar field of the
    measurement (``Measurement.to_dict()``: ``rate`` in ``unit``/s, ``rate_windows`` as one string), and any
    ``extra`` columns given per trial number (verdicts, cost)."""
    import pandas as pd

    records = []
    for row in sorted(rows, key=lambda r: r.number):
        knobs = row.knobs.to_dict()
        chosen = knobs.pop("extra")
        rec: dict[str, Any] = {
            "number": row.number,
            "stage": row.stage.value,
            "mode": row.mode.value,
            **knobs,
            **{key: chosen.get(key, base) for key, base in (user_knobs or {}).items()},
            "non_blocking": row.knobs.non_blocking,
            "status": row.status,
            "reason": row.reason,
        }
        held = row.measurement.held
        for key, value in row.measurement.to_dict().items():
            if (
                key in rec
                or key in _NESTED
                or key == "version"
                or (held is not None and key not in held and key not in row.measurement.other)
            ):
                continue
            if key == "rate_windows":
                rec[key] = None if value is None else " ".join(f"{v:.2f}" for v in value)
            elif key == "changes_result":  # the user-defined knobs set that may change the training result
                rec[key] = " ".join(value or []) or None
            elif isinstance(value, _SCALAR_TYPES):
                rec[key] = value
        rec.setdefault("unit", row.unit)  # what rate counts, in every run (older files did not always record it)
        rec.update((extra or {}).get(row.number, {}))
        records.append(rec)
    columns = ["number", "stage", "mode", *KNOB_NAMES, *(user_knobs or {}), "non_blocking", "status", "reason"]
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=columns)  # a header, at least
    if "prefetch_factor" in frame:
        frame["prefetch_factor"] = frame["prefetch_factor"].astype("Int64")  # integers with gaps, not floats
    return frame
