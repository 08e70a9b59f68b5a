"""Script mode's start inside the script's interpreter (tunekit/worker/script/_hook.py and its bootstrap): the meter
in the script's own process alone, a bootstrap that cannot load, the thread count set at the start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tunekit
from tests.conftest import REPO
from tests.launch.test_ending import _faulty_trial, _raw
from tests.worker.script.test_session import SLEEPY_SCRIPT
from tunekit import config, store
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial


def test_only_the_scripts_own_process_runs_the_meter(tmp_path: Path):
    """Python children of the script (a spawn-context evaluation loader's worker, a forkserver-context training
    loader's server and workers) never install the meter: a crash in training is reported as that crash (it read
    "ended without building a torch DataLoader", written by the evaluation worker at its exit). A subprocess of
    sys.executable is test_a_helper_in_another_session_ends_with_the_trial's."""
    m = _faulty_trial(tmp_path, "spawn-crash")
    assert m.status == "crashed" and m.reason.startswith("RuntimeError: faulty: a crash in training"), m.reason
    assert "after batch 3 of its training loader" in m.reason, m.reason


def _venv_without_torch(tmp_path: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0
    return python


def test_a_python_without_torch_is_a_crashed_trial_and_the_run_reads(tmp_path: Path):
    """An unactivated virtualenv's python: the bootstrap's record becomes the trial's (it had no stage, and the
    sweep died on "'' is not a stage", its folder unreadable by resume and report)."""
    raw = _raw(tmp_path, "none", python=_venv_without_torch(tmp_path))
    raw["budget"] = {"max_trials": 2}
    out = tmp_path / "run"
    result = tunekit.sweep(raw, out=out, quiet=True)
    rows = store.load_run(out).rows()
    assert rows and rows[0].status == "crashed" and rows[0].stage == "compute"
    assert "No module named 'torch'" in rows[0].reason and "virtualenv" in rows[0].reason
    assert "compute ceiling failed" in result.summary.choice.reason
    assert (out / "report.md").exists()


def test_a_record_without_its_stage_reads_by_the_trials_own_tags(tmp_path: Path):
    """A folder an older tunekit wrote with such a record: resume and report read it (as a crashed compute trial)."""
    from tunekit.contract import Measurement, Mode, Stage

    cfg = config.from_dict(_raw(tmp_path, "none"))
    (tmp_path / "run").mkdir()
    runs = store.open_run(tmp_path / "run", cfg, resume=False, strategy="staged")
    trial, _ = runs.start(cfg, Stage.compute, Mode.compute, Knobs(batch_size=8).to_dict())
    runs.finish(trial, Mode.compute, Measurement(status="crashed", reason="bootstrap could not load"))
    (row,) = store.load_run(tmp_path / "run").rows()
    assert (row.stage, row.mode, row.status, row.knobs.batch_size) == ("compute", "compute", "crashed", 8)


@pytest.fixture
def sleepy_script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SLEEPY_SCRIPT)
    return path


def test_a_bootstrap_that_cannot_load_ends_the_script_at_once_with_the_reason(tmp_path: Path, sleepy_script: Path):
    """Were the meter not to load, the script would train unmetered to its end (or the trial's timeout)."""
    from tunekit.launch import BOOTSTRAP

    out = tmp_path / "measurement.json"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{BOOTSTRAP}:{REPO}",
        "TUNEKIT_SCRIPT_SPEC": str(tmp_path / "no"),
        "TUNEKIT_SCRIPT_MEASUREMENT": str(out),
    }
    run = subprocess.run([sys.executable, str(sleepy_script)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 3
    failed = json.loads(out.read_text())
    assert failed["status"] == "crashed" and "bootstrap could not load" in failed["reason"]
    assert not list(tmp_path.glob("epoch*.pt"))


@pytest.mark.parametrize("fault, ran, asked", [("none", 1, None), ("threads2", 2, {"threads": 1})])
def test_threads_are_set_in_the_scripts_process_and_recorded_as_run(
    tmp_path: Path, fault: str, ran: int, asked: dict[str, int] | None
):
    """``--set threads=1`` without a {threads} placeholder: set in the script's process at its start (the script
    kept its own count); a script that sets its own afterwards runs that, recorded with what was asked."""
    from tests.launch.test_ending import _raw

    cfg = config.from_dict(_raw(tmp_path, fault), source=str(tmp_path / "cfg.yaml")).to_dict()
    spec = TrialSpec(
        number=0, stage="single", mode="train", knobs=Knobs(num_workers=0, batch_size=8, threads=1), config=cfg
    )
    m = run_trial(spec, tmp_path / "t", 60)
    assert m.status == "ok", m.reason
    assert m.params["threads"] == ran and m.asked == asked
