"""From finished trials to decisions: the typed trial rows, the knee, the batch choice and the trials table.

Selection (DESIGN.md): among completed end-to-end trials with headroom >= min_headroom, ordered by cost
(workers, then prefetch, pin_memory, compile time, then batch and accumulation), the knee is the cheapest config
whose throughput is not distinguishably below the best: its shortfall is within max(tolerance, the run's noise).
The run's noise is the median window CV of the upper half of the candidates (by throughput), where the knee and the
best compete: once that half holds three trials or more, one erratic trial widens the band neither for itself nor
for the rest (with two, the median is their mean) (on an H200 a 12-worker trial
with 55 % window noise at 54 % of the best was once "within noise"), and the steady, data-starved low end does not
narrow it.
Too few points, or none completed, gives no recommendation and a sentence why — never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

from tunekit.config import Selection
from tunekit.contract import Knobs

__all__ = ["TrialRow", "Knee", "select_knee", "choose_batch", "rows_from_measurements", "trials_frame",
           "cost_key", "describe_knobs", "run_noise", "defaults_trial", "MIN_POINTS"]

MIN_POINTS = 2
"""Completed candidates a knee needs: with one point there is nothing to compare."""


@dataclass(frozen=True)
class TrialRow:
    """One finished trial, as the analysis sees it."""

    number: int
    stage: str
    mode: str
    knobs: Knobs
    status: str
    reason: str = ""
    samples_per_s: float | None = None
    noise_cv: float = 0.0
    headroom: float | None = None
    compile_s: float = 0.0
    measurement: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.samples_per_s is not None

    @property
    def rate(self) -> float:
        """samples/s as a number (0 for a trial without one)."""
        return float(self.samples_per_s or 0.0)

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.stage, self.mode, *self.knobs.to_dict().values())

    @classmethod
    def from_measurement(cls, m: dict[str, Any]) -> TrialRow:
        params = {k: v for k, v in (m.get("params") or {}).items() if k in Knobs.__dataclass_fields__}
        return cls(
            number=int(m.get("number", -1)),
            stage=str(m.get("stage", "")),
            mode=str(m.get("mode", "train")),
            knobs=Knobs(**params),
            status=str(m.get("status")),
            reason=str(m.get("reason") or ""),
            samples_per_s=m.get("samples_per_s"),
            noise_cv=float(m.get("noise_cv") or 0.0),
            headroom=m.get("headroom"),
            compile_s=float(m.get("compile_s") or 0.0),
            measurement=m,
        )


def rows_from_measurements(measurements: list[dict[str, Any]]) -> list[TrialRow]:
    return [TrialRow.from_measurement(m) for m in measurements]


def cost_key(row: TrialRow) -> tuple[Any, ...]:
    """The cost order: fewer workers, then less prefetch, no pinning, less compile time, smaller batch."""
    k = row.knobs
    return (k.num_workers, k.prefetch_factor or 0, k.pin_memory, round(row.compile_s, 1), k.batch_size,
            k.grad_accum)


@dataclass(frozen=True)
class Knee:
    """The selection's result. ``knee`` is None when there is no recommendation; ``reason`` says why either way."""

    knee: TrialRow | None
    best: TrialRow | None
    ratio: float | None
    threshold: float | None
    reason: str
    candidates: tuple[TrialRow, ...] = ()
    excluded_for_headroom: tuple[TrialRow, ...] = ()


def _fits(row: TrialRow, selection: Selection) -> bool:
    return row.headroom is None or row.headroom >= selection.min_headroom


def select_knee(rows: list[TrialRow], selection: Selection) -> Knee:
    """The cheapest config within noise of the best (see the module docstring)."""
    completed = [r for r in rows if r.ok and r.mode == "train"]
    fitting = [r for r in completed if _fits(r, selection)]
    too_tight = tuple(r for r in completed if not _fits(r, selection))
    if not completed:
        failed = [r for r in rows if not r.ok]
        why = f"all {len(failed)} trials failed" if failed else "no end-to-end trial has run"
        return Knee(None, None, None, None, f"No recommendation: {why}.")
    if len(fitting) < MIN_POINTS:
        extra = (f" ({len(too_tight)} more left less than {selection.min_headroom:.0%} memory headroom)"
                 if too_tight else "")
        return Knee(None, max(fitting, key=lambda r: r.rate) if fitting else None, None, None,
                    f"No recommendation: only {len(fitting)} config completed within the headroom limit{extra}; "
                    f"a knee needs at least {MIN_POINTS} to compare.", tuple(fitting), too_tight)
    best = max(fitting, key=lambda r: r.rate)
    noise = run_noise(fitting)
    allowed = max(selection.tolerance, noise)
    knee = min((r for r in fitting if r.rate >= best.rate * (1.0 - allowed)), key=cost_key)
    ratio = knee.rate / best.rate
    if knee is best:
        reason = (f"The best config is also the cheapest within {allowed:.1%} of it "
                  f"({best.rate:.1f} samples/s).")
    else:
        reason = (f"Knee: {describe_knobs(knee.knobs)} reaches {ratio:.1%} of the best ({knee.rate:.1f} vs "
                  f"{best.rate:.1f} samples/s); the shortfall is within max(tolerance {selection.tolerance:.1%}, "
                  f"the run's median window noise {noise:.1%}), and it is cheaper than "
                  f"{describe_knobs(best.knobs)}.")
    return Knee(knee, best, ratio, allowed, reason, tuple(fitting), too_tight)


def choose_batch(compute_rows: list[TrialRow], selection: Selection) -> int | None:
    """The batch for the end-to-end stages: the smallest batch whose compute-ceiling throughput is within
    max(tolerance, noise) of the best batch that fits the headroom limit."""
    fitting = [r for r in compute_rows if r.ok and _fits(r, selection)]
    if not fitting:
        return None
    best = max(fitting, key=lambda r: r.rate)
    allowed = max(selection.tolerance, run_noise(fitting))
    within = [r for r in fitting if r.rate >= best.rate * (1.0 - allowed)]
    return min(r.knobs.batch_size for r in within)


def run_noise(rows: list[TrialRow]) -> float:
    """The noise of a set of comparable trials: the median window CV of those at or above their median
    throughput (0 for none)."""
    if not rows:
        return 0.0
    middle = median(r.rate for r in rows)
    return float(median(r.noise_cv for r in rows if r.rate >= middle))


def defaults_trial(rows: list[TrialRow], knee: TrialRow | None) -> TrialRow | None:
    """The completed PyTorch-defaults trial (0 workers, no pinning, eager): at the knee's batch and accumulation
    when there is one, else the end-to-end one (the batch stage can move the knee off the swept batch)."""
    found = [r for r in rows if r.ok and r.mode == "train" and r.knobs.num_workers == 0 and not r.knobs.pin_memory
             and r.knobs.compile == "none"]
    if knee is not None:
        same = [r for r in found if (r.knobs.batch_size, r.knobs.grad_accum)
                == (knee.knobs.batch_size, knee.knobs.grad_accum)]
        if same:
            return same[0]
    found.sort(key=lambda r: (r.stage != "end_to_end", r.number))
    return found[0] if found else None


def describe_knobs(k: Knobs) -> str:
    parts = [f"{k.num_workers} workers"]
    if k.num_workers:
        parts.append(f"prefetch {k.prefetch_factor}")
    parts.append("pinned" if k.pin_memory else "not pinned")
    parts.append(f"batch {k.batch_size}")
    if k.grad_accum > 1:
        parts.append(f"accumulation {k.grad_accum}")
    if k.compile != "none":
        parts.append(f"compile {k.compile}")
    return ", ".join(parts)



_SCALAR_TYPES = (int, float, str, bool, type(None))


def trials_frame(rows: list[TrialRow], extra: dict[int, dict[str, Any]] | None = None) -> Any:
    """A tidy pandas DataFrame, one row per trial: stage, mode, every knob, status, reason, every scalar field,
    and any ``extra`` columns given per trial number (verdicts, cost)."""
    import pandas as pd

    records = []
    for row in sorted(rows, key=lambda r: r.number):
        rec: dict[str, Any] = {"number": row.number, "stage": row.stage, "mode": row.mode,
                               **row.knobs.to_dict(), "non_blocking": row.knobs.non_blocking,
                               "status": row.status, "reason": row.reason}
        for key, value in row.measurement.items():
            if key in rec or key == "params":
                continue
            if isinstance(value, _SCALAR_TYPES):
                rec[key] = value
            elif key == "samples_per_s_windows":
                rec[key] = " ".join(f"{v:.2f}" for v in value)
        rec.update((extra or {}).get(row.number, {}))
        records.append(rec)
    frame = pd.DataFrame.from_records(records)
    if "prefetch_factor" in frame:
        frame["prefetch_factor"] = frame["prefetch_factor"].astype("Int64")  # integers with gaps, not floats
    return frame
