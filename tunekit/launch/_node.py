"""The other nodes of a multi-node sweep (``tunekit node``): this node's ranks of every trial, started by torchrun
at each rendezvous node 0's trials open, until the sweep releases the node. This module never imports torch."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunekit._files import read_json
from tunekit.config import Config
from tunekit.contract import Measurement
from tunekit.contract import process as names
from tunekit.errors import UsageError
from tunekit.launch import _start
from tunekit.launch._procs import kill_tree
from tunekit.launch._start import torchrun_command

__all__ = ["run_node"]


def run_node(
    cfg: Config, node_rank: int, folder: Path, *, idle_timeout_s: float, say: Callable[[str], None] = lambda line: None
) -> int:
    """Serve node ``node_rank``'s ranks of every multi-rank trial of a sweep run on node 0 (``tunekit node``), until
    the sweep releases this node or no trial came for ``idle_timeout_s``; returns the trials served. Each trial's
    spec comes from rank 0 through the rendezvous; this node's failures stay in ``folder``'s node.log."""
    nnodes = cfg.launch.nnodes
    if nnodes < 2:
        raise UsageError(f"{cfg.source}: launch.nnodes is 1: there are no other nodes to serve")
    if not 1 <= node_rank < nnodes:
        raise UsageError(f"--node-rank {node_rank}: choose 1 ... {nnodes - 1} (node 0 runs the sweep)")
    folder.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(cfg.launch, node_rank) + ["-m", names.WORKER_MODULE, names.FOLLOW, str(folder)]
    trial, stop = folder / names.NODE_TRIAL_FILE, folder / names.NODE_STOP_FILE
    served, last = 0, time.monotonic()
    while True:
        for stale in (*folder.glob(names.RANK_FAILURES), trial, stop):
            stale.unlink(missing_ok=True)
        with open(folder / names.NODE_LOG_FILE, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=_start.child_env(),
            )
            try:
                rc = _wait_trial(proc, trial, cfg.trial.timeout_s)
            finally:  # an interrupt ends this node's ranks and their workers too
                kill_tree(proc)
        if stop.exists():
            say(f"node {node_rank}: the sweep released this node after {served} trial(s)")
            return served
        if trial.exists():
            served, last = served + 1, time.monotonic()
            failed = [Measurement.from_dict(read_json(p)) for p in folder.glob(names.RANK_FAILURES)]
            first = min(failed, key=lambda m: float(m.failed_at or 0.0)) if failed else None
            reason = first.reason if first is not None else None
            say(
                f"node {node_rank}: trial {trial.read_text()} "
                + (f"failed here: {reason}" if reason else "done" if rc == 0 else f"ended with exit code {rc}")
            )
        elif time.monotonic() - last > idle_timeout_s:
            say(f"node {node_rank}: no trial for {idle_timeout_s:g} s; stopping after {served} trial(s)")
            return served
        else:
            time.sleep(1.0)  # no rendezvous this time (node 0 between trials, or not started yet)


def _wait_trial(proc: subprocess.Popen[Any], started: Path, timeout_s: float) -> int | None:
    """This node's torchrun: waiting at the rendezvous for as long as it takes, then, once its ranks have a trial,
    for at most that trial's timeout (node 0 kills its own ranks then; these must not hang on in a collective)."""
    since: float | None = None
    while proc.poll() is None:
        if since is None and started.exists():
            since = time.monotonic()
        if since is not None and time.monotonic() - since > timeout_s + 30.0:
            return None
        time.sleep(0.5)
    return proc.returncode
