"""The plots a user reviews before committing recommended.yaml.

Compute, then draw (as optuna's visualization does): each ``*_data`` function turns finished trials into a small
typed object, or returns a sentence saying why the run has no data for that plot; each ``draw_*`` function only
renders such an object. Tests check the data; :func:`render_all` writes the PNGs under ``plots/``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tunekit.analysis import Knee, TrialRow

__all__ = [
    "Point", "Series", "WorkersPlot", "BatchPlot", "UtilPlot", "StepTimePlot", "FractionsPlot", "CompilePlot",
    "PlotResult", "workers_data", "batch_data", "util_data", "step_time_data", "fractions_data", "compile_data",
    "render_all", "PLOTS",
]

_GIB = 2**30


class Point(NamedTuple):
    workers: int
    samples_per_s: float
    low: float
    high: float
    trial: int


class Series(NamedTuple):
    label: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class WorkersPlot:
    """Samples/s against num_workers: one series per pin_memory/prefetch variant, window range as error bars."""

    title: str
    series: tuple[Series, ...]
    knee: Point | None
    knee_label: str
    best: Point | None
    loader_ceiling: tuple[Point, ...]
    compute_ceiling: float | None
    best_label: str = "best"


class BatchPoint(NamedTuple):
    batch: int
    samples_per_s: float
    peak_gib: float | None


@dataclass(frozen=True)
class BatchPlot:
    """Samples/s and peak memory against batch size, with the headroom limit and the batches that did not fit."""

    title: str
    points: tuple[BatchPoint, ...]
    oom: tuple[int, ...]
    limit_gib: float | None
    memory_label: str
    chosen: int | None


class UtilPoint(NamedTuple):
    util_pct: float
    samples_per_s: float
    stage: str
    trial: int


@dataclass(frozen=True)
class UtilPlot:
    """NVML utilization against samples/s, one point per trial: high utilization is not high output."""

    title: str
    points: tuple[UtilPoint, ...]
    knee_trial: int | None


class StepPoint(NamedTuple):
    batch: int
    ms_per_sample: float
    ms_per_step: float


@dataclass(frozen=True)
class StepTimePlot:
    """Per-sample step time against batch size (compute ceiling): how much fixed cost a larger batch amortises."""

    title: str
    points: tuple[StepPoint, ...]


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
    samples_per_s: float
    compile_s: float
    break_even_steps: float | None  # None: never pays off (not faster than eager)


@dataclass(frozen=True)
class CompilePlot:
    """Steady samples/s per torch.compile mode, compile time, and the steps after which compiling pays off."""

    title: str
    points: tuple[CompilePoint, ...]
    batch: int


class PlotResult(NamedTuple):
    name: str
    title: str
    path: str | None  # relative to the run folder; None when skipped
    reason: str  # why it was skipped ("" when drawn)


Built = Any  # one of the plot dataclasses above



def _point(row: TrialRow) -> Point:
    windows = row.measurement.get("samples_per_s_windows") or [row.samples_per_s]
    return Point(row.knobs.num_workers, row.rate, float(min(windows)), float(max(windows)), row.number)


def _knee_batch(knee: Knee) -> int | None:
    ref = knee.knee or knee.best
    return ref.knobs.batch_size if ref else None


def _train_at(rows: list[TrialRow], batch: int | None) -> list[TrialRow]:
    return [r for r in rows if r.ok and r.mode == "train" and r.knobs.compile == "none" and r.knobs.grad_accum == 1
            and (batch is None or r.knobs.batch_size == batch)]


def _swept_batch(rows: list[TrialRow], knee: Knee) -> int | None:
    """The batch at which the most worker counts ran end to end (the knee's batch on a tie): the workers axis.
    A knee found later at a smaller batch (the batch stage) is marked on it with its batch named."""
    counts: dict[int, set[int]] = {}
    for r in _train_at(rows, None):
        counts.setdefault(r.knobs.batch_size, set()).add(r.knobs.num_workers)
    chosen = _knee_batch(knee)
    return max(counts, key=lambda b: (len(counts[b]), b == chosen, b)) if counts else chosen


def workers_data(rows: list[TrialRow], knee: Knee, title: str) -> WorkersPlot | str:
    batch = _swept_batch(rows, knee)
    train = _train_at(rows, batch)
    if len({r.knobs.num_workers for r in train}) < 2:
        return "the run has fewer than two worker counts measured end to end"
    groups: dict[str, list[Point]] = {}
    for r in sorted(train, key=lambda r: r.knobs.num_workers):
        pf = f"prefetch={r.knobs.prefetch_factor}" if r.knobs.num_workers else "loading in the main process"
        groups.setdefault(f"pin_memory={'on' if r.knobs.pin_memory else 'off'}, {pf}", []).append(_point(r))
    loader = tuple(sorted((_point(r) for r in rows if r.ok and r.mode == "loader"
                           and (batch is None or r.knobs.batch_size == batch)), key=lambda p: p.workers))
    compute = [r for r in rows if r.ok and r.mode == "compute" and (batch is None or r.knobs.batch_size == batch)]
    def at(row: TrialRow) -> str:
        return "" if row.knobs.batch_size == batch else f", batch {row.knobs.batch_size}"

    label = ""
    if knee.knee is not None and knee.ratio is not None:
        label = f"knee: {knee.knee.knobs.num_workers} workers{at(knee.knee)}, {knee.ratio:.1%} of best"
    return WorkersPlot(
        title=title, series=tuple(Series(k, tuple(v)) for k, v in groups.items()),
        knee=_point(knee.knee) if knee.knee else None, knee_label=label,
        best=_point(knee.best) if knee.best else None, loader_ceiling=loader,
        compute_ceiling=compute[0].rate if compute else None,
        best_label=f"best{' (' + at(knee.best)[2:] + ')' if knee.best and at(knee.best) else ''}",
    )


def _peak_gib(r: TrialRow) -> float | None:
    m = r.measurement
    peak = m.get("device_mem_peak_reserved_bytes") if m.get("headroom_basis") == "device" else m.get(
        "host_mem_peak_bytes")
    return None if peak is None else peak / _GIB


def batch_data(rows: list[TrialRow], knee: Knee, title: str, min_headroom: float) -> BatchPlot | str:
    source = [r for r in rows if r.mode == "compute"] or [r for r in rows if r.mode == "train"
                                                           and r.knobs.compile == "none"]
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
    device = m.get("headroom_basis") == "device"
    total = m.get("device_mem_total_bytes") if device else m.get("host_mem_total_bytes")
    return BatchPlot(
        title=title, points=tuple(BatchPoint(r.knobs.batch_size, r.rate, _peak_gib(r)) for r in ok_rows), oom=oom,
        limit_gib=None if not total else (1 - min_headroom) * total / _GIB,
        memory_label="peak device memory, reserved (GiB)" if device else "peak host memory, PSS (GiB)",
        chosen=_knee_batch(knee),
    )


def util_data(rows: list[TrialRow], knee: Knee, title: str) -> UtilPlot | str:
    points = tuple(UtilPoint(float(r.measurement["nvml_util_gpu_pct"]), r.rate, r.stage, r.number)
                   for r in rows if r.ok and r.measurement.get("nvml_util_gpu_pct") is not None)
    if len(points) < 2:
        return "no NVML utilization was sampled (a CPU run, or NVML unavailable)"
    return UtilPlot(title, points, knee.knee.number if knee.knee else None)


def step_time_data(rows: list[TrialRow], title: str) -> StepTimePlot | str:
    compute = sorted((r for r in rows if r.ok and r.mode == "compute"), key=lambda r: r.knobs.batch_size)
    if len(compute) < 2:
        return "the run has fewer than two compute-ceiling trials (batch sizes)"
    return StepTimePlot(title, tuple(
        StepPoint(r.knobs.batch_size, 1000.0 / r.rate, 1000.0 * float(r.measurement.get("step_time_s") or 0.0))
        for r in compute))


def fractions_data(rows: list[TrialRow], knee: Knee, title: str) -> FractionsPlot | str:
    train = _train_at(rows, _swept_batch(rows, knee))
    if len({r.knobs.num_workers for r in train}) < 2:
        return "the run has fewer than two worker counts measured end to end"
    series: dict[str, dict[int, FractionPoint]] = {}
    for r in sorted(train, key=lambda r: (r.knobs.num_workers, -r.rate)):
        busy = r.measurement.get("gpu_busy_frac")
        label = f"pin_memory={'on' if r.knobs.pin_memory else 'off'}"
        series.setdefault(label, {}).setdefault(r.knobs.num_workers, FractionPoint(
            r.knobs.num_workers, float(r.measurement.get("data_wait_frac") or 0.0),
            None if busy is None else 1.0 - float(busy)))
    return FractionsPlot(title, tuple((k, tuple(v.values())) for k, v in series.items()))


def compile_data(rows: list[TrialRow], knee: Knee, title: str) -> CompilePlot | str:
    ref = knee.knee or knee.best
    if ref is None:
        return "no end-to-end config completed"
    k = ref.knobs
    same = [r for r in rows if r.ok and r.mode == "train" and r.knobs.num_workers == k.num_workers
            and r.knobs.prefetch_factor == k.prefetch_factor and r.knobs.pin_memory == k.pin_memory
            and r.knobs.batch_size == k.batch_size and r.knobs.grad_accum == k.grad_accum]
    order = {m: i for i, m in enumerate(("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs",
                                        "max-autotune"))}
    by_mode = {r.knobs.compile: r for r in sorted(same, key=lambda r: r.rate)}  # the fastest trial of each mode wins
    by_mode = dict(sorted(by_mode.items(), key=lambda kv: order.get(kv[0], 99)))
    if len(by_mode) < 2 or "none" not in by_mode:
        return "the run has no eager and compiled trial of the same config to compare"
    eager = by_mode["none"]
    points = []
    for mode, r in by_mode.items():
        gain = 1.0 / eager.rate - 1.0 / r.rate  # seconds saved per sample
        samples = r.compile_s / gain if mode != "none" and gain > 0 else None
        steps = None if samples is None else samples / (k.batch_size * k.grad_accum)
        points.append(CompilePoint(mode, r.rate, r.compile_s, 0.0 if mode == "none" else steps))
    return CompilePlot(title, tuple(points), k.batch_size * k.grad_accum)


# --- drawing -----------------------------------------------------------------------------------------------------


def _figure(title: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)  # a killed run never leaves a half-written PNG


def draw_workers(plot: WorkersPlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    for series in plot.series:
        xs = [p.workers for p in series.points]
        ys = [p.samples_per_s for p in series.points]
        err = [[p.samples_per_s - p.low for p in series.points], [p.high - p.samples_per_s for p in series.points]]
        # markers only: skipped or unsearched worker counts between two points are not interpolated
        ax.errorbar(xs, ys, yerr=err, marker="o", linestyle="none", capsize=3, label=series.label)
    if plot.loader_ceiling:
        ax.plot([p.workers for p in plot.loader_ceiling], [p.samples_per_s for p in plot.loader_ceiling], ":",
                color="grey", marker=".", label="loader alone (ceiling)")
    if plot.compute_ceiling:
        ax.axhline(plot.compute_ceiling, color="black", linestyle="--", linewidth=1, label="compute ceiling")
    if plot.best is not None:
        ax.plot(plot.best.workers, plot.best.samples_per_s, marker="*", markersize=16, color="gold",
                markeredgecolor="black", linestyle="none", label=plot.best_label, zorder=5)
    if plot.knee is not None:
        ax.plot(plot.knee.workers, plot.knee.samples_per_s, marker="o", markersize=14, markerfacecolor="none",
                markeredgecolor="red", markeredgewidth=2, linestyle="none", label=plot.knee_label, zorder=6)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s (median of windows; bars: window range)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=-0.5)
    # outside the axes: inside, it covered the few-worker points that matter most
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    _save(fig, path)


def draw_batch(plot: BatchPlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    xs = [p.batch for p in plot.points]
    ax.plot(xs, [p.samples_per_s for p in plot.points], "o-", color="tab:blue", label="samples/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("samples/s", color="tab:blue")
    ax.set_ylim(bottom=0)
    mem = ax.twinx()
    mem_pts = [(p.batch, p.peak_gib) for p in plot.points if p.peak_gib is not None]
    if mem_pts:
        mem.plot(*zip(*mem_pts, strict=True), "s--", color="tab:orange", label=plot.memory_label)
    if plot.limit_gib:
        mem.axhline(plot.limit_gib, color="red", linewidth=1, label="headroom limit (memory axis)")
    mem.set_ylabel(plot.memory_label, color="tab:orange")
    mem.set_ylim(bottom=0, top=max([plot.limit_gib or 0] + [g for _, g in mem_pts]) * 1.15 or 1)
    for batch in plot.oom:
        ax.axvline(batch, color="red", linestyle=":", linewidth=1)
        ax.annotate("OOM", (batch, 0), xytext=(3, 8), textcoords="offset points", color="red", fontsize=9)
    if plot.chosen is not None:
        ax.axvline(plot.chosen, color="green", linestyle="--", linewidth=1, label=f"chosen batch {plot.chosen}")
    ax.set_xticks(sorted(set(xs) | set(plot.oom)))
    ax.get_xaxis().set_major_formatter(_int_formatter())
    lines = ax.get_legend_handles_labels()
    more = mem.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center right")
    _save(fig, path)


def _int_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{int(v)}")


def draw_util(plot: UtilPlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    stages = sorted({p.stage for p in plot.points})
    for stage in stages:
        pts = [p for p in plot.points if p.stage == stage]
        ax.scatter([p.util_pct for p in pts], [p.samples_per_s for p in pts], label=stage, s=36)
    for p in plot.points:
        if p.trial == plot.knee_trial:
            ax.scatter([p.util_pct], [p.samples_per_s], s=220, facecolors="none", edgecolors="red", linewidths=2,
                       label="knee", zorder=5)
    ax.set_xlabel("NVML GPU utilization, mean over the windows (%)")
    ax.set_ylabel("samples/s")
    ax.set_xlim(0, 105)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    _save(fig, path)


def draw_step_time(plot: StepTimePlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    xs = [p.batch for p in plot.points]
    ax.plot(xs, [p.ms_per_sample for p in plot.points], "o-", label="step time per sample (ms)")
    for p in plot.points:
        ax.annotate(f"{p.ms_per_step:.0f} ms/step", (p.batch, p.ms_per_sample), xytext=(4, 6),
                    textcoords="offset points", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.get_xaxis().set_major_formatter(_int_formatter())
    ax.set_xlabel("batch size (model on a batch staged on the device)")
    ax.set_ylabel("ms per sample")
    ax.set_ylim(0, max(p.ms_per_sample for p in plot.points) * 1.15)
    ax.legend(fontsize=8)
    _save(fig, path)


def draw_fractions(plot: FractionsPlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    for label, pts in plot.series:
        xs = [p.workers for p in pts]
        # markers only: worker counts between two points may not have been measured (skipped or not searched)
        line = ax.plot(xs, [p.data_wait for p in pts], "o", markersize=8, label=f"data wait, {label}")[0]
        idle = [(p.workers, p.gpu_idle) for p in pts if p.gpu_idle is not None]
        if idle:
            ax.plot(*zip(*idle, strict=True), "s", markerfacecolor="none", markersize=9, color=line.get_color(),
                    label=f"GPU idle (events), {label}")
    ax.set_xlabel("num_workers")
    ax.set_ylabel("fraction of window time")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(left=-0.5)
    ax.legend(fontsize=8, loc="upper right")
    _save(fig, path)


def draw_compile(plot: CompilePlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    modes = [p.mode for p in plot.points]
    bars = ax.bar(modes, [p.samples_per_s for p in plot.points], color="tab:blue")
    for bar, p in zip(bars, plot.points, strict=True):
        if p.mode == "none":
            note = "eager"
        elif p.break_even_steps is None:
            note = f"compile {p.compile_s:.0f} s\nnever pays off"
        else:
            note = f"compile {p.compile_s:.0f} s\npays off after\n{math.ceil(p.break_even_steps):,} steps"
        ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 4),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"steady samples/s (batch {plot.batch})")
    ax.set_ylim(0, max(p.samples_per_s for p in plot.points) * 1.3)
    ax.set_xlabel("torch.compile mode")
    _save(fig, path)


PLOTS: tuple[tuple[str, str, str], ...] = (
    ("workers", "samples/s vs num_workers", "workers.png"),
    ("batch", "batch size vs samples/s and peak memory", "batch.png"),
    ("utilization", "NVML utilization vs samples/s", "utilization.png"),
    ("step_time", "per-sample step time vs batch size", "step_time.png"),
    ("fractions", "data-wait and GPU-idle fractions vs num_workers", "fractions.png"),
    ("compile", "compile modes", "compile.png"),
)


def render_all(run_dir: Path, rows: list[TrialRow], knee: Knee, title: str, min_headroom: float) -> list[PlotResult]:
    """Build and draw every plot the run has data for; the others are listed with the reason they were skipped.
    Stale PNGs of skipped plots are removed."""
    builders: dict[str, tuple[Callable[[], Built | str], Callable[[Built, Path], None]]] = {
        "workers": (lambda: workers_data(rows, knee, title), draw_workers),
        "batch": (lambda: batch_data(rows, knee, title, min_headroom), draw_batch),
        "utilization": (lambda: util_data(rows, knee, title), draw_util),
        "step_time": (lambda: step_time_data(rows, title), draw_step_time),
        "fractions": (lambda: fractions_data(rows, knee, title), draw_fractions),
        "compile": (lambda: compile_data(rows, knee, title), draw_compile),
    }
    results = []
    for name, label, file in PLOTS:
        build, draw = builders[name]
        data = build()
        path = run_dir / "plots" / file
        if isinstance(data, str):
            path.unlink(missing_ok=True)
            results.append(PlotResult(name, label, None, data))
            continue
        draw(data, path)
        results.append(PlotResult(name, label, f"plots/{file}", ""))
    return results
