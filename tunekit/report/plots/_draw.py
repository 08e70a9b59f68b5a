"""Drawing: each ``draw_*`` renders one plot object from :mod:`._data` into a PNG, written atomically."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tunekit._files import atomic_path
from tunekit.report.plots._compare import Bar, ComparePlot
from tunekit.report.plots._data import BatchPlot, CompilePlot, FractionsPlot, StepTimePlot, UtilPlot, WorkersPlot


def _figure(title: str) -> tuple[Any, Any]:
    """A figure of its own, outside pyplot: drawing it neither switches the caller's matplotlib backend nor touches
    their open figures (``tunekit.sweep`` in a notebook), and PNGs need no display."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=120)
    ax = fig.subplots()
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:  # a killed run never leaves a half-written PNG
        fig.savefig(tmp, format="png", bbox_inches="tight")  # legends placed outside the axes included


def draw_workers(plot: WorkersPlot, path: Path) -> None:
    _save(workers_figure(plot)[0], path)


_MARKS = (
    ("best", "best_label", {"marker": "*", "markersize": 16, "color": "gold", "markeredgecolor": "black", "zorder": 5}),
    (
        "knee",
        "knee_label",
        {
            "marker": "o",
            "markersize": 14,
            "markerfacecolor": "none",
            "markeredgecolor": "red",
            "markeredgewidth": 2,
            "zorder": 6,
        },
    ),
    (
        "own",
        "own_label",
        {
            "marker": "D",
            "markersize": 10,
            "markerfacecolor": "none",
            "markeredgecolor": "black",
            "markeredgewidth": 1.5,
            "zorder": 6,
        },
    ),
)
"""The single points a workers plot marks: the best config, the knee and the script's own settings (the plot's
attribute, its label's attribute, the marker's style)."""


def workers_figure(plot: WorkersPlot) -> tuple[Any, Any]:
    """The throughput-vs-workers figure and its axes, drawn."""
    fig, ax = _figure(plot.title)
    for series in plot.series:
        xs = [p.workers for p in series.points]
        ys = [p.rate for p in series.points]
        err = [[p.rate - p.low for p in series.points], [p.high - p.rate for p in series.points]]
        # markers only: skipped or unsearched worker counts between two points are not interpolated
        hollow = {"markerfacecolor": "none"} if series.other_batch else {}
        ax.errorbar(xs, ys, yerr=err, marker="o", linestyle="none", capsize=3, label=series.label, **hollow)
    _bounds(ax, plot)
    for attr, label, style in _MARKS:
        point = getattr(plot, attr)
        if point is not None:
            ax.plot(point.workers, point.rate, linestyle="none", label=getattr(plot, label), **style)
    _workers_axes(ax, plot)
    return fig, ax


def _bounds(ax: Any, plot: WorkersPlot) -> None:
    """The loader ceiling's line, the skipped counts' upper bounds and the compute and knee ceilings."""
    if plot.loader_ceiling:
        xs, ys = [p.workers for p in plot.loader_ceiling], [p.rate for p in plot.loader_ceiling]
        ax.plot(xs, ys, ":", color="grey", marker=".", label=plot.loader_label)
    if plot.bounded:  # skipped: at most this, by the plan's evidence (a loader ceiling, a count out of the band)
        ax.plot(
            [p.workers for p in plot.bounded],
            [p.rate for p in plot.bounded],
            marker="v",
            markersize=9,
            markerfacecolor="none",
            markeredgecolor="grey",
            linestyle="none",
            label="skipped: at most this (the bound the plan inferred)",
        )
    if plot.compute_ceiling:
        ax.axhline(plot.compute_ceiling, color="black", linestyle="--", linewidth=1, label=plot.compute_label)
    if plot.knee_ceiling:
        ax.axhline(plot.knee_ceiling, color="red", linestyle="--", linewidth=1, label=plot.knee_ceiling_label)


def _workers_axes(ax: Any, plot: WorkersPlot) -> None:
    """Whole worker counts on x; the rate on y, from 0 or on a log scale when its span is wide; the legend."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(plot.axis)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # worker counts: no half-step ticks
    if log_scale(plot):
        ax.set_yscale("log")
        ax.set_ylabel(f"{plot.unit}/s, log scale (bars: 95 % interval)")
    else:
        ax.set_ylabel(f"{plot.unit}/s (bars: 95 % interval)")
        ax.set_ylim(bottom=0)
    ax.set_xlim(left=-0.5)
    # below the axes: inside, it covered the few-worker points that matter most; beside them, the long labels of
    # user knobs squeezed the axes to a third of the figure
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2 if len(plot.series) > 3 else 1)


LOG_SPAN = 20.0
"""A workers plot whose highest line (a loader ceiling, say) is this many times its lowest measured point or more
is drawn on a log scale: on a linear one the end-to-end points lie flat on zero."""


def log_scale(plot: WorkersPlot) -> bool:
    measured = [p.rate for s in plot.series for p in s.points if p.rate > 0]
    top = max(
        [*measured, *(p.rate for p in plot.loader_ceiling), plot.compute_ceiling or 0.0, plot.knee_ceiling or 0.0]
    )
    return bool(measured) and top >= LOG_SPAN * min(measured)


def draw_batch(plot: BatchPlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    xs = [p.batch for p in plot.points]
    ax.plot(xs, [p.rate for p in plot.points], "o-", color="tab:blue", label=f"{plot.unit}/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"{plot.unit}/s", color="tab:blue")
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
    if plot.own is not None:
        ax.axvline(plot.own, color="black", linestyle=":", linewidth=1.5, label=plot.own_label)
    ax.set_xticks(sorted(set(xs) | set(plot.oom) | ({plot.own} if plot.own is not None else set())))
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
        ax.scatter([p.util_pct for p in pts], [p.rate for p in pts], label=stage, s=36)
    for p in plot.points:
        if p.trial == plot.knee_trial:
            ax.scatter(
                [p.util_pct], [p.rate], s=220, facecolors="none", edgecolors="red", linewidths=2, label="knee", zorder=5
            )
    ax.set_xlabel("NVML GPU utilization, mean over the windows (%)")
    ax.set_ylabel(f"{plot.unit}/s")
    ax.set_xlim(0, 105)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    _save(fig, path)


def draw_step_time(plot: StepTimePlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    xs = [p.batch for p in plot.points]
    per = "sample" if plot.unit == "samples" else plot.unit.removesuffix("s")
    ax.plot(xs, [p.ms_per_item for p in plot.points], "o-", label=f"step time per {per} (ms)")
    for p in plot.points:
        ax.annotate(
            f"{p.ms_per_step:.0f} ms/step",
            (p.batch, p.ms_per_item),
            xytext=(4, 6),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.get_xaxis().set_major_formatter(_int_formatter())
    ax.set_xlabel("batch size (model on a batch staged on the device)")
    ax.set_ylabel(f"ms per {per}")
    ax.set_ylim(0, max(p.ms_per_item for p in plot.points) * 1.15)
    ax.legend(fontsize=8)
    _save(fig, path)


def draw_fractions(plot: FractionsPlot, path: Path) -> None:
    _save(fractions_figure(plot)[0], path)


def fractions_figure(plot: FractionsPlot) -> tuple[Any, Any]:
    """The data-wait and GPU-idle fractions figure and its axes, drawn."""
    fig, ax = _figure(plot.title)
    for label, pts in plot.series:
        xs = [p.workers for p in pts]
        # markers only: worker counts between two points may not have been measured (skipped or not searched)
        line = ax.plot(xs, [p.data_wait for p in pts], "o", markersize=8, label=f"data wait, {label}")[0]
        idle = [(p.workers, p.gpu_idle) for p in pts if p.gpu_idle is not None]
        if idle:
            ax.plot(
                *zip(*idle, strict=True),
                "s",
                markerfacecolor="none",
                markersize=9,
                color=line.get_color(),
                label=f"GPU idle (events), {label}",
            )
    ax.set_xlabel("num_workers")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # worker counts: no half-step ticks
    ax.set_ylabel("fraction of window time")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(left=-0.5)
    ax.legend(fontsize=8, loc="upper right")
    return fig, ax


def draw_compile(plot: CompilePlot, path: Path) -> None:
    fig, ax = _figure(plot.title)
    modes = [p.mode for p in plot.points]
    bars = ax.bar(modes, [p.rate for p in plot.points], color="tab:blue")
    for bar, p in zip(bars, plot.points, strict=True):
        if p.mode == "none":
            note = "eager"
        elif p.break_even_steps is None:
            note = f"compile {p.compile_s:.0f} s\nnever pays off"
        else:
            note = f"compile {p.compile_s:.0f} s\npays off after\n{math.ceil(p.break_even_steps):,} steps"
        ax.annotate(
            note,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel(f"steady {plot.unit}/s (batch {plot.batch})")
    ax.set_ylim(0, max(p.rate for p in plot.points) * 1.3)
    ax.set_xlabel("torch.compile mode")
    _save(fig, path)


def draw_compare(plot: ComparePlot, path: Path) -> None:
    """Two panels: the knee's rate per machine type and its items per unit of money, each with its 95 % interval
    as an error bar; the cheapest type's bar in green, a type without a figure marked with why (no knee, not priced)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5), dpi=120)
    fig.suptitle(plot.title, fontsize=10)
    panels = ((plot.rates, f"{plot.unit}/s at the knee"), (plot.per_money, f"{plot.unit} per unit of money"))
    for ax, (bars, label) in zip(fig.subplots(1, 2), panels, strict=True):
        _compare_panel(ax, bars, label)
    fig.axes[1].set_xlabel(plot.note, fontsize=8)
    _save(fig, path)


def _compare_panel(ax: Any, bars: tuple[Bar, ...], label: str) -> None:
    xs = range(len(bars))
    values = [b.value or 0.0 for b in bars]
    colors = ["tab:green" if b.cheapest else "tab:blue" for b in bars]
    ax.bar(xs, values, color=colors)
    for x, b in zip(xs, bars, strict=True):
        if b.value is None:
            ax.annotate(b.missing, (x, 0), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8)
        elif b.low is not None and b.high is not None:
            ax.errorbar([x], [b.value], yerr=[[b.value - b.low], [b.high - b.value]], color="black", capsize=6)
    ax.set_xticks(list(xs), [b.label for b in bars], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, axis="y")
