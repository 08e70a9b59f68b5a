"""A trial's processes, ended whole: the group a trial leads and the groups of all its descendants (torchrun starts
each rank in a session of its own). This module never imports torch."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import psutil

__all__ = ["kill_tree", "group_alive", "signal_group", "TERM_GRACE_S"]

TERM_GRACE_S = 5.0
"""How long a trial's processes have between SIGTERM and SIGKILL."""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused id we do not own
        return False


def descendant_groups(pid: int) -> set[int]:
    """The process groups of every descendant of ``pid`` (torchrun's ranks lead sessions of their own)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    groups = set()
    for child in children:
        try:
            groups.add(os.getpgid(child.pid))
        except OSError:
            continue
    return groups


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """Terminate the trial's process group and the groups of all its descendants, wait a grace period, then kill
    what is left and reap the leader."""
    pgid = proc.pid  # start_new_session: the worker (or torchrun) leads its own group
    groups = {pgid}
    if proc.poll() is None:
        groups |= descendant_groups(proc.pid)
        for group in groups:  # torchrun forwards SIGTERM to its ranks itself; the loop reaches the rest
            signal_group(group, signal.SIGTERM)
        try:
            proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:  # once reaped its pid may belong to another process: only walk a live tree
        groups |= descendant_groups(proc.pid)
    for group in groups:
        signal_group(group, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + TERM_GRACE_S
    while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
        for group in groups:
            signal_group(group, signal.SIGKILL)
        time.sleep(0.05)


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
