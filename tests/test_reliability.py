"""Faults that must not lose data, write in the wrong place, or be misreported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import sleepy_config
from tunekit import config, store
from tunekit.contract import Knobs, TrialSpec
from tunekit.errors import ConfigError, UsageError
from tunekit.launcher import run_trial


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunekit", *args], capture_output=True, text=True, timeout=300)


def test_a_second_process_on_a_run_folder_is_refused_naming_the_holder(write_config, tmp_path: Path):
    cfg = write_config(sleepy_config(**{"search.num_workers": [0]}))
    out = tmp_path / "run"
    held = store.lock_run(out)  # a sweep in progress
    try:
        for args in (("sweep", str(cfg), "--out", str(out)), ("trial", str(cfg), "--out", str(out))):
            refused = _cli(*args)
            assert refused.returncode == 2, refused.stderr
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and str(out) in lines[0] and f"pid {__import__('os').getpid()}" in lines[0]
        assert not (out / "study.db").exists() and not (out / "trials").exists()  # nothing written
        with pytest.raises(UsageError, match="another tunekit process"):
            store.lock_run(out)
    finally:
        held.close()
    assert (out / ".tunekit.lock").exists()  # what a killed holder leaves behind: it does not block
    store.lock_run(out).close()


@pytest.mark.parametrize("name", ["../../etc/x", "/tmp/abs", "a/b", ".."])
def test_a_run_name_is_a_plain_folder_name(name: str):
    with pytest.raises(ConfigError) as err:
        config.from_dict(sleepy_config(name=name))
    (line,) = err.value.lines()
    assert "name" in line and "--out" in line


def test_a_bad_set_value_is_one_line_and_exit_2(write_config):
    bad = _cli("trial", str(write_config(sleepy_config())), "--set", "trial.window_s=[")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "trial.window_s" in bad.stderr


def test_a_nan_loss_is_diverged_not_a_fast_step(tmp_path: Path):
    cfg = sleepy_config(**{"workload.step": "tests._workloads:nan_step"})
    spec = TrialSpec(number=0, stage="single", mode="train", knobs=Knobs(batch_size=8),
                     config=config.from_dict(cfg).to_dict())
    m = run_trial(spec, tmp_path / "t", 60)
    assert m["status"] == "diverged" and "nan" in m["reason"] and "micro-batch" in m["reason"]
    assert m["samples_per_s"] is None  # never a candidate for the knee
