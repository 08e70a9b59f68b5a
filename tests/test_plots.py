from __future__ import annotations

from pathlib import Path

from tests.test_analysis import CASES, SELECTION
from tunekit.analysis import rows_from_measurements, select_knee
from tunekit.plots import draw_workers, workers_plot


def test_workers_plot_data_marks_knee_and_best(tmp_path: Path):
    rows = rows_from_measurements(CASES["plateau"]["trials"])
    knee = select_knee(rows, SELECTION)
    data = workers_plot(rows, knee, "plateau")
    assert data is not None
    assert [p.workers for p in data.series[0].points] == [0, 2, 4, 8, 16]
    assert data.knee.workers == 4 and data.best.workers == 8
    assert data.knee_label == "knee: 4 workers, 98% of best"
    draw_workers(data, tmp_path / "plots" / "workers.png")
    assert (tmp_path / "plots" / "workers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_workers_plot_is_skipped_without_two_worker_counts():
    rows = rows_from_measurements(CASES["one_point"]["trials"])
    assert workers_plot(rows, select_knee(rows, SELECTION), "x") is None
