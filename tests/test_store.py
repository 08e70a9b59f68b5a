from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.conftest import sleepy_config
from tunekit import config, store
from tunekit.errors import UsageError

KNOBS = {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False, "batch_size": 8, "grad_accum": 1,
         "compile": "none"}


def test_trials_record_exact_knobs_and_measurements(tmp_path: Path):
    cfg = config.from_dict(sleepy_config())
    study = store.open_study(tmp_path, cfg, resume=True)
    trial = store.start_trial(study, cfg, "end_to_end", "train", KNOBS)
    assert trial.params == KNOBS
    store.finish_trial(study, trial, {"status": "ok", "samples_per_s": 123.0, "params": KNOBS, "stage": "end_to_end",
                                      "mode": "train", "number": trial.number})
    failed = store.start_trial(study, cfg, "end_to_end", "train", {**KNOBS, "num_workers": 0, "prefetch_factor": None})
    store.finish_trial(study, failed, {"status": "oom", "reason": "CUDA out of memory", "samples_per_s": None,
                                       "params": {**KNOBS, "num_workers": 0}, "stage": "end_to_end", "mode": "train"})
    rows = store.finished_rows(store.load_study(tmp_path))
    assert [(r.status, r.samples_per_s) for r in rows] == [("ok", 123.0), ("oom", None)]
    assert rows[1].reason == "CUDA out of memory"


def test_recovery_closes_stale_running_and_waiting_trials(tmp_path: Path):
    cfg = config.from_dict(sleepy_config())
    study = store.open_study(tmp_path, cfg, resume=True)
    store.start_trial(study, cfg, "loader", "loader", KNOBS)  # left RUNNING by a sweep that died
    study.enqueue_trial({**KNOBS, "batch_size": 999})  # enqueued, never asked for
    assert store.recover_running(study, tmp_path) == [0]
    states = [t.state for t in study.get_trials()]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.FAIL]
    fresh = store.start_trial(study, cfg, "loader", "loader", KNOBS)
    assert fresh.params == KNOBS  # not the stale enqueued batch 999
    assert store.finished_rows(study) == []  # interrupted trials are not finished: they will run again


def test_changed_config_is_refused(tmp_path: Path):
    store.open_study(tmp_path, config.from_dict(sleepy_config()), resume=True)
    other = config.from_dict(sleepy_config(**{"search.batch_size": [16]}))
    with pytest.raises(UsageError, match="different config"):
        store.open_study(tmp_path, other, resume=True)
    (tmp_path / "trials" / "0").mkdir(parents=True)
    assert store.open_study(tmp_path, other, resume=False).trials == []
    assert not (tmp_path / "trials").exists()  # no stale trial folders beside the new run
