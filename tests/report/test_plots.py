"""Plot data on saved fixtures (failed and OOM trials included), and every plot of a real run rendered."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analysis.test_analysis import CASES, SELECTION
from tests.conftest import REPO, measurement
from tunekit.analysis import select_knee
from tunekit.records import rows_from_measurements
from tunekit.report import plots

_DEVICE = {"headroom_basis": "device", "device_mem_total_bytes": 100 * 2**30}
GIB = 2**30

RUN = [
    measurement(0, "compute", "compute", 1000, step_time_s=0.064, device_mem_peak_reserved_bytes=10 * GIB, **_DEVICE),
    measurement(
        1,
        "compute",
        "compute",
        1600,
        batch_size=128,
        step_time_s=0.08,
        device_mem_peak_reserved_bytes=20 * GIB,
        **_DEVICE,
    ),
    measurement(2, "compute", "compute", None, status="oom", batch_size=256, **_DEVICE),
    measurement(3, "end_to_end", "train", 200, data_wait_frac=0.8, gpu_busy_frac=0.2, nvml_util_gpu_pct=30.0),
    measurement(
        4, "end_to_end", "train", 900, num_workers=8, data_wait_frac=0.1, gpu_busy_frac=0.85, nvml_util_gpu_pct=80.0
    ),
    measurement(5, "end_to_end", "train", None, status="crashed", num_workers=16),
    measurement(6, "compile", "train", 1000, num_workers=8, compile="default", compile_s=50.0, nvml_util_gpu_pct=85.0),
    measurement(7, "compile", "train", 850, num_workers=8, compile="max-autotune", compile_s=200.0),
]


@pytest.fixture
def run():
    rows = rows_from_measurements(RUN)
    return rows, select_knee([r for r in rows if r.stage in ("end_to_end", "compile")], SELECTION)


def test_batch_data_marks_oom_and_headroom_limit(run):
    rows, knee = run
    data = plots.batch_data(rows, knee, "t", min_headroom=0.10)
    assert [p.batch for p in data.points] == [64, 128] and data.oom == (256,)
    assert data.points[1].peak_gib == pytest.approx(20.0) and data.limit_gib == pytest.approx(90.0)


def test_compile_break_even(run):
    rows, knee = run
    data = plots.compile_data(rows, knee, "t")
    by_mode = {p.mode: p for p in data.points}
    assert list(by_mode) == ["none", "default", "max-autotune"]
    # eager 900/s, compiled 1000/s: 50 s / (1/900 - 1/1000) s per sample = 450,000 samples = 7,031 steps of 64
    assert by_mode["default"].break_even_steps == pytest.approx(7031.25)  # 450,000 / 64, worked out by hand
    assert by_mode["max-autotune"].break_even_steps is None  # slower than eager: never pays off


def test_util_step_time_and_fractions(run):
    rows, knee = run
    util = plots.util_data(rows, knee, "t")
    assert sorted(p.util_pct for p in util.points) == [30.0, 80.0, 85.0]  # failed trials are not points
    steps = plots.step_time_data(rows, "t")
    assert [round(p.ms_per_item, 3) for p in steps.points] == [1.0, 0.625]
    fractions = plots.fractions_data(rows, knee, "t")
    ((label, points),) = fractions.series
    assert [(p.workers, p.data_wait, round(p.gpu_idle, 2)) for p in points] == [(0, 0.8, 0.8), (8, 0.1, 0.15)]


def test_missing_data_gives_reasons_not_empty_plots():
    rows = rows_from_measurements(CASES["one_point"]["trials"])
    knee = select_knee(rows, SELECTION)
    for build in (
        lambda: plots.workers_data(rows, knee, "t"),
        lambda: plots.util_data(rows, knee, "t"),
        lambda: plots.step_time_data(rows, "t"),
        lambda: plots.compile_data(rows, knee, "t"),
    ):
        assert isinstance(build(), str)


def test_workers_data_marks_knee_and_best():
    rows = rows_from_measurements(CASES["plateau"]["trials"])
    data = plots.workers_data(rows, select_knee(rows, SELECTION), "plateau")
    assert sorted(p.workers for s in data.series for p in s.points) == [0, 2, 4, 8, 16]
    assert [s.label for s in data.series] == [
        "pin_memory=off, loading in the main process",
        "pin_memory=off, prefetch=2",
    ]
    # single runs: 4 workers (98.4 % of the best) are not shown within the 3 % tolerance, so the best is the knee
    assert data.knee.workers == 8 and data.best.workers == 8
    assert data.knee_label == "knee: 8 workers, 100.0% of best"


def test_report_rebuilds_every_plot_of_a_real_run(tmp_path: Path):
    """The H200 sweep's study (tests/fixtures/run-h200), rebuilt on a machine without a GPU."""
    run_dir = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "fixtures" / "run-h200", run_dir)
    out = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(run_dir)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    report = (run_dir / "report.md").read_text()
    for _, label, file in plots.PLOTS:
        title = label.format(unit="samples", item="sample")
        png = run_dir / "plots" / file
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", file
        assert f"![{title}](plots/{file})" in report
    # recorded before trials had a rate interval: the gain alone, no interval made up
    assert (
        "**14.20x, " in report
        and "run-to-run spread 5% assumed" in report
        and "NVIDIA H200" in report
        and "skipped: the loader alone gives" in report
    )


def test_batch_data_when_every_batch_failed():
    rows = rows_from_measurements(
        [
            measurement(0, "grid", "train", None, status="oom", batch_size=64),
            measurement(1, "grid", "train", None, status="oom", batch_size=128),
        ]
    )
    assert plots.batch_data(rows, select_knee(rows, SELECTION), "t", 0.1) == "no batch size completed"


def test_a_knee_at_a_smaller_batch_is_marked_on_the_swept_workers_axis():
    """The batch stage can move the knee to a smaller batch measured at one worker count only: the workers plot
    stays at the swept batch, names the knee's batch, and draws that batch's trial as a series of its own."""
    from tunekit.analysis import select_knee
    from tunekit.config import Selection
    from tunekit.records import rows_from_measurements
    from tunekit.report.plots import workers_data

    def t(n, w, batch, sps, stage="end_to_end"):
        return {
            "number": n,
            "stage": stage,
            "mode": "train",
            "status": "ok",
            "version": 2,
            "rate": sps,
            "noise_cv": 0.01,
            "headroom": 0.5,
            "params": {
                "num_workers": w,
                "prefetch_factor": 2 if w else None,
                "pin_memory": False,
                "batch_size": batch,
                "grad_accum": 1,
                "compile": "none",
            },
        }

    rows = rows_from_measurements(
        [t(0, 0, 512, 200), t(1, 8, 512, 1500), t(2, 16, 512, 2500), t(3, 16, 256, 2800, stage="batch")]
    )
    knee = select_knee(rows, Selection(tolerance=0.03, min_headroom=0.1))
    plot = workers_data(rows, knee, "t")
    assert not isinstance(plot, str)
    swept = [s for s in plot.series if not s.other_batch]
    assert sorted(p.workers for s in swept for p in s.points) == [0, 8, 16]
    # the batch-256 trial is drawn too, as a series of its own named by its batch
    assert [(s.label, [p.trial for p in s.points]) for s in plot.series if s.other_batch] == [
        ("pin_memory=off, prefetch=2, batch 256", [3])
    ]
    assert plot.knee_label == "knee: 16 workers, batch 256, 100.0% of best"
    assert plot.best_label == "best (batch 256)"


def test_the_workers_plot_labels_series_by_the_user_defined_knobs_they_set():
    from tests.conftest import measurement, sleepy_config
    from tunekit import config
    from tunekit.analysis import select
    from tunekit.records import rows_from_measurements
    from tunekit.report.plots._data import workers_data

    key = "workload.dataset_args.sample_wait_s"
    cfg = config.from_dict(
        sleepy_config(**{"search.extra": {key: {"values": [0.005, 0.001], "changes_result": False}}})
    )
    rows = rows_from_measurements(
        [
            measurement(0, "end_to_end", "train", 100, batch_size=8),
            measurement(1, "end_to_end", "train", 300, num_workers=2, batch_size=8),
            measurement(2, "extra", "train", 400, num_workers=2, batch_size=8, extra={key: 0.001}),
        ]
    )
    labels = [s.label for s in workers_data(rows, select(cfg, rows), "t").series]
    assert "pin_memory=off, prefetch=2, dataset_args.sample_wait_s=0.001" in labels
    assert "pin_memory=off, prefetch=2" in labels


def test_the_workers_plot_draws_skipped_configs_at_their_bound_and_the_knees_own_ceiling(tmp_path: Path):
    """Skipped end-to-end configs are drawn at the bound the plan inferred (the loader ceiling of trial 3: at most
    150/s at 2 workers); the axis batch's compute ceiling is named by its batch, and the knee's batch (256, the
    batch stage) has its own ceiling line; a loader ceiling 200x the slowest point puts the plot on a log scale,
    worker counts get integer ticks, and the PNG renders."""
    import matplotlib.pyplot as plt

    from tunekit.report.plots._draw import draw_workers, log_scale, workers_figure

    ms = [
        measurement(0, "compute", "compute", 3000, batch_size=512),
        measurement(1, "compute", "compute", 2900, batch_size=256),
        measurement(2, "loader", "loader", 40000, num_workers=16, batch_size=512),
        measurement(3, "loader", "loader", 150, num_workers=2, batch_size=512),
        measurement(4, "end_to_end", "train", 2500, num_workers=16, batch_size=512),
        measurement(5, "end_to_end", "train", 100, num_workers=0, batch_size=512),
        {
            **measurement(6, "end_to_end", "train", None, status="skipped", num_workers=2, batch_size=512),
            "skip_bound": 150.0,
            "skip_bound_trial": 3,
        },
        measurement(7, "end_to_end", "train", 2600, num_workers=8, batch_size=512),
        measurement(8, "batch", "train", 2700, num_workers=8, batch_size=256),
    ]
    rows = rows_from_measurements(ms)
    choice = select_knee([r for r in rows if r.stage in ("end_to_end", "batch")], SELECTION)
    plot = plots.workers_data(rows, choice, "t")
    assert not isinstance(plot, str)
    assert [(p.workers, p.rate, p.trial) for p in plot.bounded] == [(2, 150.0, 3)]
    assert plot.compute_label == "compute ceiling (batch 512)" and plot.compute_ceiling == 3000
    assert choice.knee.knobs.batch_size == 256
    assert plot.knee_ceiling == 2900 and plot.knee_ceiling_label == "compute ceiling at the knee's batch 256"
    assert log_scale(plot)  # 40000 against 100
    fig, ax = workers_figure(plot)
    assert ax.get_yscale() == "log"
    assert all(float(t).is_integer() for t in ax.get_xticks())  # whole worker counts only
    labels = ax.get_legend_handles_labels()[1]
    assert "skipped: at most this (the bound the plan inferred)" in labels
    assert "compute ceiling at the knee's batch 256" in labels
    plt.close(fig)
    path = tmp_path / "workers.png"
    draw_workers(plot, path)
    assert path.stat().st_size > 10_000


def test_drawing_leaves_the_callers_matplotlib_alone(run, tmp_path: Path):
    """tunekit.sweep in a notebook: the plots are drawn outside pyplot, so the caller's backend stays and their open
    figures stay open (matplotlib.use switches the backend and closes every pyplot figure)."""
    import matplotlib
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    plt.switch_backend("svg")
    mine = plt.figure()
    try:
        results = plots.render_all(tmp_path, *run, "t", 0.1)
        assert [r.path for r in results if r.path] and all(
            (tmp_path / r.path.removeprefix("plots/")).stat().st_size for r in results if r.path
        )
        assert matplotlib.get_backend() == "svg" and plt.fignum_exists(mine.number)
    finally:
        plt.close(mine)
        plt.switch_backend(before)


def test_the_scripts_own_settings_are_marked_and_each_point_carries_its_interval():
    """Script mode: the workers and batch plots label the script's own settings ("your script: 2 workers, batch
    32"); a point's bars are its rate's 95 % interval (4 % here), or its windows' range when it has none; the
    fractions plot's axis ticks whole workers only."""
    from tests.conftest import measurement
    from tunekit.analysis import select_knee
    from tunekit.config import Selection
    from tunekit.records import rows_from_measurements
    from tunekit.report.plots import workers_data
    from tunekit.report.plots._data import batch_data, fractions_data
    from tunekit.report.plots._draw import fractions_figure, workers_figure

    rows = rows_from_measurements(
        [
            measurement(0, "compute", "compute", 3000, batch_size=32),
            measurement(1, "compute", "compute", 5000, batch_size=64),
            measurement(2, "baseline", "train", 900, num_workers=2, batch_size=32, rate_interval=0.04),
            measurement(3, "end_to_end", "train", 1800, num_workers=4, batch_size=32, rate_interval=0.04),
            measurement(4, "end_to_end", "train", 2600, num_workers=8, batch_size=32),
        ]
    )  # no interval: its windows
    choice = select_knee(rows, Selection(tolerance=0.03, min_headroom=0.1))
    plot = workers_data(rows, choice, "t")
    assert plot.own_label == "your script: 2 workers, batch 32" and plot.own.trial == 2
    points = {p.trial: p for s in plot.series for p in s.points}
    assert (points[3].low, points[3].high) == (pytest.approx(1800 * 0.96), pytest.approx(1800 * 1.04))
    assert (points[4].low, points[4].high) == (2600 * 0.98, 2600 * 1.01)  # conftest's windows: 0.98, 1, 1.01
    assert plot.own_label in workers_figure(plot)[1].get_legend_handles_labels()[1]
    batch = batch_data(rows, choice, "t", min_headroom=0.1)
    assert batch.own == 32 and batch.own_label == "your script: 2 workers, batch 32"
    few = rows_from_measurements(
        [
            measurement(0, "end_to_end", "train", 300, num_workers=0),
            measurement(1, "end_to_end", "train", 500, num_workers=1),
        ]
    )
    fig, ax = fractions_figure(fractions_data(few, select_knee(few, Selection(tolerance=0.03, min_headroom=0.1)), "t"))
    ax.figure.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(t == int(t) for t in ticks), ticks  # 0 and 1 workers: no 0.2, 0.4, ... ticks
    import matplotlib.pyplot as plt

    plt.close(fig)
