"""A run folder held by one tunekit process at a time (tunekit/launch/_leftovers.py): a second is refused, naming
the holder, and what a killed holder left running ends when the folder is held again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import sleepy_config
from tests.launch.test_ending import _gone, _pids, _raw
from tests.test_driver import _cli
from tunekit import launch
from tunekit.errors import UsageError


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


def test_a_second_process_on_a_run_folder_is_refused_naming_the_holder(write_config, tmp_path: Path):
    cfg = write_config(sleepy_config(**{"search.num_workers": [0]}))
    out = tmp_path / "run"
    held = launch.lock_run(out)  # a sweep in progress
    try:
        for args in (("sweep", str(cfg), "--out", str(out)), ("trial", str(cfg), "--out", str(out))):
            refused = _cli(*args)
            assert refused.returncode == 2, refused.stderr
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and str(out) in lines[0] and f"pid {os.getpid()}" in lines[0]
        assert not (out / "study.db").exists() and not (out / "trials").exists()  # nothing written
        with pytest.raises(UsageError, match="another tunekit process"):
            launch.lock_run(out)
    finally:
        held.close()
    assert (out / ".tunekit.lock").exists()  # what a killed holder leaves behind: it does not block
    launch.lock_run(out).close()
