from __future__ import annotations

import dataclasses
import json
import wsgiref.util
from pathlib import Path

import optuna
import pytest

from tests.conftest import sleepy_config
from tunekit import config, store
from tunekit.contract import Measurement
from tunekit.errors import UsageError

KNOBS = {
    "num_workers": 2,
    "prefetch_factor": 2,
    "pin_memory": False,
    "batch_size": 8,
    "grad_accum": 1,
    "compile": "none",
    "ranks": 1,
}


def _ok(number: int, stage: str, mode: str, rate: float, knobs: dict = KNOBS) -> Measurement:
    return Measurement(status="ok", rate=rate, params=knobs, stage=stage, mode=mode, number=number)


def _record(
    runs: store.RunStore,
    cfg: config.Config,
    stage: str,
    mode: str,
    measurement: Measurement | dict,
    knobs: dict = KNOBS,
) -> int:
    trial, number = runs.start(cfg, stage, mode, knobs)
    m = measurement if isinstance(measurement, Measurement) else Measurement.from_dict(measurement)
    runs.finish(trial, mode, dataclasses.replace(m, number=number))
    return number


def test_trials_record_exact_knobs_and_measurements(tmp_path: Path):
    cfg = config.from_dict(sleepy_config())
    runs = store.open_run(tmp_path, cfg, resume=True, strategy="staged")
    trial, number = runs.start(cfg, "end_to_end", "train", KNOBS)
    # every knob, the unsearched at default
    assert trial.params == {**KNOBS, "threads": None, "worker_threads": None} and number == 0
    runs.finish(trial, "train", _ok(number, "end_to_end", "train", 123.0))
    failed = {**KNOBS, "num_workers": 0, "prefetch_factor": None}
    _record(
        runs,
        cfg,
        "end_to_end",
        "train",
        {"status": "oom", "reason": "CUDA out of memory", "params": failed, "stage": "end_to_end", "mode": "train"},
        failed,
    )
    rows = store.load_run(tmp_path).rows()
    assert [(r.number, r.status, r.rate) for r in rows] == [(0, "ok", 123.0), (1, "oom", 0.0)]
    assert rows[1].reason == "CUDA out of memory"
    stored = optuna.load_study(study_name="tunekit", storage=f"sqlite:///{tmp_path / 'study.db'}").trials[0]
    assert stored.user_attrs["measurement"]["version"] == 2 and stored.user_attrs["measurement"]["rate"] == 123.0
    assert stored.value == 123.0  # the objective is the rate


def test_a_study_of_version_1_measurements_reads_through_the_record(tmp_path: Path):
    """Runs recorded before version 2 hold samples_per_s in their study.db: read as the rate, unknown keys kept."""
    cfg = config.from_dict(sleepy_config())
    runs = store.open_run(tmp_path, cfg, resume=True, strategy="staged")
    trial, number = runs.start(cfg, "end_to_end", "train", KNOBS)
    old = {
        "status": "ok",
        "samples_per_s": 77.0,
        "measured_samples": 154,
        "params": KNOBS,
        "stage": "end_to_end",
        "mode": "train",
        "number": number,
        "retired_field": 1,
    }
    trial.set_user_attr("measurement", old)
    trial.set_user_attr("status", "ok")
    runs.main.tell(trial, 77.0)
    row = store.load_run(tmp_path).rows()[0]
    assert row.rate == 77.0 and row.measurement.measured_items == 154
    assert row.measurement.other == {"retired_field": 1}


def test_optuna_sees_the_end_to_end_trials_and_the_knee(tmp_path: Path):
    """Ceilings live in their own study, skipped trials are pruned with their reason: optuna's best_trial is the
    fastest end-to-end trial, never a compute ceiling."""
    cfg = config.from_dict(sleepy_config())
    runs = store.open_run(tmp_path, cfg, resume=True, strategy="staged")
    _record(runs, cfg, "compute", "compute", _ok(0, "compute", "compute", 5000.0))
    _record(runs, cfg, "loader", "loader", _ok(0, "loader", "loader", 900.0))
    slow = _record(runs, cfg, "end_to_end", "train", _ok(0, "end_to_end", "train", 300.0))
    fast = _record(runs, cfg, "end_to_end", "train", _ok(0, "end_to_end", "train", 400.0))
    skipped = _record(
        runs,
        cfg,
        "end_to_end",
        "train",
        {"status": "skipped", "reason": "loader too slow", "params": KNOBS, "stage": "end_to_end", "mode": "train"},
    )
    runs.record_knee({"trial": slow, "rate": 300.0, "unit": "samples"})
    assert [r.number for r in store.load_run(tmp_path).rows()] == [0, 1, slow, fast, skipped] == [0, 1, 2, 3, 4]

    study = optuna.load_study(study_name="tunekit", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert study.best_trial.value == 400.0 and study.best_trial.user_attrs["number"] == fast
    assert study.user_attrs["knee"]["trial"] == slow
    pruned = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    assert [t.user_attrs["reason"] for t in pruned] == ["loader too slow"]
    ceilings = optuna.load_study(study_name="tunekit-ceilings", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert sorted(t.user_attrs["mode"] for t in ceilings.trials) == ["compute", "loader"]


def test_optuna_dashboard_shows_the_same_best_trial(tmp_path: Path):
    import optuna_dashboard as dashboard

    cfg = config.from_dict(sleepy_config())
    runs = store.open_run(tmp_path, cfg, resume=True, strategy="staged")
    _record(runs, cfg, "compute", "compute", _ok(0, "compute", "compute", 5000.0))
    best = _record(runs, cfg, "end_to_end", "train", _ok(0, "end_to_end", "train", 400.0))
    _record(runs, cfg, "end_to_end", "train", _ok(0, "end_to_end", "train", 390.0))
    app = dashboard.wsgi(f"sqlite:///{tmp_path / 'study.db'}")

    def get(path: str) -> dict:
        environ: dict = {"REQUEST_METHOD": "GET", "PATH_INFO": path}
        wsgiref.util.setup_testing_defaults(environ)
        status: list[str] = []
        body = b"".join(app(environ, lambda s, h, exc_info=None: status.append(s)))
        assert status[0].startswith("200"), (path, status, body[:300])
        return json.loads(body)

    studies = {s["study_name"]: s for s in get("/api/studies")["study_summaries"]}
    assert set(studies) == {"tunekit", "tunekit-ceilings"}
    detail = get(f"/api/studies/{studies['tunekit']['study_id']}")
    (shown,) = detail["best_trials"]
    assert shown["values"] == [400.0]
    assert {"key": "number", "value": str(best)} in shown["user_attrs"]


def test_recovery_closes_stale_running_and_waiting_trials(tmp_path: Path):
    cfg = config.from_dict(sleepy_config())
    runs = store.open_run(tmp_path, cfg, resume=True, strategy="staged")
    runs.start(cfg, "loader", "loader", KNOBS)  # left RUNNING by a sweep that died
    runs.ceilings.enqueue_trial({**KNOBS, "batch_size": 999})  # enqueued, never asked for
    assert runs.recover_running() == [0]
    states = [t.state for t in runs.ceilings.get_trials()]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.FAIL]
    fresh, number = runs.start(cfg, "loader", "loader", KNOBS)
    # not the stale enqueued batch 999, nor a used number
    assert fresh.params == {**KNOBS, "threads": None, "worker_threads": None} and number == 2
    assert runs.rows() == []  # interrupted trials are not finished: they will run again


def test_changed_config_or_strategy_is_refused(tmp_path: Path):
    store.open_run(tmp_path, config.from_dict(sleepy_config()), resume=True, strategy="staged")
    with pytest.raises(UsageError, match="--strategy staged, not grid"):
        store.open_run(tmp_path, config.from_dict(sleepy_config()), resume=True, strategy="grid")
    other = config.from_dict(sleepy_config(**{"search.batch_size": [16]}))
    with pytest.raises(UsageError, match="different config"):
        store.open_run(tmp_path, other, resume=True, strategy="staged")
    (tmp_path / "trials" / "0").mkdir(parents=True)
    assert store.open_run(tmp_path, other, resume=False, strategy="staged").rows() == []
    assert not (tmp_path / "trials").exists()  # no stale trial folders beside the new run


def test_a_resumed_sweep_measures_its_disturbed_trials_again(write_config, tmp_path: Path):
    """A run whose 0-worker trial scattered its windows 30 % (a neighbour's doing): the same command resumes it and
    measures that trial again, keeping the quiet one; the disturbed record stays in the study, set aside."""
    import tunekit
    from tests.conftest import measurement, sleepy_config
    from tunekit import config
    from tunekit.contract import Measurement

    path = write_config(
        sleepy_config(
            **{
                "strategy": "grid",
                "search.num_workers": [0, 2],
                "trial.window_s": 0.3,
                "trial.remeasure_disturbed": True,
            }
        )
    )
    cfg, out = config.load(path), tmp_path / "run"
    out.mkdir()
    runs = store.open_run(out, cfg, resume=False, strategy="grid")
    for workers, noise in ((0, 0.30), (2, 0.01)):
        trial, number = runs.start(
            cfg, "grid", "train", {"num_workers": workers, "batch_size": 8, "prefetch_factor": 2 if workers else None}
        )
        runs.finish(
            trial,
            "train",
            Measurement.from_dict(
                measurement(
                    number,
                    "grid",
                    "train",
                    100.0 * (workers + 1),
                    num_workers=workers,
                    batch_size=8,
                    prefetch_factor=2 if workers else None,
                    noise_cv=noise,
                )
            ),
        )
    resumed = tunekit.sweep(path, out=out, quiet=True)
    measured = store.open_run(out, cfg, resume=True, strategy="grid").rows()
    assert [(r.number, r.knobs.num_workers) for r in measured] == [(1, 2), (2, 0)]
    assert measured[1].ok and measured[1].measurement.rate != 100.0  # measured anew, not re-read
    assert sorted(resumed.trials["number"]) == [1, 2]
