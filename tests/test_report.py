"""Selection with a target effective batch (summarize), on fixtures."""

from __future__ import annotations

from tests.conftest import sleepy_config
from tests.test_plan import _m
from tunekit import config
from tunekit.records import rows_from_measurements
from tunekit.report import summarize


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
    s = summarize(cfg, rows, strategy="staged")
    assert s.choice.knee.number == 6 and s.defaults.number == 2
    assert s.speedup_vs_defaults == 570 / 80


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
    s = summarize(cfg, rows, strategy="staged")
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


def _script_run(own: float, *rates: float):
    """A script sweep: the script's own settings (2 workers, batch 32) at ``own``, and end-to-end configs of 4, 8,
    ... workers at ``rates``, each rate known within 2 % (its 95 % interval)."""
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
    return summarize(config.from_dict(raw), rows, strategy="staged")


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
    twice = _script_run(500, 1000, 1010)
    assert not twice.choice.kept and twice.choice.knee.knobs.num_workers == 4
    assert twice.speedup_vs_script == 2.0
    # the gain with its interval: the two rates' 2 % half-widths in quadrature, 2.83 %
    assert twice.gain_text(twice.script_baseline) == "2.00x, 1.94-2.06x at 95 %"
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
        return summarize(config.from_dict(raw), rows, strategy="staged").choice

    input_bound = run(3000.0)
    assert (input_bound.knee.knobs.num_workers, input_bound.knee.knobs.batch_size) == (8, 32), input_bound.reason
    assert input_bound.reason.startswith("Your batch: ") and "33% of its compute ceiling" in input_bound.reason
    compute_bound = run(1050.0)
    assert (compute_bound.knee.knobs.num_workers, compute_bound.knee.knobs.batch_size) == (4, 16)
