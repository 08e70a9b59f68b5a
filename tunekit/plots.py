"""Plots of a run, rendered from small typed objects computed first (tests check the data, not pixels).

Only the throughput-vs-workers plot exists so far; the report skips (and says so) what a run has no data for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tunekit.analysis import Knee, TrialRow

__all__ = ["Point", "Series", "WorkersPlot", "workers_plot", "draw_workers"]


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
    """Samples/s against num_workers: one series per pin_memory/prefetch variant, window spread as error bars."""

    title: str
    series: tuple[Series, ...]
    knee: Point | None
    knee_label: str
    best: Point | None
    loader_ceiling: tuple[Point, ...]
    compute_ceiling: float | None


def _point(row: TrialRow) -> Point:
    windows = row.measurement.get("samples_per_s_windows") or [row.samples_per_s]
    return Point(row.knobs.num_workers, float(row.samples_per_s or 0), float(min(windows)), float(max(windows)),
                 row.number)


def workers_plot(rows: list[TrialRow], knee: Knee, title: str) -> WorkersPlot | None:
    """The data of the throughput-vs-workers plot, or None when the run has fewer than two worker counts."""
    batch = knee.knee.knobs.batch_size if knee.knee else None
    train = [r for r in rows if r.ok and r.mode == "train" and r.knobs.compile == "none"
             and r.knobs.grad_accum == 1 and (batch is None or r.knobs.batch_size == batch)]
    if len({r.knobs.num_workers for r in train}) < 2:
        return None
    groups: dict[str, list[Point]] = {}
    for r in sorted(train, key=lambda r: r.knobs.num_workers):
        label = f"pin_memory={'on' if r.knobs.pin_memory else 'off'}, prefetch={r.knobs.prefetch_factor or '-'}"
        if r.knobs.num_workers == 0:
            label = f"pin_memory={'on' if r.knobs.pin_memory else 'off'}, prefetch=2"
        groups.setdefault(label, []).append(_point(r))
    loader = tuple(sorted((_point(r) for r in rows if r.ok and r.mode == "loader"
                           and (batch is None or r.knobs.batch_size == batch)), key=lambda p: p.workers))
    compute = [r for r in rows if r.ok and r.mode == "compute" and (batch is None or r.knobs.batch_size == batch)]
    kp = _point(knee.knee) if knee.knee else None
    label = ""
    if knee.knee is not None and knee.ratio is not None:
        label = f"knee: {knee.knee.knobs.num_workers} workers, {knee.ratio:.0%} of best"
    return WorkersPlot(
        title=title, series=tuple(Series(k, tuple(v)) for k, v in groups.items()), knee=kp, knee_label=label,
        best=_point(knee.best) if knee.best else None, loader_ceiling=loader,
        compute_ceiling=float(compute[0].samples_per_s) if compute else None,
    )


def draw_workers(plot: WorkersPlot, path: Path) -> None:
    """Render a :class:`WorkersPlot` to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
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
                markeredgecolor="black", linestyle="none", label="best", zorder=5)
    if plot.knee is not None:
        ax.plot(plot.knee.workers, plot.knee.samples_per_s, marker="o", markersize=14, markerfacecolor="none",
                markeredgecolor="red", markeredgewidth=2, linestyle="none", label=plot.knee_label, zorder=6)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s (median of windows; bars: window range)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=-0.5)
    ax.set_title(plot.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
