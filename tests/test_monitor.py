"""The trial's monitor thread: host memory read cheaply inside the windows, its growth still seen."""

from __future__ import annotations

import time

from tunekit.worker.meter import _monitor
from tunekit.worker.meter._monitor import Monitor


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the monitor took no sample in time"
        time.sleep(0.02)


def test_inside_the_windows_pss_is_read_rarely_and_growth_still_counts(monkeypatch):
    """Outside the windows every sample reads PSS; inside them only every pss_period_s, the samples between adding
    the change in the tree's RSS to the last PSS read: 256 MiB touched inside the windows raise the measured peak by
    about that much with no PSS read meanwhile, and the read after the windows confirms it."""
    reads = []
    real = _monitor._tree_memory
    monkeypatch.setattr(_monitor, "_tree_memory", lambda root: reads.append(1) or real(root))
    monitor = Monitor(None, host_period_s=0.05, pss_period_s=3600).start()
    try:
        _until(lambda: len(reads) >= 2)  # warm-up: every sample reads PSS
        before = monitor.host_pss_peak
        monitor.measuring = True
        reads_at_start = len(reads)
        grown = bytearray(256 << 20)  # zero pages become resident only once written
        grown[::4096] = b"x" * len(grown[::4096])
        _until(lambda: monitor.host_pss_peak_measured > before + (200 << 20))
        assert len(reads) - reads_at_start <= 1  # at most the one due as the windows began
        monitor.sample_now()  # after the windows: PSS read once more
        assert len(reads) > reads_at_start and monitor.host_pss_peak_measured > before + (200 << 20)
        del grown
    finally:
        monitor.stop()


def test_processes_that_come_and_go_inside_the_windows_leave_samples_out_rather_than_read_pss(monkeypatch):
    """Loader workers without persistent_workers restart at every epoch's end: the tree's processes change between
    samples. An estimate across that change would count a new process's shared pages whole, and a PSS read at each
    change would cost the step what the rare reads save; so inside the windows such samples are left out (their RSS
    and process count still kept) until the next due PSS read."""
    import subprocess
    import sys

    reads = []
    real = _monitor._tree_memory
    monkeypatch.setattr(_monitor, "_tree_memory", lambda root: reads.append(1) or real(root))
    monitor = Monitor(None, host_period_s=0.05, pss_period_s=3600).start()
    children = []
    try:
        _until(lambda: len(reads) >= 2)
        monitor.measuring = True
        reads_at_start = len(reads)
        for _ in range(6):  # a child started and ended every few samples: a worker restart each time
            children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"]))
            time.sleep(0.15)
            children[-1].wait()
        assert len(reads) - reads_at_start <= 1, len(reads) - reads_at_start  # at most the one due at the start
        assert monitor.max_processes >= 2  # the samples still counted the processes
    finally:
        for child in children:
            child.kill()
        monitor.stop()


def test_the_fork_server_counts_only_for_the_process_it_forked(monkeypatch):
    """TUNEKIT_FORKED_FROM names the server in the child it forked; a process the trial starts (a wrapper script's
    own python) inherits the variable but was not forked by it, and counts no server pages."""
    import os

    monkeypatch.setenv("TUNEKIT_FORKED_FROM", str(os.getppid()))
    assert _monitor.fork_server_pid() == os.getppid()
    monkeypatch.setenv("TUNEKIT_FORKED_FROM", str(os.getpid()))  # any pid but the parent's
    assert _monitor.fork_server_pid() is None
    monkeypatch.delenv("TUNEKIT_FORKED_FROM")
    assert _monitor.fork_server_pid() is None
