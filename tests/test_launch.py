"""The trial's process boundary (tunekit/launch/): a trial always ends and leaves nothing, the script-mode meter runs
only in the script's own process, a failure is a failed trial that says where the script was, never a dead sweep.
Each case runs tests/_faulty.py, a tiny CPU training script with a --fault switch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import tunekit
from tests.conftest import REPO
from tunekit import config, launch, store
from tunekit.contract import Knobs, TrialSpec
from tunekit.errors import ConfigError

FAULTY = REPO / "tests" / "_faulty.py"
QUICK = {"window_s": 0.4, "measure_windows": 2, "precision": None, "warmup_steps": 1, "timeout_s": 60}


def _raw(tmp_path: Path, fault: str, python: str = sys.executable, **trial: Any) -> dict[str, Any]:
    """A script config of the faulty script; its lingering helpers write their pids to tmp_path/pids."""
    command = [python, str(FAULTY), "-j", "{num_workers}", "-b", "{batch_size}", "--fault", fault]
    return {
        "name": "faulty",
        "device": "cpu",
        "script": {"command": command, "cwd": str(tmp_path.parent), "env": {"FAULTY_PIDS": str(tmp_path / "pids")}},
        "search": {"num_workers": [0, 2], "batch_size": [8], "pin_memory": [False]},
        "trial": {**QUICK, **trial},
    }


def _trial(tmp_path: Path, fault: str, workers: int = 2, **trial: Any):
    cfg = config.from_dict(_raw(tmp_path, fault, **trial), source=str(tmp_path / "cfg.yaml")).to_dict()
    spec = TrialSpec(number=0, stage="single", mode="train", knobs=Knobs(num_workers=workers, batch_size=8), config=cfg)
    return launch.run_trial(spec, tmp_path / "t", 60)


def _pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "pids"
    return [int(line.split()[-1]) for line in path.read_text().split("\n") if line.strip()] if path.exists() else []


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("fault, fork_server", [("setsid", True), ("daemon", False)])
def test_a_helper_in_another_session_ends_with_the_trial(tmp_path: Path, fault: str, fork_server: bool):
    """A child the script started in a session of its own (wandb's, tensorboard's helpers), or a double-forked
    daemon, holds the trial's output pipe: the trial still ends as measured, and the helper with it."""
    started = time.monotonic()
    m = _trial(tmp_path, fault, fork_server=fork_server)
    assert m.status == "ok", m.reason
    assert time.monotonic() - started < 50  # ended by the trial, not by its timeout
    helpers = _pids(tmp_path)
    assert helpers, "the script started no helper"
    if fault == "setsid":  # its Python child ran to its end, without the meter
        assert "child ok" in (tmp_path / "t" / "worker.log").read_text()
    assert all(_gone(pid) for pid in helpers), f"left running: {helpers}"


def test_only_the_scripts_own_process_runs_the_meter(tmp_path: Path):
    """Python children of the script (a spawn-context evaluation loader's worker, a forkserver-context training
    loader's server and workers) never install the meter: a crash in training is reported as that crash (it read
    "ended without building a torch DataLoader", written by the evaluation worker at its exit). A subprocess of
    sys.executable is test_a_helper_in_another_session_ends_with_the_trial's."""
    m = _trial(tmp_path, "spawn-crash")
    assert m.status == "crashed" and m.reason.startswith("RuntimeError: faulty: a crash in training"), m.reason
    assert "after batch 3 of its training loader" in m.reason, m.reason


@pytest.mark.parametrize(
    "fault, words",
    [
        ("exit5", "the script exited with code 5 after batch 2 of its training loader"),
        ("nobatch", "the script exited with code 0 before its training loader's first batch"),
    ],
)
def test_a_script_that_ends_says_where_it_was(tmp_path: Path, fault: str, words: str):
    """os._exit and an exit before the first batch leave no record: the script's marks say where it was (they read
    "exit code 5: the trial failed without a message" and "the worker exited 0 but wrote no measurement.json");
    argparse's rejection is tests/test_script.py's."""
    m = _trial(tmp_path, fault, workers=0)
    assert m.status == "crashed" and m.reason.startswith(words), m.reason


def test_a_hard_coded_loader_is_recorded_as_it_ran(tmp_path: Path):
    """The script builds its loader with num_workers=1 whatever -j says: the trial says what ran and what was
    asked, and the plan counts the request as done (it asked 24 times, until the budget ran out)."""
    from tunekit.plan._request import Request, pending
    from tunekit.records import TrialRow

    m = _trial(tmp_path, "workers1", workers=2)
    assert m.status == "ok", m.reason
    assert m.params["num_workers"] == 1 and m.asked == {"num_workers": 2}
    row = TrialRow.from_measurement(m)
    again = Request(row.stage, row.mode, Knobs(**{**row.knobs.to_dict(), "num_workers": 2}))
    assert pending([again], [row]) == []


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


def test_a_killed_sweep_leaves_nothing_once_its_folder_is_held_again(tmp_path: Path):
    """kill -9 of the sweep while the script holds the GIL (its watch thread cannot run): the script, its fork
    server and its loader workers stay; the next holder of the run folder (a resume) ends every one of them."""
    import yaml

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({**_raw(tmp_path, "gil"), "budget": {"max_trials": 3}}))
    out = tmp_path / "run"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "tunekit", "sweep", str(cfg_path), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _pids(tmp_path) and time.monotonic() < deadline and sweep.poll() is None:
            time.sleep(0.2)
        (holder,) = _pids(tmp_path)
        left = [p for p in psutil.Process(sweep.pid).children(recursive=True)]
        sweep.kill()
        sweep.wait()
        time.sleep(1.0)
        assert psutil.pid_exists(holder) and psutil.Process(holder).status() != psutil.STATUS_ZOMBIE
        launch.lock_run(out).close()  # what a resumed sweep does first
        assert all(_gone(pid) for pid in [*(p.pid for p in left), holder]), "a killed sweep's process was left"
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.wait()


@pytest.mark.parametrize(
    "command, words",
    [
        (["pyhton", "train.py"], '"pyhton" is not found on PATH; did you mean python'),
        (["./notexec.py"], '"./notexec.py" is not executable (no exec bit)'),
        (["{num_workers}", "train.py"], 'the program "{num_workers}" is a placeholder'),
    ],
)
def test_a_command_that_cannot_start_is_refused_before_any_trial(tmp_path: Path, command: list[str], words: str):
    (tmp_path / "notexec.py").write_text("print('hi')\n")
    raw = {"name": "x", "script": {"command": command, "cwd": str(tmp_path)}}
    with pytest.raises(ConfigError) as err:
        config.load(raw, check_imports=True)
    assert words in str(err.value)
    missing = {"name": "x", "script": {"command": ["python", "train.py"], "cwd": str(tmp_path / "nowhere")}}
    with pytest.raises(ConfigError, match="script.cwd: .* is not a folder"):
        config.load(missing, check_imports=True)


def test_a_log_that_cannot_be_written_names_the_file(tmp_path: Path):
    """A file-size limit (or a full disk) stops worker.log's writes: the trial is ended and the sweep says, in one
    line, which file could not be written (the error surfaced as a raw OSError from the reading thread's exit)."""
    code = f"""
import json, resource, sys
from tunekit import config, launch
from tunekit.contract import Knobs, TrialSpec
from tunekit.errors import TunekitError
from tests.conftest import sleepy_config
chatty = {{"sample_wait_s": 0.0, "print_every": 1}}
cfg = sleepy_config(**{{"workload.dataset_args": chatty, "trial.fork_server": False}})
spec = TrialSpec(number=0, stage="single", mode="train", knobs=Knobs(batch_size=8),
                 config=config.from_dict(cfg).to_dict())
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    launch.run_trial(spec, {str(tmp_path / "t")!r}, 60)
except TunekitError as exc:
    print("ERROR", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    line = [x for x in out.stdout.splitlines() if x.startswith("ERROR")]
    assert line and f"{tmp_path / 't' / 'worker.log'}: cannot write the trial's log" in line[0], (
        out.stdout,
        out.stderr[-2000:],
    )
