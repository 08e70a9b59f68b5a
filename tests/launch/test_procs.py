"""A trial's process tree ends with the trial (tunekit/launch/_procs.py): a helper in a session of its own, a hung
loader's workers at the timeout, torchrun with every rank and their workers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import sleepy_config
from tests.launch.test_ending import SLEEPY, _faulty_trial, _gone, _pids, _rank_spec, _trial_processes
from tests.worker.test_meter import _spec
from tunekit.launch import run_trial


def test_timeout_kills_torchrun_every_rank_and_their_workers(tmp_path: Path):
    pids = tmp_path / "pids"
    pids.mkdir()
    cfg = sleepy_config(
        **{
            **SLEEPY,
            "workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "hang_at": 3, "pid_dir": str(pids)},
        }
    )
    # 20 s: torchrun and two fresh interpreters importing torch serve samples within 3 s on a quick 2-core box (a
    # crashing rank's whole trial takes 3.3 s), and took over 12 s on a slow one (import torch 4 s, three
    # processes on 2 cores); then one hangs, and the timeout must end torchrun, both ranks and their workers
    t0 = time.monotonic()
    m = run_trial(_rank_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=4, ranks=2), tmp_path / "t", 20)
    assert m.status == "timeout", m
    assert time.monotonic() - t0 < 20 + 30
    # named from where each rank was: the one whose loader never delivered, the other waiting in the collective
    assert "hung waiting for its DataLoader's batch" in m.reason and "others waited for it" in m.reason, m.reason
    loader_pids = [int(p.name) for p in pids.iterdir()]
    assert len(loader_pids) >= 2  # workers of the ranks served samples before one hung

    def alive() -> list[int]:
        found = []
        for pid in loader_pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    found.append(pid)
            except psutil.NoSuchProcess:
                pass
        return found

    deadline = time.monotonic() + 10  # the launcher waited for the group; give the kernel a moment to reap
    while alive():
        assert time.monotonic() < deadline, alive()
        time.sleep(0.05)
    assert not _trial_processes(tmp_path / "t")  # no torchrun, no rank, no worker left


@pytest.mark.parametrize("fault, fork_server", [("setsid", True), ("daemon", False)])
def test_a_helper_in_another_session_ends_with_the_trial(tmp_path: Path, fault: str, fork_server: bool):
    """A child the script started in a session of its own (wandb's, tensorboard's helpers), or a double-forked
    daemon, holds the trial's output pipe: the trial still ends as measured, and the helper with it."""
    started = time.monotonic()
    m = _faulty_trial(tmp_path, fault, fork_server=fork_server)
    assert m.status == "ok", m.reason
    assert time.monotonic() - started < 50  # ended by the trial, not by its timeout
    helpers = _pids(tmp_path)
    assert helpers, "the script started no helper"
    if fault == "setsid":  # its Python child ran to its end, without the meter
        assert "child ok" in (tmp_path / "t" / "worker.log").read_text()
    assert all(_gone(pid) for pid in helpers), f"left running: {helpers}"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_hung_loader_times_out_and_leaves_no_process(tmp_path: Path):
    pids = tmp_path / "pids"
    pids.mkdir()
    cfg = sleepy_config(
        **{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "hang_at": 3, "pid_dir": str(pids)}}
    )
    # 4 s: the forked trial builds its loader and both workers serve samples within half a second here (a second or
    # two on a loaded box); then one hangs, and the timeout must end the whole tree
    t0 = time.monotonic()
    m = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=4), tmp_path / "t", 4)
    assert m.status == "timeout" and "timeout_s = 4" in m.reason
    assert time.monotonic() - t0 < 4 + 20
    loader_pids = [int(p.name) for p in pids.iterdir()]
    assert len(loader_pids) == 2 and m.pid not in loader_pids  # the workers served samples
    assert not [pid for pid in [m.pid, *loader_pids] if _alive(pid)]
    saved = json.loads((tmp_path / "t" / "measurement.json").read_text())
    assert saved["status"] == "timeout" and saved["reason"]
