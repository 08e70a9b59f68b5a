"""A trial's processes, ended whole: the group a trial leads and the groups of all its descendants (torchrun starts
each rank in a session of its own); what a trial's processes left behind when they ended (a child in a session of
its own, a double-forked daemon), adopted by the launcher as a child subreaper and ended with the trial; and what a
killed sweep left, found by its token. This module never imports torch."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil

from tunekit.contract import process as names

__all__ = ["kill_tree", "group_alive", "signal_group", "adopting", "end_processes", "sweep_processes", "TERM_GRACE_S"]

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


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


def _prctl(option: int, value: Any) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


class Adopted:
    """The processes the launcher adopted while one trial ran: whatever a trial's process leaves running when it
    exits (a child it started in a session of its own, the grandchild of a double fork) is re-parented to the
    nearest subreaper above it, this process, instead of to init, where no process tree would find it."""

    def __init__(self) -> None:
        self._before = {p.pid for p in _children()}

    def end(self, keep: set[int]) -> list[int]:
        """End every child that came since (and its descendants), but those in ``keep`` (the fork servers);
        SIGTERM, then SIGKILL after the grace period; reaped. Returns their pids."""
        ended: list[int] = []
        for _ in range(8):  # ending an adopted process re-parents its own children to us: look again
            adopted = [p for p in _children() if p.pid not in self._before and p.pid not in keep]
            if not adopted:
                break
            ended += [p.pid for p in adopted]
            end_processes(adopted)
        return ended


def _children() -> list[psutil.Process]:
    try:
        return psutil.Process().children()
    except psutil.Error:  # pragma: no cover - this process is always there
        return []


@contextlib.contextmanager
def adopting() -> Iterator[Adopted]:
    """This process a child subreaper (Linux) while the block runs, as it was before afterwards."""
    previous = ctypes.c_int(0)
    linux = sys.platform.startswith("linux") and _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous))
    if linux and not previous.value:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield Adopted()
    finally:
        if linux and not previous.value:
            _prctl(_PR_SET_CHILD_SUBREAPER, 0)


def end_processes(procs: list[psutil.Process], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM ``procs`` and their descendants, SIGKILL what is left after ``grace_s``; this process's children
    among them are reaped."""
    every: dict[int, psutil.Process] = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for p in [proc, *proc.children(recursive=True)]:
                every[p.pid] = p
    for p in every.values():
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(list(every.values()), timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def sweep_processes(token: str) -> list[psutil.Process]:
    """Every process of this user that carries sweep ``token`` in its environment (:data:`names.SWEEP`): what a
    sweep's trials started, whatever session they moved to, and its fork server; never this process or its
    ancestors."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    uid = os.getuid()
    found = []
    for proc in psutil.process_iter(["uids"]):
        if proc.pid in mine or proc.info["uids"] is None or proc.info["uids"].real != uid:
            continue
        try:
            if proc.environ().get(names.SWEEP) == token:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found
