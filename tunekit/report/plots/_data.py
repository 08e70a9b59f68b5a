"""The data of each plot: small typed objects computed from finished trials, or a sentence saying why the run
has no data for that plot. Tests check these; :mod:`._draw` only renders them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from tunekit.analysis import Choice
from tunekit.contract import Mode, Stage
from tunekit.records import TrialRow, compute_ceiling

_GIB = 2**30


class Point(NamedTuple):
    workers: int
    rate: float
    """Throughput, ``unit``/s."""
    low: float
    high: float
    trial: int


class Series(NamedTuple):
    label: str
    points: tuple[Point, ...]
    other_batch: bool = False
    """Measured at another batch than the plot's axis batch (drawn hollow, its batch in the label)."""


@dataclass(frozen=True)
class WorkersPlot:
    """Throughput (``unit``/s) against num_workers: one series per pin_memory/prefetch variant, each rate's 95 %
    interval (or its windows' range) as error bars, the script's own settings marked."""

    title: str
    series: tuple[Series, ...]
    knee: Point | None
    knee_label: str
    best: Point | None
    loader_ceiling: tuple[Point, ...]
    compute_ceiling: float | None
    best_label: str = "best"
    unit: str = "samples"
    axis: str = "num_workers"
    """The x axis: num_workers, or workers per rank when the run has multi-rank trials."""
    loader_label: str = "loader alone (ceiling)"
    compute_label: str = "compute ceiling"
    bounded: tuple[Point, ...] = ()
    """End-to-end configs the plan skipped, at the upper bound it inferred for each (``skip_bound``; its trial)."""
    knee_ceiling: float | None = None
    """The compute ceiling at the knee's batch, when the knee ran at another batch than the axis's."""
    knee_ceiling_label: str = ""
    own: Point | None = None
    """Script mode: the script's own settings (its ``baseline`` trial), labelled ``own_label``."""
    own_label: str = ""


class BatchPoint(NamedTuple):
    batch: int
    rate: float
    """Throughput, ``unit``/s."""
    peak_gib: float | None


@dataclass(frozen=True)
class BatchPlot:
    """Throughput (``unit``/s) and peak memory against batch size, with the headroom limit and the batches that did
    not fit."""

    title: str
    points: tuple[BatchPoint, ...]
    oom: tuple[int, ...]
    limit_gib: float | None
    memory_label: str
    chosen: int | None
    unit: str = "samples"
    own: int | None = None
    """Script mode: the batch of the script's own settings, labelled ``own_label``."""
    own_label: str = ""


class UtilPoint(NamedTuple):
    util_pct: float
    rate: float
    """Throughput, ``unit``/s."""
    stage: Stage
    trial: int


@dataclass(frozen=True)
class UtilPlot:
    """NVML utilization against throughput (``unit``/s), one point per trial: high utilization is not high
    output."""

    title: str
    points: tuple[UtilPoint, ...]
    knee_trial: int | None
    unit: str = "samples"


class StepPoint(NamedTuple):
    batch: int
    ms_per_item: float
    """Step time per item of ``unit``, ms."""
    ms_per_step: float


@dataclass(frozen=True)
class StepTimePlot:
    """Step time per item of ``unit`` against batch size (compute ceiling): how much fixed cost a larger batch
    amortises."""

    title: str
    points: tuple[StepPoint, ...]
    unit: str = "samples"


class FractionPoint(NamedTuple):
    workers: int
    data_wait: float
    gpu_idle: float | None


@dataclass(frozen=True)
class FractionsPlot:
    """Data-wait and GPU-idle fractions against num_workers, one series per pin_memory setting."""

    title: str
    series: tuple[tuple[str, tuple[FractionPoint, ...]], ...]


class CompilePoint(NamedTuple):
    mode: str
    rate: float
    """Throughput, ``unit``/s."""
    compile_s: float
    break_even_steps: float | None  # None: never pays off (not faster than eager)


@dataclass(frozen=True)
class CompilePlot:
    """Steady throughput (``unit``/s) per torch.compile mode, compile time, and the steps after which compiling pays
    off."""

    title: str
    points: tuple[CompilePoint, ...]
    batch: int
    unit: str = "samples"


def _unit(rows: list[TrialRow]) -> str:
    return next((r.unit for r in rows if r.ok), "samples")


def _point(row: TrialRow) -> Point:
    """A trial's rate with its 95 % interval (``rate_interval``), or its windows' range where the interval is
    unknown (fewer than two windows, or a run recorded before trials had one)."""
    m = row.measurement
    interval = m.rate_interval
    if interval is not None and math.isfinite(interval):
        return Point(
            row.knobs.num_workers,
            row.rate,
            row.rate * max(0.0, 1.0 - interval),
            row.rate * (1.0 + interval),
            row.number,
        )
    # epoch-aware windows hold the rate inside an epoch: their spread is drawn around the whole-epoch rate
    scale = row.rate / m.rate_in_epoch if m.rate_in_epoch else 1.0
    windows = [w * scale for w in m.rate_windows] if m.rate_windows else [row.rate]
    return Point(row.knobs.num_workers, row.rate, float(min(windows)), float(max(windows)), row.number)


def own_trial(rows: list[TrialRow]) -> TrialRow | None:
    """Script mode: the completed trial of the script's own settings (stage ``baseline``)."""
    return next((r for r in rows if r.ok and r.stage == Stage.baseline and r.mode == Mode.train), None)


def own_label(row: TrialRow) -> str:
    """How the plots name the script's own settings: "your script: 16 workers, batch 32"."""
    return f"your script: {row.knobs.num_workers} workers, batch {row.knobs.batch_size}"


def _knee_batch(choice: Choice) -> int | None:
    ref = choice.knee or choice.best
    return ref.knobs.batch_size if ref else None


def _train_at(rows: list[TrialRow], batch: int | None) -> list[TrialRow]:
    return [
        r
        for r in rows
        if r.ok
        and r.mode == Mode.train
        and r.knobs.compile == "none"
        and r.knobs.grad_accum == 1
        and (batch is None or r.knobs.batch_size == batch)
    ]


def _swept_batch(rows: list[TrialRow], choice: Choice) -> int | None:
    """The batch at which the most worker counts ran end to end (the knee's batch on a tie): the workers axis.
    A knee found later at a smaller batch (the batch stage) is marked on it with its batch named."""
    counts: dict[int, set[int]] = {}
    for r in _train_at(rows, None):
        counts.setdefault(r.knobs.batch_size, set()).add(r.knobs.num_workers)
    chosen = _knee_batch(choice)
    return max(counts, key=lambda b: (len(counts[b]), b == chosen, b)) if counts else chosen


def _bounded(rows: list[TrialRow], batch: int | None) -> tuple[Point, ...]:
    """The end-to-end configs at ``batch`` the plan skipped with an upper bound, each at that bound."""
    points = []
    for r in rows:
        bound = r.measurement.skip_bound
        if r.status == "skipped" and r.mode == Mode.train and bound and r.knobs.batch_size == batch:
            points.append(Point(r.knobs.num_workers, bound, bound, bound, int(r.measurement.skip_bound_trial or -1)))
    return tuple(sorted(points, key=lambda p: p.workers))


def _series(train: list[TrialRow], batch: int | None, world: int) -> tuple[Series, ...]:
    """The end-to-end trials as curves, one per setting other than the workers (pinning, prefetch, GPUs, the
    user's knobs, and the batch when it is not the axis batch): the axis batch's first, then larger batches."""
    groups: dict[tuple[bool, str], list[Point]] = {}
    for r in sorted(
        train, key=lambda r: (r.knobs.batch_size != batch, -r.knobs.batch_size, -r.knobs.ranks, r.knobs.num_workers)
    ):
        pf = f"prefetch={r.knobs.prefetch_factor}" if r.knobs.num_workers else "loading in the main process"
        gpus = "" if world == 1 else f"{r.knobs.ranks} GPU{'s' if r.knobs.ranks > 1 else ''}: "
        mine = "".join(f", {k.removeprefix('workload.')}={v}" for k, v in r.knobs.extra)  # user-defined knobs set
        other = r.knobs.batch_size != batch
        where = f", batch {r.knobs.batch_size}" if other else ""
        groups.setdefault(
            (other, f"{gpus}pin_memory={'on' if r.knobs.pin_memory else 'off'}, {pf}{mine}{where}"), []
        ).append(_point(r))
    return tuple(Series(label, tuple(v), other) for (other, label), v in groups.items())


def workers_data(rows: list[TrialRow], choice: Choice, title: str) -> WorkersPlot | str:
    """The axis batch is the one most worker counts ran at (:func:`_swept_batch`); the end-to-end trials at other
    batches are drawn too, hollow and labelled with their batch (a sweep walks the workers at one batch, then
    moves the batch and tries the user's knobs at the knee: each curve is drawn where it was measured)."""
    batch = _swept_batch(rows, choice)
    train = _train_at(rows, batch)
    if len({r.knobs.num_workers for r in train}) < 2:
        return "the run has fewer than two worker counts measured end to end"
    world = max(r.knobs.ranks for r in train)
    loader = _loader_points(rows, batch)
    compute = (
        compute_ceiling(rows, batch)
        if batch is not None
        else next((r for r in rows if r.ok and r.mode == Mode.compute), None)
    )

    def at(row: TrialRow) -> str:
        return "" if row.knobs.batch_size == batch else f", batch {row.knobs.batch_size}"

    knee = choice.knee
    knee_ceiling = (
        compute_ceiling(rows, knee.knobs.batch_size)
        if knee is not None and batch is not None and knee.knobs.batch_size != batch
        else None
    )

    return WorkersPlot(
        unit=_unit(rows),
        title=title,
        series=_series(_train_at(rows, None), batch, world),
        knee=_point(choice.knee) if choice.knee else None,
        knee_label=_knee_label(choice, at),
        best=_point(choice.best) if choice.best else None,
        loader_ceiling=loader,
        compute_ceiling=compute.rate * world if compute else None,
        best_label=f"best{' (' + at(choice.best)[2:] + ')' if choice.best and at(choice.best) else ''}",
        bounded=_bounded(rows, batch),
        knee_ceiling=knee_ceiling.rate * world if knee_ceiling else None,
        knee_ceiling_label=f"compute ceiling at the knee's batch {knee.knobs.batch_size}"
        if knee_ceiling and knee
        else "",
        own=_point(own) if (own := own_trial(rows)) else None,
        own_label=own_label(own) if own else "",
        compute_label=f"compute ceiling{f' x {world} GPUs' if world > 1 else ''}"
        f"{f' (batch {batch})' if batch is not None else ''}",
        **({} if world == 1 else {"axis": "workers per rank", "loader_label": "loader alone, one rank (ceiling)"}),
    )


def _loader_points(rows: list[TrialRow], batch: int | None) -> tuple[Point, ...]:
    """The loader-alone trials at the axis batch (any batch without one), by worker count."""
    at_batch = (r for r in rows if r.ok and r.mode == Mode.loader and (batch is None or r.knobs.batch_size == batch))
    return tuple(sorted((_point(r) for r in at_batch), key=lambda p: p.workers))


def _knee_label(choice: Choice, at: Callable[[TrialRow], str]) -> str:
    """``knee: 8 workers, 98.0% of best`` (per rank x its ranks; its batch when not the axis one)."""
    if choice.knee is None or choice.ratio is None:
        return ""
    label = f"knee: {choice.knee.knobs.num_workers} workers{at(choice.knee)}, {choice.ratio:.1%} of best"
    if choice.knee.knobs.ranks > 1:
        label = label.replace(" workers", f" workers per rank x {choice.knee.knobs.ranks}")
    return label


def _peak_gib(r: TrialRow) -> float | None:
    m = r.measurement
    peak = m.device_mem_peak_reserved_bytes if m.headroom_basis == "device" else m.host_mem_peak_bytes
    return None if peak is None else peak / _GIB


def batch_data(rows: list[TrialRow], choice: Choice, title: str, min_headroom: float) -> BatchPlot | str:
    source = [r for r in rows if r.mode == Mode.compute] or [
        r for r in rows if r.mode == Mode.train and r.knobs.compile == "none"
    ]
    best_by_batch: dict[int, TrialRow] = {}
    for r in source:
        if r.ok and (r.knobs.batch_size not in best_by_batch or r.rate > best_by_batch[r.knobs.batch_size].rate):
            best_by_batch[r.knobs.batch_size] = r
    oom = tuple(sorted({r.knobs.batch_size for r in source if r.status == "oom"} - set(best_by_batch)))
    if not best_by_batch:
        return "no batch size completed"
    if len(best_by_batch) + len(oom) < 2:
        return "the run has fewer than two batch sizes"
    ok_rows = [best_by_batch[b] for b in sorted(best_by_batch)]
    m = ok_rows[0].measurement
    device = m.headroom_basis == "device"
    total = m.device_mem_total_bytes if device else m.host_mem_total_bytes
    return BatchPlot(
        unit=_unit(rows),
        title=title,
        points=tuple(BatchPoint(r.knobs.batch_size, r.rate, _peak_gib(r)) for r in ok_rows),
        oom=oom,
        limit_gib=None if not total else (1 - min_headroom) * total / _GIB,
        memory_label="peak device memory, reserved (GiB)" if device else "peak host memory, PSS (GiB)",
        chosen=_knee_batch(choice),
        own=own.knobs.batch_size if (own := own_trial(rows)) else None,
        own_label=own_label(own) if own else "",
    )


def util_data(rows: list[TrialRow], choice: Choice, title: str) -> UtilPlot | str:
    points = tuple(
        UtilPoint(float(r.measurement.nvml_util_gpu_pct), r.rate, r.stage, r.number)
        for r in rows
        if r.ok and r.measurement.nvml_util_gpu_pct is not None
    )
    if len(points) < 2:
        return "no NVML utilization was sampled (a CPU run, or NVML unavailable)"
    return UtilPlot(title, points, choice.knee.number if choice.knee else None, unit=_unit(rows))


def step_time_data(rows: list[TrialRow], title: str) -> StepTimePlot | str:
    compute = sorted((r for r in rows if r.ok and r.mode == Mode.compute), key=lambda r: r.knobs.batch_size)
    if len(compute) < 2:
        return "the run has fewer than two compute-ceiling trials (batch sizes)"
    return StepTimePlot(
        unit=_unit(rows),
        title=title,
        points=tuple(
            StepPoint(r.knobs.batch_size, 1000.0 / r.rate, 1000.0 * float(r.measurement.step_time_s or 0.0))
            for r in compute
        ),
    )


def fractions_data(rows: list[TrialRow], choice: Choice, title: str) -> FractionsPlot | str:
    train = _train_at(rows, _swept_batch(rows, choice))
    world = max((r.knobs.ranks for r in train), default=1)
    train = [r for r in train if r.knobs.ranks == world]  # the job as it runs (not the one-GPU scaling trial)
    if len({r.knobs.num_workers for r in train}) < 2:
        return "the run has fewer than two worker counts measured end to end"
    series: dict[str, dict[int, FractionPoint]] = {}
    for r in sorted(train, key=lambda r: (r.knobs.num_workers, -r.rate)):
        busy = r.measurement.gpu_busy_frac
        label = f"pin_memory={'on' if r.knobs.pin_memory else 'off'}"
        series.setdefault(label, {}).setdefault(
            r.knobs.num_workers,
            FractionPoint(
                r.knobs.num_workers,
                float(r.measurement.data_wait_frac or 0.0),
                None if busy is None else 1.0 - float(busy),
            ),
        )
    return FractionsPlot(title, tuple((k, tuple(v.values())) for k, v in series.items()))


def compile_data(rows: list[TrialRow], choice: Choice, title: str) -> CompilePlot | str:
    ref = choice.knee or choice.best
    if ref is None:
        return "no end-to-end config completed"
    k = ref.knobs
    same = [
        r
        for r in rows
        if r.ok
        and r.mode == Mode.train
        and r.knobs.num_workers == k.num_workers
        and r.knobs.prefetch_factor == k.prefetch_factor
        and r.knobs.pin_memory == k.pin_memory
        and r.knobs.batch_size == k.batch_size
        and r.knobs.grad_accum == k.grad_accum
    ]
    order = {
        m: i for i, m in enumerate(("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"))
    }
    by_mode = {r.knobs.compile: r for r in sorted(same, key=lambda r: r.rate)}  # the fastest trial of each mode wins
    by_mode = dict(sorted(by_mode.items(), key=lambda kv: order.get(kv[0], 99)))
    if len(by_mode) < 2 or "none" not in by_mode:
        return "the run has no eager and compiled trial of the same config to compare"
    eager = by_mode["none"]
    points = []
    for mode, r in by_mode.items():
        gain = 1.0 / eager.rate - 1.0 / r.rate  # seconds saved per item
        items = r.compile_s / gain if mode != "none" and gain > 0 else None
        steps = None if items is None else items / (k.batch_size * k.grad_accum)
        points.append(CompilePoint(mode, r.rate, r.compile_s, 0.0 if mode == "none" else steps))
    return CompilePlot(title, tuple(points), k.batch_size * k.grad_accum, unit=_unit(rows))
