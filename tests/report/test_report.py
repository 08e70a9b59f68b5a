"""A sweep's summary and outputs on fixtures (tunekit/report/): selection with a target effective batch, the unit
of every figure, the FLOP share and the output per unit of money, a disturbed run said first, and a run's outputs
written all or none."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import tunekit
from tests.conftest import repeated, sleepy_config
from tests.diagnosis.test_diagnosis import FLOPS, _run
from tests.plan.test_plan import _m
from tunekit import config
from tunekit.records import rows_from_measurements
from tunekit.report import flop_summary, money_summary, summarize
from tunekit.report._markdown import _costs, report_md
from tunekit.report._recommendation import recommendation_yaml


def repeated_rows(rows: list) -> list:
    """``rows`` with each end-to-end config measured three times in alternated blocks (``tests.conftest.repeated``)."""
    return rows_from_measurements(repeated([r.measurement.to_dict() for r in rows]))


def _cfg():
    return config.from_dict(
        sleepy_config(**{"search.batch_size": [64, 128, 256], "search.target_effective_batch": 256})
    )


def test_target_with_one_fitting_micro_batch_still_recommends():
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 900, batch_size=64),
            _m(1, "compute", "compute", None, status="oom", batch_size=128),
            _m(2, "accumulation", "train", 700, batch_size=64, grad_accum=4, num_workers=4),
        ]
    )
    s = summarize(_cfg(), rows, strategy="staged")
    assert s.choice.knee is not None and (s.choice.knee.knobs.batch_size, s.choice.knee.knobs.grad_accum) == (64, 4)


def test_target_never_reached_gives_no_recommendation():
    rows = rows_from_measurements(
        [
            _m(0, "end_to_end", "train", 700, batch_size=64, num_workers=4),
            _m(1, "end_to_end", "train", 300, batch_size=64),
        ]
    )
    s = summarize(_cfg(), rows, strategy="staged")
    assert s.choice.knee is None and "target_effective_batch = 256" in s.choice.reason


def test_a_knee_moved_to_a_smaller_batch_keeps_the_defaults_baseline_and_no_overhead_verdict():
    """The batch stage moves the knee from batch 64 (where the defaults ran) to 32: the report still compares with
    the defaults, names their batch, and does not tell a data-bound knee to grow its batch."""
    from tunekit.report._markdown import _recommendation

    cfg = config.from_dict(sleepy_config(**{"search.batch_size": [32, 64], "search.num_workers": [0, 8]}))
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 600, batch_size=32),
            _m(1, "compute", "compute", 1000, batch_size=64),
            _m(2, "end_to_end", "train", 400, num_workers=8, batch_size=64),
            _m(3, "end_to_end", "train", 80, batch_size=64),
            _m(4, "batch", "train", 450, num_workers=8, batch_size=32),
        ]
    )
    s = summarize(cfg, rows, strategy="staged")
    assert s.choice.knee.number == 4 and s.defaults.number == 3
    assert s.speedup_vs_defaults == 450 / 80
    assert "PyTorch defaults (0 workers, no pinning, batch 64): 80.0 samples/s" in "\n".join(_recommendation(s))
    assert "overhead-bound" not in [v.name for v in s.verdicts]


def test_the_defaults_baseline_is_the_jobs_own_pipeline_not_a_user_knobs_zero_worker_trial():
    """The fewer-workers walk after a user knob ends at 0 workers with that knob set, at the knee's batch: that is
    another pipeline, so the speed-up is still counted from the defaults trial of the job's own pipeline."""
    extra = {"workload.dataset_args.sample_wait_s": {"values": [0.005, 0.001], "changes_result": False}}
    cfg = config.from_dict(
        sleepy_config(**{"search.batch_size": [32, 64], "search.num_workers": [0, 8], "search.extra": extra})
    )
    fast = {"workload.dataset_args.sample_wait_s": 0.001}
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 600, batch_size=32),
            _m(1, "compute", "compute", 1000, batch_size=64),
            _m(2, "end_to_end", "train", 80, batch_size=64),
            _m(3, "end_to_end", "train", 400, num_workers=8, batch_size=64),
            _m(4, "batch", "train", 420, num_workers=8, batch_size=32),
            _m(5, "extra", "train", 580, num_workers=8, batch_size=32, extra=fast),
            _m(6, "extra", "train", 570, batch_size=32, extra=fast),
        ]
    )
    s = summarize(cfg, repeated_rows(rows), strategy="staged")
    assert s.choice.knee.number == 6 and s.defaults.number == 2
    assert s.speedup_vs_defaults == pytest.approx(570 / 80)


def test_the_report_sets_the_knees_costs_beside_the_best_the_knee_before_the_knobs_and_the_defaults():
    """A user knob moved the knee from 8 workers to none: the table shows what each config used, so the saving the
    cheaper knee buys is in figures (workers, CPU cores, host and device memory), and a byte count the allocator
    keeps for itself (under 1 MiB) reads as no pinned memory."""
    from tunekit.report._markdown import _costs

    extra = {"workload.dataset_args.sample_wait_s": {"values": [0.005, 0.001], "changes_result": False}}
    cfg = config.from_dict(
        sleepy_config(**{"search.batch_size": [32], "search.num_workers": [0, 8], "search.extra": extra})
    )
    fast = {"workload.dataset_args.sample_wait_s": 0.001}
    gib = 2**30
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 1000, batch_size=32),
            _m(1, "end_to_end", "train", 80, batch_size=32, cpu_util_cores=1.0, host_mem_peak_bytes=gib),
            _m(
                2,
                "end_to_end",
                "train",
                400,
                num_workers=8,
                batch_size=32,
                cpu_util_cores=7.5,
                host_mem_peak_bytes=3 * gib,
                pinned_peak_bytes=gib // 2,
                device_mem_peak_reserved_bytes=2 * gib,
            ),
            _m(3, "extra", "train", 590, num_workers=8, batch_size=32, extra=fast, cpu_util_cores=2.5),
            _m(4, "extra", "train", 580, batch_size=32, extra=fast, cpu_util_cores=1.2, pinned_peak_bytes=1),
        ]
    )
    s = summarize(cfg, repeated_rows(rows), strategy="staged")
    assert (s.choice.knee.number, s.choice.best.number, s.knee_before_extra.number, s.defaults.number) == (4, 3, 2, 1)
    table = _costs(s)
    assert [line.split(" | ")[0] for line in table[2:-1]] == [
        "| knee",
        "| best",
        "| knee before your knobs",
        "| PyTorch defaults",
    ]
    assert table[2] == "| knee | 4 | 580.0 | 0 | 1.2 | — | — | — |"
    assert table[4] == "| knee before your knobs | 2 | 400.0 | 8 | 7.5 | 3.00 | 0.50 | 2.00 |"


def test_a_run_counting_tokens_never_labels_its_rates_samples(tmp_path):
    """Throughput is items of workload.unit: with tokens, the report, its plot titles, the verdicts' evidence, the
    trials.csv columns and recommended.yaml say tokens (or the unit-free names rate, items_per_money)."""
    import pandas as pd
    import yaml

    from tests.conftest import measurement
    from tunekit.report import write_outputs

    cfg = config.from_dict(
        sleepy_config(
            **{
                "workload.unit": "tokens",
                "search.batch_size": [32, 64],
                "search.num_workers": [0, 2, 4],
                "cost.per_hour": 3.6,
            }
        )
    )
    tokens = {
        "unit": "tokens",
        "worker_cpu_per_item_s": 1e-5,
        "worker_wall_per_item_s": 1e-3,
        "nvml_util_gpu_pct": 50.0,
        "step_time_s": 0.1,
    }
    rows = rows_from_measurements(
        [
            measurement(0, "compute", "compute", 90_000, batch_size=64, **tokens),
            measurement(1, "compute", "compute", 30_000, batch_size=32, **tokens),
            measurement(2, "end_to_end", "train", 20_000, batch_size=64, data_wait_frac=0.7, **tokens),
            measurement(3, "end_to_end", "train", 40_000, batch_size=64, num_workers=2, data_wait_frac=0.5, **tokens),
            measurement(4, "end_to_end", "train", 60_000, batch_size=64, num_workers=4, data_wait_frac=0.3, **tokens),
        ]
    )
    s = summarize(cfg, rows, strategy="staged")
    write_outputs(tmp_path, s, {})
    report = (tmp_path / "report.md").read_text()
    assert "tokens/s" in report and "per-token step time" in report
    for said in ("samples/s", "per-sample", "per sample", "samples per"):
        assert said not in report, said
    columns = set(pd.read_csv(tmp_path / "trials.csv").columns)
    assert {"rate", "unit", "items_per_money", "rate_windows"} <= columns
    assert not [c for c in columns if "sample" in c]
    evidence = yaml.safe_load((tmp_path / "recommended.yaml").read_text())["evidence"]
    assert evidence["unit"] == "tokens" and evidence["rate"] == 60_000 and evidence["items_per_money"] > 0
    assert not [k for k in evidence if "sample" in k]


def test_an_epoch_ending_inside_a_trial_is_warned_with_what_it_cost():
    """Workers kept across epochs (script mode records it) only refill their queues; others restart."""
    from tests.conftest import measurement
    from tunekit.report._markdown import report_md

    rows = rows_from_measurements(
        [
            measurement(
                0,
                "end_to_end",
                "train",
                700,
                num_workers=4,
                epochs_ended=3,
                loader_measured={"persistent_workers": True},
            ),
            measurement(1, "end_to_end", "train", 650, num_workers=2, epochs_ended=2),
        ]
    )
    md = report_md(summarize(config.from_dict(sleepy_config()), rows, strategy="staged"), [], {})
    assert (
        "trial 0: the loader's epoch ended 3 time(s) inside the trial; its workers persist, and each refill of "
        "their queues for the next epoch is part of the measurement"
    ) in md
    assert "trial 1: the loader's epoch ended 2 time(s) inside the trial; each restart of its workers is part" in md


def test_the_knees_rate_over_the_scripts_real_epoch_length():
    """``script.epoch_items``: trials ran 28,672-image epochs with 1.76 s between them; over the script's real epochs
    of 1,281,167 images the same boundary weighs less: 1,281,167 / (1,281,167 / 4,549 + 1.76) = 4,521/s."""
    from tests.conftest import measurement
    from tunekit.report._markdown import report_md

    raw = {
        "name": "real",
        "device": "cpu",
        "script": {"command": ["python", "train.py", "-j", "{num_workers}"], "cwd": "/tmp", "epoch_items": 1_281_167},
        "search": {"num_workers": [8, 16], "batch_size": [128], "pin_memory": [False]},
    }
    parts = {
        "rate_in_epoch": 4549.0,
        "boundary_s": 1.76,
        "epoch_boundaries": 3,
        "epoch_items": 28672.0,
        "rate_whole_epoch": 28672 / (28672 / 4549 + 1.76),
    }
    rows = rows_from_measurements(
        [
            measurement(0, "end_to_end", "train", parts["rate_whole_epoch"], num_workers=16, batch_size=128, **parts),
            measurement(1, "end_to_end", "train", 900, num_workers=8, batch_size=128),
        ]
    )
    md = report_md(summarize(config.from_dict(raw), rows, strategy="staged"), [], {})
    assert "over whole epochs of 28,672 samples" in md
    assert (
        "Over your real epochs of 1,281,167 samples (script.epoch_items), the same boundary between them: "
        f"{1_281_167 / (1_281_167 / 4549 + 1.76):,.0f} samples/s" in md
    ), md
    assert "samples: the figure the knee is chosen by." in md
    # the knee measured again: its parts are its first run's, and its figure the runs' mean, said so
    again = measurement(2, "end_to_end", "train", 4000.0, num_workers=16, batch_size=128, run=1)
    md = report_md(summarize(config.from_dict(raw), rows + rows_from_measurements([again]), strategy="staged"), [], {})
    mean = (parts["rate_whole_epoch"] + 4000.0) / 2
    assert (
        f"samples: its first completed run's; the knee is chosen by its 2 runs' mean, {mean:,.0f} samples/s." in md
    ), md


def _script_run(own: float, *rates: float, runs: bool = False):
    """A script sweep: the script's own settings (2 workers, batch 32) at ``own``, and end-to-end configs of 4, 8,
    ... workers at ``rates``, each rate known within 2 % (its windows' 95 % interval); with ``runs``, each measured
    three times in alternated blocks."""
    from tests.conftest import measurement

    raw = {
        "name": "own",
        "device": "cpu",
        "script": {"command": ["python", "train.py", "-j", "{num_workers}"], "cwd": "/tmp"},
        "search": {"num_workers": [4, 8, 16], "batch_size": [32], "pin_memory": [False]},
    }
    rows = rows_from_measurements(
        [
            measurement(0, "baseline", "train", own, num_workers=2, batch_size=32, rate_interval=0.02),
            *(
                measurement(i + 1, "end_to_end", "train", rate, num_workers=4 * 2**i, batch_size=32, rate_interval=0.02)
                for i, rate in enumerate(rates)
            ),
        ]
    )
    return summarize(config.from_dict(raw), repeated_rows(rows) if runs else rows, strategy="staged")


def test_keep_your_settings_when_no_config_beats_them_beyond_doubt():
    """The script's own settings at 1000/s, the configs tried at 1010 and 1015/s: within the 4 % two 2 % intervals
    allow, so the recommendation is to keep them (it was the cheapest of the others, with a gain claimed); a config
    measured slower than them is never recommended, and neither is the one config a short sweep measured."""
    import yaml

    from tunekit.report._markdown import report_md
    from tunekit.report._recommendation import recommendation_yaml

    for s in (_script_run(1000, 1010, 1015), _script_run(1000, 900), _script_run(1000, 1030, 990)):
        assert s.choice.kept and s.choice.knee.stage == "baseline", s.choice.reason
        assert s.choice.reason.startswith("Keep your settings: no config measured beats the script's own")
        md = report_md(s, [], {})
        assert "**Keep your settings: 2 workers" in md and "they are the recommendation" in md
        rec = yaml.safe_load(recommendation_yaml(s))
        assert rec["dataloader"]["num_workers"] == 2 and rec["evidence"]["keep_own_settings"] is True


def test_a_gain_beyond_doubt_is_recommended_and_one_config_is_compared_with_the_scripts_own():
    twice = _script_run(500, 1000, 600, runs=True)  # 4 workers the best and the knee, twice the own settings
    assert not twice.choice.kept and twice.choice.knee.knobs.num_workers == 4
    assert twice.speedup_vs_script == pytest.approx(2.0)
    # the gain with its interval and what it rests on: the two blocks after the first, paired
    gain = twice.gain(twice.script_baseline)
    assert gain.low < 2.0 < gain.high and gain.blocks == 2
    assert twice.gain_text(twice.script_baseline).startswith(f"2.00x, {gain.low:.2f}-{gain.high:.2f}x at 95 % (paired")
    one = _script_run(500, 1000)  # a sweep cut short: one config measured end to end, besides the script's own
    assert one.choice.knee is not None and one.choice.knee.knobs.num_workers == 4 and not one.choice.kept
    assert "runs 2.00x theirs" in one.choice.reason


def test_the_scripts_batch_is_kept_where_the_step_is_not_the_bound():
    """The cheapest config within the band changes the script's batch 32 to 16, but runs at 33 % of its compute
    ceiling: the input pipeline is the bound, so the batch changes the rate by no more than noise, and the cheapest
    config at the script's own batch within the same band is taken, saying why. Where the step is the bound (the
    knee at 95 % of its ceiling), the knee stands."""
    from tests.conftest import measurement

    raw = {
        "name": "own",
        "device": "cpu",
        "script": {"command": ["python", "train.py", "-j", "{num_workers}", "-b", "{batch_size}"], "cwd": "/tmp"},
        "search": {"num_workers": [4, 8], "batch_size": [16, 32], "pin_memory": [False]},
    }

    def run(ceiling: float):
        rows = rows_from_measurements(
            [
                measurement(0, "compute", "compute", ceiling, batch_size=16),
                measurement(1, "baseline", "train", 500, num_workers=2, batch_size=32),
                measurement(2, "end_to_end", "train", 1000, num_workers=4, batch_size=16, rate_interval=0.01),
                measurement(3, "end_to_end", "train", 995, num_workers=8, batch_size=32, rate_interval=0.01),
                measurement(4, "end_to_end", "train", 1010, num_workers=8, batch_size=16, rate_interval=0.01),
            ]
        )
        return summarize(config.from_dict(raw), repeated_rows(rows), strategy="staged").choice

    input_bound = run(3000.0)
    assert (input_bound.knee.knobs.num_workers, input_bound.knee.knobs.batch_size) == (8, 32), input_bound.reason
    assert input_bound.reason.startswith("Your batch: ") and "33% of its compute ceiling" in input_bound.reason
    compute_bound = run(1050.0)
    assert (compute_bound.knee.knobs.num_workers, compute_bound.knee.knobs.batch_size) == (4, 16)


def test_the_share_and_the_output_per_money_in_the_report_the_evidence_and_the_console():
    s = _run(500e12, **{"cost.per_hour": 3.6})
    knee = s.choice.knee
    assert (knee.number, s.choice.best.number, s.defaults.number) == (3, 4, 2)
    assert s.flop_share(knee) == pytest.approx(4800 * FLOPS / 500e12)
    said = (
        "Model FLOP utilisation: the knee 23.0%, its compute ceiling (batch 512) 24.0% of this device's "
        "measured matmul peak (24.0 GFLOP per sample, forward and backward, counted with FlopCounterMode, "
        "grouped convolutions' backward corrected; peak 500.0 TFLOP/s in bf16, trial 0; datasheet 989.0 "
        "TFLOP/s)."
    )
    assert flop_summary(s) == said
    md = report_md(s, [], {})
    assert said in md
    assert "**8 workers, prefetch 2, not pinned, batch 512** — 4,800,000 samples per unit of money at 4800.0 " in md
    assert (
        "- matmul peak in bf16: 500.0 TFLOP/s sustained on NVIDIA H200 (cuda:0), measured in trial 0; datasheet "
        "989.0 TFLOP/s" in md
    )
    trial_1 = next(line for line in md.splitlines() if line.startswith("| 1 | compute"))
    assert "| 19.2% |" in trial_1  # the share at each batch (and compile mode): a column of the trials table
    costs = _costs(s)
    assert "samples per unit of money" in costs[0]
    assert costs[2].startswith("| knee | 3 | 4800.0 | 4,800,000 | ") and costs[3].startswith(
        "| best | 4 | 4900.0 | 4,900,000 | "
    )
    evidence = yaml.safe_load(recommendation_yaml(s))["evidence"]
    assert list(evidence)[:4] == ["unit", "items_per_money", "rate", "flop_share"]
    assert evidence["items_per_money"] == 4_800_000 and evidence["best_items_per_money"] == 4_900_000
    assert evidence["defaults_items_per_money"] == 1_000_000
    assert evidence["flop_share"] == pytest.approx(0.2304)
    assert evidence["model_flops"] == {
        "flops_per_item": FLOPS,
        "flops_reason": None,
        "uncertain_backward_ratio": None,
        "share_of_peak": 0.2304,
        "ceiling_share_of_peak": 0.24,
        "ceiling_trial": 0,
        "matmul_peak_flops": 500e12,
        "matmul_peak_precision": "bf16",
        "matmul_peak_trial": 0,
        "datasheet_flops": 989e12,
    }
    assert money_summary(s) == (
        "4,800,000 samples per unit of money at 4800.0 samples/s (cost.per_hour 3.6); best "
        "4,900,000, defaults 1,000,000."
    )
    assert money_summary(_run(500e12)) is None  # no price, no money
    tokens = flop_summary(
        _run(500e12, **{"workload.unit": "tokens", "workload.count": "tunekit.workloads.text:count_tokens"})
    )
    assert (
        "forward and backward, counted with FlopCounterMode, grouped convolutions' backward corrected, on one "
        "batch, its padding's work included: shares "
        "of executed FLOPs" in tokens
    )  # the tokens counted are not the positions the model computed on


def _tiny_run(write_config, out: Path) -> None:
    cfg = write_config(sleepy_config(**{"search.num_workers": [0, 1], "trial.window_s": 0.3, "strategy": "grid"}))
    done = tunekit.sweep(cfg, out=out)
    assert done.recommendation is not None, done.reason


def test_report_refuses_a_symlink_among_the_outputs_and_writes_nothing_outside(write_config, tmp_path: Path):
    import subprocess
    import sys

    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    _tiny_run(write_config, out)
    elsewhere.mkdir()
    (elsewhere / "keep.png").write_bytes(b"not tunekit's")
    import shutil

    shutil.rmtree(out / "plots")
    (out / "plots").symlink_to(elsewhere)
    refused = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(out)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "symlink" in line and str(out / "plots") in line
    assert [p.name for p in elsewhere.iterdir()] == ["keep.png"]  # nothing written there, nothing deleted


def test_outputs_are_all_written_or_none(write_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A run whose report cannot be rendered (here: a figure that raises) keeps its earlier outputs as they were:
    no recommended.yaml rewritten beside a stale report.md."""
    from tunekit import driver, report

    out = tmp_path / "run"
    _tiny_run(write_config, out)
    before = {name: (out / name).read_bytes() for name in ("trials.csv", "recommended.yaml", "report.md")}
    (out / "recommended.yaml").write_text("# edited by hand\n")

    def broken(*args, **kwargs):
        raise ValueError("a figure could not be drawn")

    monkeypatch.setattr(report, "report_md", broken)
    with pytest.raises(ValueError, match="could not be drawn"):
        driver.rebuild(out)
    assert (out / "recommended.yaml").read_text() == "# edited by hand\n"
    assert (out / "report.md").read_bytes() == before["report.md"] and (out / "plots").is_dir()
    assert not (out / ".plots.new").exists()


def test_a_disturbed_run_says_so_first_everywhere(tmp_path: Path):
    """The quickstart on a busy 2-core box: windows scattered 20-50 %, the band widened past 10 %, and a knee read
    201 % of its own compute ceiling. report.md, recommended.yaml and the console say so before anything else."""
    from tests.conftest import measurement
    from tunekit.records import rows_from_measurements
    from tunekit.report import summarize, write_outputs

    cfg = config.from_dict(sleepy_config())
    rows = rows_from_measurements(
        [
            measurement(0, "compute", "compute", 100, batch_size=8, noise_cv=0.3),
            measurement(1, "end_to_end", "train", 201, batch_size=8, num_workers=2, noise_cv=0.35),
            measurement(2, "end_to_end", "train", 160, batch_size=8, num_workers=0, noise_cv=0.45),
        ]
    )
    s = summarize(cfg, rows, strategy="staged")
    assert s.choice.band > 0.10
    assert any("noise band" in d and "pick is uncertain" in d for d in s.disturbances)
    assert any("trial 1 ran at 201% of its own compute ceiling" in d for d in s.disturbances)
    write_outputs(tmp_path, s, {})
    report = (tmp_path / "report.md").read_text().splitlines()
    assert report[4].startswith("**Disturbed:**")  # under the title and the line that describes the run
    rec_text = (tmp_path / "recommended.yaml").read_text()
    assert rec_text.splitlines()[1].startswith("# DISTURBED:")
    assert yaml.safe_load(rec_text)["evidence"]["disturbed"] == list(s.disturbances)
    quiet = summarize(
        cfg,
        rows_from_measurements(
            [
                measurement(0, "compute", "compute", 300, batch_size=8),
                measurement(1, "end_to_end", "train", 201, batch_size=8, num_workers=2),
                measurement(2, "end_to_end", "train", 160, batch_size=8, num_workers=0),
            ]
        ),
        strategy="staged",
    )
    assert quiet.disturbances == ()


def test_a_study_holding_nan_or_negative_figures_is_data_not_a_raw_error(write_config, tmp_path: Path):
    """A study.db whose record of a trial holds NaN and negative figures (edited, corrupted): `tunekit report` gave
    a raw StatisticsError and wrote nothing; it now reads that trial as bad_output, naming it and the field, and
    writes every output."""
    import json
    import sqlite3
    import subprocess
    import sys

    out = tmp_path / "run"
    _tiny_run(write_config, out)
    db = sqlite3.connect(out / "study.db")
    ((trial_id, text),) = db.execute(
        "select trial_id, value_json from trial_user_attributes where key = "
        "'measurement' and value_json like '%\"number\": 1,%'"
    ).fetchall()
    record = json.loads(text)
    record.update(rate=float("nan"), noise_cv=-0.5, rate_windows=[float("nan"), -3.0])
    db.execute(
        "update trial_user_attributes set value_json = ? where trial_id = ? and key = 'measurement'",
        (json.dumps(record), trial_id),
    )
    db.commit()
    db.close()
    done = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Error" not in done.stderr
    report = (out / "report.md").read_text()
    assert "bad_output: study.db's record of trial 1 is not a measurement: rate = nan" in report


def test_a_repeat_that_failed_is_named_with_its_reason():
    """The knee's repeat crashed, the defaults' repeat completed: the report names the crashed one, its run and its
    reason, beside the runs that make the spread (it adds nothing to it)."""
    from tests.conftest import measurement

    rows = rows_from_measurements(
        [
            measurement(0, "end_to_end", "train", 700, num_workers=4),
            measurement(1, "end_to_end", "train", 300),
            measurement(2, "end_to_end", "train", None, status="failed", num_workers=4, run=1, reason="exit 1"),
            measurement(3, "end_to_end", "train", 310, run=1),
        ]
    )
    md = report_md(summarize(config.from_dict(sleepy_config()), rows, strategy="staged"), [], {})
    assert "Measured again in alternation on this machine: 0 workers" in md and "300.0, 310.0" in md
    line = next(x for x in md.splitlines() if x.startswith("Repeats that did not complete"))
    assert "4 workers" in line and "(trial 2, run 1): failed, exit 1" in line, line
