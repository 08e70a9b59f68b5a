"""What the meter reads and records: its settings, one timed window, the reading of a whole measurement, and the
figures made of it (:func:`summarise`, :func:`whole_epoch`); how the ranks of one trial decide together (``Ranks``).
The meter itself, which fills a :class:`Reading`, is ``_meter.Meter``."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

from tunekit import rules
from tunekit.config import TrialSettings
from tunekit.worker.meter._monitor import CpuUse

__all__ = [
    "MeterSettings",
    "OneProcess",
    "Ranks",
    "Reading",
    "SourceEnded",
    "Window",
    "summarise",
    "whole_epoch",
    "BOUNDARY_WAIT",
    "FEW_BOUNDARIES",
]

FEW_BOUNDARIES = 2
"""Epoch-aware: the boundaries a trial waits for (when an epoch ends soon enough). The first pays what only a
script's first epoch end does (its evaluation's first run: cuDNN autotuning for new shapes, its loader's first
workers); with two or more, it is left out of ``boundary_s``."""

BOUNDARY_WAIT = 3.0
"""Epoch-aware: the windows go on to see a boundary only when it comes within this many times the windows' time so
far (and ``boundary_wait_s``): a trial at most about four times its measurement, so a slow config, or an epoch of
minutes, is not waited for (its figure is then the steady rate, and no boundary is recorded)."""


class SourceEnded(RuntimeError):
    """The batches ran out before the measurement was complete."""


class Ranks(Protocol):
    """How the processes of one trial decide together."""

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is True on any."""
        ...

    def max(self, value: int) -> int:
        """The largest ``value`` of the processes, on every process."""
        ...

    def mark(self, batch: int, received: bool) -> None:
        """Where this process is: asking for its ``batch``-th batch, or holding it (a hung rank is named by it)."""
        ...


class OneProcess:
    """A trial of one process decides alone."""

    def any(self, flag: bool) -> bool:
        return flag

    def max(self, value: int) -> int:
        return value

    def mark(self, batch: int, received: bool) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class MeterSettings:
    """How long to warm up and measure, and the pipeline's shape."""

    window_s: float
    """Shortest window, in seconds (also the warm-up steps' time cap)."""
    measure_windows: int
    """Windows to measure (without ``precision``: exactly these; with it: at least these)."""
    max_windows: int
    """Most windows with ``precision``."""
    precision: float | None
    """Target relative half-width of the rate's 95 % interval; None: a fixed count of windows."""
    warmup_steps: int
    """Optimizer steps of warm-up after the first (at most; they end after ``window_s``)."""
    compiling: bool = False
    """The step is compiled: at least 3 warm-up steps (``reduce-overhead`` records CUDA graphs on the 2nd and 3rd)."""
    grad_accum: int = 1
    """Micro-batches (batches handed out) per optimizer step."""
    round_batches: int = 1
    """A loader round (its worker count): windows end on a multiple of it."""
    epoch_batches: int | None = None
    """The source's batches per epoch; None when it has no length (or its epochs never end in a trial)."""
    fill: int = 0
    """Most batches the pipeline holds ready (workers × prefetch, plus what a stream ahead holds); the set-aside
    takes no more."""
    needed: float | None = None
    """The rate (this process's share) the trial must reach to matter; its interval wholly below stops it."""
    baseline: bool = False
    """The trial is one every gain is over (``TrialSpec.baseline``): below ``needed`` it stops only once its
    interval is within ``rules.CLAIM_PRECISION``."""
    boundary_wait_s: float = 0.0
    """Epoch-aware: how long the windows may go on, past their stop, to see one epoch boundary (0: never)."""
    boundary_patience: float = BOUNDARY_WAIT
    """Epoch-aware: and at most this many times the windows' time so far (inf: ``boundary_wait_s`` alone)."""

    @classmethod
    def from_trial(cls, trial: TrialSettings, **shape: Any) -> MeterSettings:
        """The config's ``trial`` settings, with the pipeline's shape (``compiling``, ``grad_accum``,
        ``round_batches``, ``epoch_batches``, ``fill``, ``needed``, ``baseline``)."""
        return cls(
            window_s=trial.window_s,
            measure_windows=trial.measure_windows,
            max_windows=trial.max_windows,
            precision=trial.precision,
            warmup_steps=trial.warmup_steps,
            **shape,
        )


@dataclass
class Window:
    """One timed window."""

    wall_s: float
    steps: int
    """Optimizer steps."""
    items: float
    """Items (in the workload's unit) its batches held."""
    micro_batches: int
    data_wait_s: float
    """Time inside the source's next(), less ``device_wait_s``."""
    busy_s: float | None
    """Sum of the CUDA-event spans of the steps; None off CUDA."""
    cpu: CpuUse
    device_wait_s: float = 0.0
    """Time the fetches waited on a stream ahead moving the batch on the device, not on the loader."""
    boundary_s: float = 0.0
    """Epoch-aware: the epoch boundaries' spans inside the window, left out of ``wall_s`` (and their batches out of
    ``items`` and ``micro_batches``)."""

    @property
    def rate(self) -> float:
        return self.items / self.wall_s


@dataclass
class Reading:
    """What the meter measured: the warm-up, the kept windows and why measuring stopped."""

    windows: list[Window] = field(default_factory=list)
    first_batch_wait_s: float = 0.0
    first_step_s: float = 0.0
    set_aside: int = 0
    warmup_batches: int = 0
    """Batches the warm-up took: the set-aside ones and the trained ones, the first included."""
    warmup_s: float = 0.0
    """From the first request to the first window, plus the windows cut as settling."""
    stop: dict[str, Any] = field(default_factory=dict)
    """``stop_reason``, ``windows_measured``, ``settling_windows``, ``settling_s``, ``rate_interval``."""
    windows_end: float = 0.0
    """time.perf_counter() when the last window ended."""
    batch_bytes: int | None = None
    """Bytes of the first batch's tensors (what a loader worker passes through shared memory per batch)."""
    epoch_batches: int | None = None
    """The source's batches per epoch when every window held whole epochs (an epoch within two windows' time); None
    when windows held whole loader rounds."""
    boundaries: list[tuple[float, float]] = field(default_factory=list)
    """Epoch-aware: every epoch boundary the trial saw after its first batch, as its span (s) and the items of the
    batches inside it."""
    epoch_aware: bool = False
    epoch_items: float | None = None
    """Epoch-aware: the items of one epoch (its batches times the items a measured batch held); None without a
    length (set by the caller)."""

    def fields(self, cpus: int, workers: int, compiling: bool) -> dict[str, Any]:
        """The measurement's fields the meter owns (docs/measurement.md): throughput, noise, waits, GPU busy, CPU,
        warm-up and stop."""
        warm = {
            "warmup_s": self.warmup_s,
            "warmup_batches": self.warmup_batches,
            "warmup_set_aside": self.set_aside,
            "first_batch_wait_s": self.first_batch_wait_s,
            "first_step_s": self.first_step_s,
            "batch_bytes": self.batch_bytes,
            "compile_s": self.first_step_s - self.first_batch_wait_s if compiling else 0.0,
        }
        fields = {**summarise(self.windows, cpus, workers), **warm, **self.stop, "epoch_batches": self.epoch_batches}
        return {**fields, **(whole_epoch(fields, self.boundaries, self.epoch_items) if self.epoch_aware else {})}


def whole_epoch(
    fields: dict[str, Any], boundaries: list[tuple[float, float]], epoch_items: float | None
) -> dict[str, Any]:
    """Epoch-aware figures: the steady rate inside an epoch (the windows'), what an epoch boundary costs (the mean,
    over those the trial saw, of its span less its batches' items at the steady rate: the time it added to its
    epoch; the first left out when there are ``FEW_BOUNDARIES``), and the rate over whole epochs, ``epoch_items /
    (epoch_items / steady + boundary_s)``, which becomes the trial's ``rate`` when both are known."""
    steady = fields["rate"]
    costs = [max(0.0, span - items / steady) for span, items in boundaries] if steady else []
    kept = costs[1:] if len(costs) >= FEW_BOUNDARIES else costs  # the first pays one-time costs
    out: dict[str, Any] = {
        "rate_in_epoch": steady,
        "epoch_boundaries": len(boundaries),
        "boundary_s": statistics.fmean(kept) if kept else None,
        "boundary_cv": _cv(kept) if len(kept) > 1 else None,
        "boundaries_s": costs or None,
        "epoch_items": epoch_items,
        "rate_whole_epoch": None,
    }
    if kept and epoch_items:  # rate_interval stays the steady rate's (relative) half-width
        whole = rules.epoch_rate(epoch_items, steady, out["boundary_s"])
        out.update(rate_whole_epoch=whole, rate=whole)
    return out


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0


def summarise(windows: list[Window], cpus: int, workers: int) -> dict[str, Any]:
    """The windows' figures: throughput and noise, where the loop waited, GPU busy, CPU time (docs/measurement.md)."""
    rates = [w.rate for w in windows]
    rate = rules.window_rate([w.items for w in windows], [w.wall_s for w in windows])
    wall = sum(w.wall_s for w in windows)
    steps = sum(w.steps for w in windows)
    items = sum(w.items for w in windows)
    cpu_s = sum(w.cpu.main_s + w.cpu.workers_s for w in windows)
    worker_cpu_s = sum(w.cpu.workers_s for w in windows)
    busy = None if windows[0].busy_s is None else sum(w.busy_s or 0.0 for w in windows) / wall
    return {
        "rate": rate,
        "rate_windows": rates,
        "seconds_windows": [w.wall_s for w in windows],
        "steps_windows": [w.steps for w in windows],
        "noise_cv": _cv(rates),
        "noise_range": (max(rates) - min(rates)) / rate if rate else 0.0,
        "step_time_s": wall / steps,
        "item_time_s": wall / items,
        "measured_s": wall,
        "measured_steps": steps,
        "measured_items": items,
        "items_per_batch_mean": items / sum(w.micro_batches for w in windows),
        # how much the batches' content varied from window to window (0 when every batch counts the same): with
        # variable-length batches part of the window noise is the data's, not the machine's
        "items_per_batch_cv": _cv([w.items / w.micro_batches for w in windows]),
        "data_wait_frac": sum(w.data_wait_s for w in windows) / wall,
        "device_input_wait_frac": sum(w.device_wait_s for w in windows) / wall,
        "gpu_busy_frac": None if busy is None else min(1.0, busy),
        "cpu_util_cores": cpu_s / wall,
        "cpu_util_frac": cpu_s / wall / cpus,
        "system_cpu_pct": statistics.fmean(w.cpu.system_pct for w in windows),
        # what other processes kept busy: the busy cores among the trial's usable CPUs less its own tree's
        "other_cpu_cores": max(0.0, sum(w.cpu.usable_busy * w.wall_s for w in windows) / wall - cpu_s / wall),
        # What the loader workers did per item: CPU time against the wall time a worker spends per item it
        # delivers. Decoding workers use most of that time; workers that wait on storage use little of it.
        "worker_cpu_s": worker_cpu_s if workers else None,
        "worker_cpu_per_item_s": worker_cpu_s / items if workers else None,
        "worker_wall_per_item_s": workers * wall / items if workers else None,
    }
