"""One job on several machine types: each type's knee, its rate with its 95 % interval, its items per hour and per
unit of money at its price, and the type that is cheapest per item, with whether the intervals settle it.

Each type is one sweep of the job (a run folder, or a run of a shared database), whose knee is the sweep's own
(:func:`select`, as its report gives it) and whose interval is the knee's own (``TrialRow.interval``: its windows',
or its repeated runs'). A price is exact, so the interval of items per unit of money is the rate's, carried through.
Two sweeps of one machine type are refused rather than pooled: a type's knee is one sweep's decision, and the nodes
of one type share one sweep (``--storage``). Sweeps of different jobs are refused too: their rates count different
work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tunekit import rules
from tunekit.analysis._knee import Choice
from tunekit.config import Config
from tunekit.errors import UsageError
from tunekit.records import TrialRow

__all__ = ["TypeRun", "TypeFigures", "Cheapest", "Comparison", "compare", "job_difference"]

_HOUR_S = 3600.0


@dataclass(frozen=True)
class TypeRun:
    """One sweep of the job on one machine type, as the comparison reads it."""

    source: str
    """The type's name: its run folder's name (the folder as given where two share a name), or its run's name in a
    database."""
    config: Config
    """The run's resolved config (what its study records)."""
    choice: Choice
    """The sweep's selection: its knee, or why it has none."""
    machine: Mapping[str, Any]
    """The machine it ran on (``env.machine_fingerprint``): what makes it a type."""
    machine_text: str
    """The machine in a few words (``env.describe_machine``)."""
    per_hour: float | None = None
    """The type's price per hour; None: not priced."""
    priced_by: str = ""
    """Where the price comes from: ``cost.per_hour`` (the run's config) or ``--per-hour``; "" without one."""
    disturbed: tuple[str, ...] = ()
    """What says the sweep's figures are disturbed (its report's first lines), said beside its figures."""
    where: str = ""
    """Where the run is kept: its folder as given, or its database's URL (password masked)."""

    @property
    def named(self) -> str:
        """The run as the user gave it, for the lines that refuse it."""
        return self.where or self.source


@dataclass(frozen=True)
class TypeFigures:
    """What one machine type gives the job: its knee, rate and, with a price, items per unit of money."""

    source: str
    machine: Mapping[str, Any]
    machine_text: str
    knee: TrialRow | None
    reason: str
    """Why the knee is what it is, or why there is none (the sweep's own words)."""
    unit: str
    per_hour: float | None
    priced_by: str
    disturbed: tuple[str, ...] = ()
    where: str = ""

    @property
    def rate(self) -> float | None:
        """The knee's rate, ``unit``/s; None without a knee."""
        return self.knee.rate if self.knee is not None and self.knee.rate > 0 else None

    @property
    def interval(self) -> float | None:
        """Relative half-width of the knee rate's 95 % interval; None when unknown (no knee, under two windows)."""
        half = self.knee.interval if self.knee is not None else None
        return half if half is not None and math.isfinite(half) else None

    @property
    def rate_range(self) -> tuple[float, float] | None:
        return _spanned(self.rate, self.interval)

    @property
    def per_hour_items(self) -> float | None:
        """Items of ``unit`` the knee processes in an hour."""
        return None if self.rate is None else self.rate * _HOUR_S

    @property
    def per_money(self) -> float | None:
        """Items of ``unit`` per unit of money at ``per_hour``; None without a price or a rate."""
        if self.rate is None or not self.per_hour:
            return None
        return self.rate * _HOUR_S / self.per_hour

    @property
    def per_money_range(self) -> tuple[float, float] | None:
        """The 95 % interval of :attr:`per_money`: the rate's, the price being exact."""
        return _spanned(self.per_money, self.interval)


@dataclass(frozen=True)
class Cheapest:
    """The type that gives the most items per unit of money, against the next."""

    type: TypeFigures
    next: TypeFigures | None
    """The next cheapest priced type; None when only one type is priced."""
    ratio: float | None
    """Items per unit of money of ``type`` over ``next``'s."""
    overlap: bool | None
    """Whether the two types' 95 % intervals of items per unit of money overlap; None when either is unknown."""

    @property
    def settled(self) -> bool:
        """The cheaper type is cheaper beyond the noise of the two measurements: their intervals do not overlap."""
        return self.next is not None and self.overlap is False


@dataclass(frozen=True)
class Comparison:
    """The machine types of one job, in the order given, and the cheapest per item."""

    name: str
    unit: str
    types: tuple[TypeFigures, ...]
    cheapest: Cheapest | None
    """None when no type has both a knee and a price."""

    @property
    def item(self) -> str:
        return self.unit.removesuffix("s")

    @property
    def notes(self) -> tuple[str, ...]:
        """What a type's figures cannot be trusted for, then what a type leaves out, one sentence each: disturbed
        figures, no knee, no price."""
        out = [f"{t.source}: {line}" for t in self.types for line in t.disturbed]
        out += [f"{t.source}: no knee, so no figures ({t.reason})" for t in self.types if t.knee is None]
        out += [
            f"{t.source}: not priced (no cost.per_hour in its config), so its {self.unit} per unit of money are left "
            f"out; give --per-hour {t.source}=PRICE"
            for t in self.types
            if t.knee is not None and not t.per_hour
        ]
        return tuple(out)


def compare(runs: Sequence[TypeRun]) -> Comparison:
    """The types of one job compared (see the module docstring).

    Raises:
        UsageError: no run; two runs of different jobs, or of one machine type (each names both runs).
    """
    if not runs:
        raise UsageError("compare: no run given; give a run folder per machine type")
    _one_job(runs)
    _distinct_types(runs)
    first = runs[0].config
    types = tuple(
        TypeFigures(
            source=r.source,
            machine=r.machine,
            machine_text=r.machine_text,
            knee=r.choice.knee,
            reason=r.choice.reason,
            unit=first.unit,
            per_hour=r.per_hour,
            priced_by=r.priced_by if r.per_hour else "",
            disturbed=r.disturbed,
            where=r.where,
        )
        for r in runs
    )
    return Comparison(first.name, first.unit, types, _cheapest(types))


def _cheapest(types: Sequence[TypeFigures]) -> Cheapest | None:
    priced = sorted((t for t in types if t.per_money is not None), key=lambda t: -(t.per_money or 0.0))
    if not priced:
        return None
    best = priced[0]
    if len(priced) == 1:
        return Cheapest(best, None, None, None)
    after = priced[1]
    ranges = best.per_money_range, after.per_money_range
    overlap = None if None in ranges else ranges[0][0] <= ranges[1][1]  # type: ignore[index]
    return Cheapest(best, after, (best.per_money or 0.0) / (after.per_money or 1.0), overlap)


def _spanned(value: float | None, half: float | None) -> tuple[float, float] | None:
    if value is None or half is None:
        return None
    return value * max(0.0, 1.0 - half), value * (1.0 + half)


def _one_job(runs: Sequence[TypeRun]) -> None:
    first = runs[0]
    for other in runs[1:]:
        differs = job_difference(first.config, other.config)
        if differs:
            raise UsageError(
                f"compare: {first.named} and {other.named} are different jobs ({differs}): their rates count "
                "different work; compare sweeps of one job, one per machine type"
            )


def _distinct_types(runs: Sequence[TypeRun]) -> None:
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            hardware, _ = rules.machine_changes(a.machine, b.machine)
            if not hardware:
                raise UsageError(
                    f"compare: {a.named} and {b.named} are one machine type ({a.machine_text}); give one sweep "
                    "per type (the nodes of one type share one sweep through --storage)"
                )


def job_difference(a: Config, b: Config) -> str:
    """What makes two configs different jobs, as ``key: a against b`` (the first such key), or "" for one job.

    A job is its work and what its rate counts: the workload section (or the script's command and count), the unit
    and the target effective batch. The rest may differ per machine type: the device, the search, the trial
    settings, the launch, the price."""
    one, two = _job(a), _job(b)
    for key in sorted(one.keys() | two.keys()):
        if one.get(key) != two.get(key):
            return f"{key}: {one.get(key)!r} against {two.get(key)!r}"
    return ""


def _job(cfg: Config) -> dict[str, Any]:
    data = cfg.to_dict()
    job: dict[str, Any] = {"unit": cfg.unit, "search.target_effective_batch": cfg.search.target_effective_batch}
    if cfg.script is not None:
        job.update({"script.command": data["script"]["command"], "script.count": cfg.script.count})
    else:
        job.update(_flat("workload", data.get("workload") or {}))
    return job


def _flat(prefix: str, data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(f"{prefix}.{key}", value))
        else:
            out[f"{prefix}.{key}"] = value
    return out
