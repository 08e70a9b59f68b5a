"""The sweep's short tasks (tunekit/launch/_run.py): the dataset prepared in a process of its own, ended by a
SIGTERM to the sweep."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import sleepy_config


@pytest.mark.parametrize("fork_server", [True, False])
def test_sigterm_while_the_dataset_is_prepared_ends_its_processes(write_config, tmp_path: Path, fork_server: bool):
    """The dataset is built forked from the fork server (or, without one, in a fresh `python -m tunekit.worker
    --prepare`); a SIGTERM to the sweep while it builds ends that process, and the sweep exits 130."""
    marker = 7654321  # in a fresh interpreter's command line
    cfg = write_config(
        sleepy_config(
            **{"workload.dataset_args": {"build_wait_s": 60, "num_samples": marker}, "trial.fork_server": fork_server}
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunekit", "sweep", str(cfg), "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def command(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # gone, or a zombie not reaped yet (the import-path check's, say)
            return ""

    def preparing() -> list[psutil.Process]:
        try:
            below = psutil.Process(proc.pid).children(recursive=True)
            if not fork_server:
                return [p for p in below if "--prepare" in command(p) and str(marker) in command(p)]
            servers = [p for p in below if "--fork-server" in command(p)]
            return [c for s in servers for c in s.children() if command(c)]  # the dataset being built
        except psutil.Error:
            return []

    deadline, first_seen = time.monotonic() + 120, {}
    while True:  # a child that lasts: the import-path check is forked from the server too, for milliseconds
        assert time.monotonic() < deadline and proc.poll() is None
        found = preparing()
        for p in found:
            first_seen.setdefault(p.pid, time.monotonic())
        if any(time.monotonic() - first_seen[p.pid] > 1.0 for p in found):
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err
    deadline = time.monotonic() + 10

    def alive() -> list[psutil.Process]:
        return [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    while alive():  # the sweep killed it before exiting; give the kernel a moment to reap it
        assert time.monotonic() < deadline, alive()
        time.sleep(0.05)
