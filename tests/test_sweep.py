"""End-to-end sweeps on the CPU with a workload whose knee is known: real subprocess trials, a real optuna study.
The sweeps run through ``tunekit.sweep`` in this process (its trials forked by the fork server the tests share);
the command line's own promises (exit codes, what it prints, signals) are tested through ``tunekit sweep``.

sleepy_dataset costs 10 ms per sample and sleepy_model 20 ms per step of 8 samples, so end to end the loader gives
W x 100 samples/s and the model caps it at 400: 0 workers 80/s, 2 -> 200/s, 6 -> 400/s, 8 -> 400/s.
The true knee is 6 workers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

import tunekit
from tests.conftest import sleepy_config, study_trials, trial_number
from tunekit import rules

pytestmark = pytest.mark.slow  # whole sweeps, tens of seconds each

PLATEAU = (6, 8)
"""The analytic plateau of _knee_config: 8 samples per 20 ms step cap it at 400/s; W workers at 10 ms per sample
deliver W x 100/s, so 6 and 8 workers both reach it, and 6 (the cheaper) is the knee on a quiet box."""


def _check_knee(rec: tunekit.Recommended, trials: pd.DataFrame) -> None:
    """The recommendation is on the plateau and is the cheapest end-to-end config within its band of the best:
    exact on a quiet box, and still true when noise on a loaded one widens the band or moves a point."""
    assert rec.num_workers in PLATEAU
    assert 0.6 * 400 <= rec.evidence["rate"] <= 400 * 1.05
    e2e = trials[(trials["mode"] == "train") & (trials["status"] == "ok")]
    floor = rec.evidence["best_rate"] * (1 - rec.evidence["band"])
    assert not ((e2e["num_workers"] < rec.num_workers) & (e2e["rate"] >= floor)).any()


def _knee_config(**overrides) -> dict:
    base = {
        "workload.model_args": {"step_wait_s": 0.02},
        "workload.dataset_args": {"sample_wait_s": 0.01},
        "search.num_workers": [0, 2, 6, 8],
        "search.batch_size": [8],
        "search.pin_memory": [False, True],
        # windows of at least 3 steps: 0.3 s at 0 workers (100 ms a step), 12 steps at the plateau; the rates the
        # tests bound are the sleeps' (they only slow a trial down), whatever the window's length
        "trial.window_s": 0.25,
        "trial.measure_windows": 2,
        "selection.tolerance": 0.05,
    }
    base.update(overrides)
    return sleepy_config(**base)


def _sweep(config: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunekit", "sweep", str(config), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def knee_grid(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One grid sweep of the known-answer workload for the module: the grid half of the knee test reads it, the
    resume test reruns a copy of it."""
    base = tmp_path_factory.mktemp("grid")
    config = base / "cfg.yaml"
    config.write_text(yaml.safe_dump(_knee_config(**{"cost.per_hour": 3.6}), sort_keys=False))
    assert tunekit.sweep(config, out=base / "run", strategy="grid").recommendation is not None
    return {"config": config, "out": base / "run"}


@pytest.mark.alone
def test_staged_and_grid_find_the_true_knee(write_config, tmp_path: Path, knee_grid: dict):
    config = write_config(_knee_config(**{"cost.per_hour": 3.6}))
    assert config.read_text() == knee_grid["config"].read_text()  # the grid below swept this same config
    staged = tunekit.sweep(config, out=tmp_path / "staged")
    assert staged.recommendation is not None, staged.reason
    rec = tunekit.load_recommended(tmp_path / "staged" / "recommended.yaml")
    trials = pd.read_csv(tmp_path / "staged" / "trials.csv")
    _check_knee(rec, trials)
    assert rec.pin_memory is False  # on the CPU pinning is not even tried
    assert rec.dataloader_kwargs() == {
        "batch_size": 8,
        "num_workers": rec.num_workers,
        "pin_memory": False,
        "prefetch_factor": 2,
        "persistent_workers": True,
    }
    assert rec.evidence["speedup_vs_defaults"] > 3.5  # 400/s against 80/s, analytically 5x
    assert list(trials["stage"].unique()) == ["compute", "loader", "end_to_end"]
    assert len(trials) == 1 + 4 + 4
    e2e = trials[trials["stage"] == "end_to_end"]
    # 6 workers, the fewest whose loader ceiling reaches the compute ceiling; the defaults; 8 to confirm
    assert list(e2e["num_workers"]) == [6, 0, 8, 2]
    skipped = e2e[e2e["status"] == "skipped"]
    assert list(skipped["num_workers"]) == [2]  # its loader ceiling (~200/s) cannot reach the ~400/s of 8 workers
    # its loader ceiling cannot reach the band, or (on a loaded box, where 6 workers read low) a count above it
    # already fell out of the band: either is evidence that 2 workers cannot be the knee
    reason = skipped.iloc[0]["reason"]
    assert "the loader alone gives" in reason or "already fell out of the band" in reason, reason
    knee = e2e[e2e["num_workers"] == rec.num_workers].iloc[0]
    assert knee["items_per_money"] == pytest.approx(knee["rate"] * 1000)  # 3600 s / 3.6 per hour
    assert knee["verdict"] == "compute-bound"  # 8 samples per 20 ms step: the model is the bound at the knee
    assert e2e[e2e["num_workers"] == 0].iloc[0]["verdict"] == "data-starved"
    assert rec.evidence["verdict"] == "compute-bound" and rec.evidence["items_per_money"] > 0
    stored = study_trials(tmp_path / "staged")
    assert len(stored) == len(trials)
    assert {t.params["num_workers"] for t in stored} == {0, 2, 6, 8}
    assert {t.user_attrs["stage"] for t in stored} == {"compute", "loader", "end_to_end"}
    for name in ("config.resolved.yaml", "env.json", "report.md"):
        assert (tmp_path / "staged" / name).exists(), name
    assert "## Recommendation" in (tmp_path / "staged" / "report.md").read_text()
    # the matmul peak once per sweep, by its first trial that runs the model; every such trial counts its FLOPs
    peaks = json.loads((tmp_path / "staged" / "env.json").read_text())["matmul_peak"]
    assert [p["trial"] for p in peaks] == list(trials[trials["stage"] == "compute"]["number"])
    assert peaks[0]["flops"] > 0 and peaks[0]["precision"] == "fp32" and peaks[0]["datasheet_flops"] is None
    ran = trials[(trials["status"] == "ok") & (trials["mode"] != "loader")]
    assert (ran["flops_per_item"] > 0).all() and (ran["flop_share"] > 0).all()
    assert "of this device's measured matmul peak" in (tmp_path / "staged" / "report.md").read_text()
    assert 0 < rec.evidence["flop_share"] < rules.MATMUL_SHARE_HIGH  # a sleeping model: the kernels' fix
    assert "channels_last" in rec.evidence["diagnosis"][0]

    grid = knee_grid["out"]
    _check_knee(tunekit.load_recommended(grid / "recommended.yaml"), pd.read_csv(grid / "trials.csv"))
    grid_trials = pd.read_csv(grid / "trials.csv")
    assert len(grid_trials) == 4 and set(grid_trials["stage"]) == {"grid"}
    assert sorted(grid_trials["num_workers"]) == [0, 2, 6, 8]  # pinning is not tried on the CPU
    grid_peaks = json.loads((grid / "env.json").read_text())["matmul_peak"]
    assert [p["trial"] for p in grid_peaks] == [grid_trials["number"].min()]  # a grid's first trial probes


def test_rerun_resumes_without_repeating_and_report_rebuilds_from_the_study(
    write_config, tmp_path: Path, knee_grid: dict
):
    out = tmp_path / "run"
    shutil.copytree(knee_grid["out"], out)  # a copy of the module's finished grid sweep
    config = knee_grid["config"]
    before = [(trial_number(t), t.value) for t in study_trials(out)]
    assert len(before) == 4 and all(value for _, value in before)
    again = _sweep(config, out, "--strategy", "grid")
    assert again.returncode == 0, again.stderr
    assert [(trial_number(t), t.value) for t in study_trials(out)] == before
    changed = write_config(_knee_config(**{"cost.per_hour": 3.6, "search.batch_size": [16]}), "other.yaml")
    refused = _sweep(changed, out, "--strategy", "grid")
    assert refused.returncode == 2 and "different config" in refused.stderr
    swept = tunekit.load_recommended(out / "recommended.yaml")
    assert swept.num_workers in PLATEAU
    # the outputs come back from study.db alone
    for name in ("trials.csv", "report.md", "recommended.yaml"):
        (out / name).unlink()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(out)], capture_output=True, text=True, timeout=120
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    rebuilt_rec = tunekit.load_recommended(out / "recommended.yaml")
    assert rebuilt_rec.dataloader_kwargs() == swept.dataloader_kwargs()  # the knee the sweep chose, from the study
    assert rebuilt_rec.evidence["rate"] == swept.evidence["rate"]
    assert sorted(pd.read_csv(out / "trials.csv")["number"]) == [n for n, _ in before]
    assert "## Recommendation" in (out / "report.md").read_text()
    missing = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "no study.db here" in missing.stderr


def test_resume_after_sigkill_mid_trial(write_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # two 0.5-s windows and the warm-up keep trial 1 running for well over a second after its pid file appears
    config = write_config(_knee_config(**{"search.num_workers": [0, 2, 6], "trial.window_s": 0.5}))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "tunekit", "sweep", str(config), "--out", str(out), "--strategy", "grid"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "trials" / "1" / "worker.pid").exists():  # trial 0 finished, trial 1 running
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    orphan = int((out / "trials" / "1" / "worker.pid").read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished_before = {trial_number(t): t.value for t in study_trials(out) if t.state.is_finished()}
    assert list(finished_before) == [0]

    resumed = tunekit.sweep(config, out=out, strategy="grid", quiet=False)
    assert resumed.recommendation is not None, resumed.reason
    assert "were running when the last sweep stopped" in capsys.readouterr().err
    with pytest.raises(ProcessLookupError):
        os.killpg(orphan, 0)  # the dead sweep's trial was killed, not left to compete
    trials = study_trials(out)
    done = [t for t in trials if "measurement" in t.user_attrs]
    keys = [(t.params["num_workers"], t.params["pin_memory"]) for t in done]
    assert sorted(keys) == [(0, False), (2, False), (6, False)]  # none lost, none repeated
    assert {trial_number(t): t.value for t in trials if trial_number(t) == 0} == finished_before  # kept as it was
    assert trials[1].state == optuna.trial.TrialState.FAIL and "measurement" not in trials[1].user_attrs


def test_budget_max_trials_is_honoured(write_config, tmp_path: Path):
    config = write_config(_knee_config(**{"budget.max_trials": 3}))
    result = tunekit.sweep(config, out=tmp_path / "run")
    assert result.recommendation is None  # three trials reach no end-to-end comparison: no recommendation, said why
    assert len(study_trials(tmp_path / "run")) == 3
    trials = pd.read_csv(tmp_path / "run" / "trials.csv")
    assert len(trials) == 3
    # the budget kept the last room for the report's baseline: the ceilings, then PyTorch's defaults
    assert list(trials["stage"]) == ["compute", "loader", "end_to_end"]
    assert (trials.iloc[-1]["num_workers"], trials.iloc[-1]["pin_memory"]) == (0, False)
    assert not (tmp_path / "run" / "recommended.yaml").exists()
    assert result.reason.startswith("No recommendation")
    meta = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert "max_trials = 3" in meta["stop_reason"]


def test_a_data_bound_knee_moves_to_a_smaller_batch_end_to_end(write_config, tmp_path: Path):
    """Stage 4b end to end. The model's step costs 10 ms whatever the batch, so the compute ceiling prefers the
    largest batch (32 -> 3200/s); but 2 workers at 5 ms per sample give 400/s at any batch. The knee (12.5 % of its
    compute ceiling) is tried at batches 16 and 8 (1600/s and 800/s alone), which keep up, and the cheapest of them
    within noise wins."""
    config = write_config(
        _knee_config(
            **{
                "workload.model_args": {"step_wait_s": 0.01},
                "workload.dataset_args": {"sample_wait_s": 0.005},
                "search.num_workers": [2],
                "search.batch_size": [8, 16, 32],
                "search.pin_memory": [False],
            }
        )
    )
    run = tunekit.sweep(config, out=tmp_path / "run")
    assert run.recommendation is not None, run.reason
    trials = pd.read_csv(tmp_path / "run" / "trials.csv")
    assert list(trials["stage"].unique()) == ["compute", "loader", "end_to_end", "batch"]
    batch = trials[trials["stage"] == "batch"]
    # 16 first, then 8 while each keeps within the band (both deliver 400/s analytically; noise may end it at 16)
    assert list(batch["batch_size"]) in ([16, 8], [16]) and set(batch["status"]) == {"ok"}
    rec = tunekit.load_recommended(tmp_path / "run" / "recommended.yaml")
    assert rec.num_workers == 2 and rec.batch_size in (8, 16, 32)
    if rec.batch_size == 32:  # only when batch 16 fell out of the band of the best
        floor = rec.evidence["best_rate"] * (1 - rec.evidence["band"])
        assert batch.iloc[0]["rate"] < floor
    assert rec.evidence["rate"] >= 0.95 * rec.evidence["best_rate"]
    assert rec.evidence["rate"] == pytest.approx(400, rel=0.15)  # 2 workers x 200 samples/s
    report = (tmp_path / "run" / "report.md").read_text()
    # the defaults ran at the swept batch, 32: "same batch" when the knee stayed there
    same = "same batch" if rec.batch_size == 32 else "batch 32"
    assert f"PyTorch defaults (0 workers, no pinning, {same})" in report
    # batch 8 costs 4x the per-sample compute time of batch 32, yet end to end it is not slower: no "grow the batch"
    assert rec.evidence["diagnosis"] and not any("overhead-bound" in d for d in rec.evidence["diagnosis"])
    assert (tmp_path / "run" / "plots" / "workers.png").exists()


def test_user_knobs_the_cheaper_data_setting_is_chosen_and_a_result_changing_one_only_reported(
    write_config, tmp_path: Path
):
    """search.extra on the known-answer workload, made input-bound (10 ms per sample, a 10 ms step of 8: 4 workers
    give 400/s against the model's 800/s). A dataset argument that only changes the per-sample cost (2 ms instead of
    10) lifts the knee to the model's ceiling: it is chosen, and fewer workers are tried with it. A knob declared to
    change the training result is measured and reported, never chosen."""
    config = write_config(
        _knee_config(
            **{
                "workload.model_args": {"step_wait_s": 0.01},
                "search.num_workers": [0, 2, 4],
                "search.pin_memory": [False],
                "search.extra": {
                    "workload.dataset_args.sample_wait_s": {"values": [0.01, 0.002], "changes_result": False},
                    "workload.dataset_args.num_classes": {"values": [10, 5], "changes_result": True},
                },
            }
        )
    )
    done = tunekit.sweep(config, out=tmp_path / "run")
    assert done.recommendation is not None, done.reason
    rec = tunekit.load_recommended(tmp_path / "run" / "recommended.yaml")
    assert rec.config == {"workload.dataset_args.sample_wait_s": 0.002}  # the cheaper per-sample cost
    trials = pd.read_csv(tmp_path / "run" / "trials.csv")
    extra = trials[trials["stage"] == "extra"]
    assert set(extra["status"]) == {"ok"} and len(extra) >= 3  # each other value at the knee, then fewer workers
    other = extra[extra["workload.dataset_args.num_classes"] == 5]
    assert len(other) == 1 and other.iloc[0]["changes_result"] == "workload.dataset_args.num_classes"
    assert set(trials["workload.dataset_args.sample_wait_s"]) == {0.01, 0.002}
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Your knobs" in report and "reported, not chosen" in report
    assert "`workload.dataset_args.sample_wait_s: 0.002`" in report
    assert "→ dataset_args.sample_wait_s=0.002: " in report  # the verdict before the knob, and what it gave
    stored = study_trials(tmp_path / "run")
    assert {t.params["extra:workload.dataset_args.num_classes"] for t in stored} == {10, 5}
