"""The plots a user reviews before committing recommended.yaml.

Compute, then draw (as optuna's visualization does): :mod:`._data` turns finished trials into small typed
objects (or a sentence saying why the run has no data for a plot); :mod:`._draw` only renders them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tunekit.analysis import Choice, Comparison
from tunekit.records import TrialRow
from tunekit.report.plots import _draw
from tunekit.report.plots._compare import Bar, ComparePlot, compare_data
from tunekit.report.plots._data import (
    BatchPlot,
    CompilePlot,
    FractionsPlot,
    Point,
    Series,
    StepTimePlot,
    UtilPlot,
    WorkersPlot,
    batch_data,
    compile_data,
    fractions_data,
    step_time_data,
    util_data,
    workers_data,
)

__all__ = [
    "Point",
    "Series",
    "WorkersPlot",
    "BatchPlot",
    "UtilPlot",
    "StepTimePlot",
    "FractionsPlot",
    "CompilePlot",
    "PlotResult",
    "workers_data",
    "batch_data",
    "util_data",
    "step_time_data",
    "fractions_data",
    "compile_data",
    "render_all",
    "PLOTS",
    "Bar",
    "ComparePlot",
    "compare_data",
    "draw_compare",
]


def draw_compare(c: Comparison, path: Path) -> None:
    """compare.png of ``tunekit compare``: the comparison's data (:func:`compare_data`), drawn."""
    _draw.draw_compare(compare_data(c), path)


class PlotResult(NamedTuple):
    name: str
    title: str
    path: str | None
    """Relative to the run folder; None when not drawn."""
    reason: str
    """Why it was not drawn ("" when drawn)."""


PLOTS: tuple[tuple[str, str, str], ...] = (
    ("workers", "{unit}/s vs num_workers", "workers.png"),
    ("batch", "batch size vs {unit}/s and peak memory", "batch.png"),
    ("utilization", "NVML utilization vs {unit}/s", "utilization.png"),
    ("step_time", "per-{item} step time vs batch size", "step_time.png"),
    ("fractions", "data-wait and GPU-idle fractions vs num_workers", "fractions.png"),
    ("compile", "compile modes", "compile.png"),
)


def render_all(
    plots_dir: Path, rows: list[TrialRow], choice: Choice, title: str, min_headroom: float
) -> list[PlotResult]:
    """Build and draw every plot the run has data for into ``plots_dir`` (a run's ``plots/`` as report.md links
    them); the others are listed with the reason they were skipped, and a stale PNG of theirs is removed."""
    builders: dict[str, tuple[Callable[[], Any], Callable[[Any, Path], None]]] = {
        "workers": (lambda: workers_data(rows, choice, title), _draw.draw_workers),
        "batch": (lambda: batch_data(rows, choice, title, min_headroom), _draw.draw_batch),
        "utilization": (lambda: util_data(rows, choice, title), _draw.draw_util),
        "step_time": (lambda: step_time_data(rows, title), _draw.draw_step_time),
        "fractions": (lambda: fractions_data(rows, choice, title), _draw.draw_fractions),
        "compile": (lambda: compile_data(rows, choice, title), _draw.draw_compile),
    }
    unit = next((r.unit for r in rows if r.ok), "samples")
    results = []
    for name, label, file in PLOTS:
        label = label.format(unit=unit, item=unit.removesuffix("s"))
        build, draw = builders[name]
        data = build()
        path = plots_dir / file
        if isinstance(data, str):
            path.unlink(missing_ok=True)
            results.append(PlotResult(name, label, None, data))
            continue
        draw(data, path)
        results.append(PlotResult(name, label, f"plots/{file}", ""))
    return results
