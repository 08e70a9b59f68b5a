"""The run folder held by one sweep (or trial) at a time, and what a killed holder left running there ended.

The lock file records its holder's pid and sweep token (``contract.process.SWEEP``): every process the holder's
trials started carries that token in its environment (its fork server, a script's DataLoader workers, a child the
script moved into a session of its own), so the next holder finds and ends them even when the script held the GIL
and could not notice its sweep had gone. This module never imports torch."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path
from typing import Any

from tunekit.contract import process as names
from tunekit.errors import UsageError
from tunekit.launch._procs import end_processes, sweep_processes

__all__ = ["lock_run", "LOCK_FILE"]

LOCK_FILE = ".tunekit.lock"


def lock_run(run_dir: Path) -> Any:
    """Hold the run folder for this process: a second sweep or trial on it is refused at once, naming the holder;
    what an earlier holder that was killed left running is ended first.

    The lock is an OS file lock (``flock``) that dies with its holder, so the lock file a killed sweep leaves
    behind never blocks a resume. Keep the returned handle open for as long as the folder is in use.

    Raises:
        UsageError: another process holds the folder.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = (handle.read().split() or ["unknown"])[0]
        handle.close()
        raise UsageError(
            f"{run_dir}: another tunekit process (pid {holder}) is using this run folder; wait for it "
            "to finish, or choose another --out"
        ) from None
    handle.seek(0)
    earlier = handle.read().split()
    token = names.sweep_token()
    if len(earlier) > 1 and earlier[1] != token:
        end_processes(sweep_processes(earlier[1]), grace_s=1.0)
    for trial_dir in (run_dir / "trials").glob("*"):  # a holder that recorded no token
        _kill_worker(trial_dir)
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()} {token}\n")
    handle.flush()
    return handle


def _kill_worker(trial_dir: Path) -> None:
    """The worker a trial folder's pid file names, if that process is still a tunekit worker of this folder."""
    try:
        pid = int((trial_dir / names.PID_FILE).read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return
    if names.WORKER_MODULE in cmdline and str(trial_dir.resolve()) in cmdline:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
