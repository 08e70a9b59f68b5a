"""Run one trial in its own processes and turn however it ended into a measurement; the sweep's short tasks.

A trial starts one way, chosen once from its config (``_start.starter_for``): a fork of the fork server, a fresh
interpreter, or torchrun for several ranks (each rank in a session of its own). The worker, or the script's meter,
writes measurement.json itself when it can; what it cannot report (a timeout, a signal, a missing or malformed file)
``_ending`` classifies. However the trial ends (its own exit, its timeout, an interrupt of the caller) its whole
process tree is ended (``_procs.kill_tree``), and so is whatever its processes left running in other sessions: the
launcher adopts them as a child subreaper while the trial runs (``_procs.adopting``). This module never imports
torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tunekit._files import write_json_atomic
from tunekit.config import Config
from tunekit.contract import Measurement, TrialSpec
from tunekit.contract import process as names
from tunekit.launch import _ending, _forks, _start
from tunekit.launch._log import TrialLog
from tunekit.launch._procs import adopting, kill_tree
from tunekit.launch._start import Interpreter, TrialFiles, program_for, starter_for, torchrun_command

__all__ = ["run_trial", "run_task", "resolve_paths", "start_fork_server", "release_nodes"]


def run_trial(spec: TrialSpec, trial_dir: str | os.PathLike[str], timeout_s: float) -> Measurement:
    """Run ``spec`` in its own processes and return its measurement, also written to trial_dir/measurement.json
    (version 2, with the launcher's fields added).

    Never raises for a failed trial: the status and reason say what happened. KeyboardInterrupt (or any other
    exception in the caller while waiting) ends the trial's processes before propagating.
    """
    trial_dir = Path(trial_dir).resolve()  # absolute in the worker's command line, so a resume can find it
    trial_dir.mkdir(parents=True, exist_ok=True)
    starter, program, cfg = starter_for(spec)
    files_ = TrialFiles(spec, cfg, program, trial_dir / names.SPEC_FILE, trial_dir / names.MEASUREMENT_FILE)
    write_json_atomic(files_.spec_path, spec.to_dict())
    files_.out_path.unlink(missing_ok=True)
    for stale in [*trial_dir.glob(names.RANK_FAILURES), *trial_dir.glob(names.PROGRESS_MARKS)]:
        stale.unlink()
    t0 = time.perf_counter()
    log_path, pid_file = trial_dir / names.LOG_FILE, trial_dir / names.PID_FILE
    with adopting() as adopted, TrialLog(log_path) as log:
        proc = starter.start(files_)
        if proc is None:  # the fork server could not fork: a fresh interpreter
            starter = Interpreter()
            proc = starter.start(files_)
        log.follow(proc.stdout)
        pid_file.write_text(str(proc.pid))  # lets a resumed sweep kill a trial its dead predecessor left running
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # the trial's processes, and what they left in other sessions, end with it
            kill_tree(proc)
            adopted.end(keep=_forks.server_pids())
            pid_file.unlink(missing_ok=True)
    wall = time.perf_counter() - t0
    wrote = files_.out_path.exists() or any(trial_dir.glob(names.RANK_FAILURES))  # the script's own word
    result = _ending.classify(spec, proc.returncode, timed_out, timeout_s, files_.out_path, log_path)
    if program.script and result.status != "ok" and proc.returncode is not None and not timed_out:
        result = _ending.script_exit(result, proc.returncode, trial_dir, wrote)
    result.returncode, result.launcher_wall_s, result.pid = proc.returncode, wall, proc.pid
    result.started_by = starter.name
    refused = (
        _forks.refusal()
        if files_.cfg.trial.fork_server and isinstance(starter, Interpreter) and spec.knobs.ranks == 1
        else ""
    )
    if refused:
        result.fork_server_refused = refused  # why this trial paid a fresh interpreter
    write_json_atomic(files_.out_path, result.to_dict())
    return result


def run_task(cfg: Config, argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """One of the worker's short tasks (``--resolve PATHS``, ``--prepare WORKLOAD``) for ``cfg``: forked by the
    fork server (whose imports of torch and the workload's modules are then paid once for the whole sweep), else
    in a fresh interpreter. Returns its exit code (None when it timed out and was killed) and its output. An
    interrupt kills it before propagating."""
    env = _start.child_env()
    proc: Any = None
    if cfg.trial.fork_server and program_for(cfg).server_ahead:
        server = _forks.server_for(env)
        proc = None if server.broken else server.request(argv, env, _forks.workload_modules(cfg))
    if proc is None:
        proc = subprocess.Popen(
            [sys.executable, "-m", names.WORKER_MODULE, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        kill_tree(proc)
    reader.join(timeout=JOIN_READER_S)
    if not reader.is_alive():
        proc.stdout.close()
    return rc, b"".join(chunks).decode(errors="replace")


JOIN_READER_S = 5.0
"""How long a task's output may take to arrive once it has ended."""


def resolve_paths(cfg: Config, paths: dict[str, str]) -> dict[str, str | None] | str:
    """``config.load``'s import-path check run by :func:`run_task` (through the fork server, which the sweep's
    trials then use): each path's problem or None; a one-line reason when the check itself failed."""
    rc, out = run_task(cfg, [names.RESOLVE, json.dumps(paths)], 300.0)
    lines = [line for line in out.strip().splitlines() if line.strip()]
    if rc != 0 or not lines:
        return lines[-1] if lines else f"the check ended with exit code {rc} and no output"
    try:
        return dict(json.loads(lines[-1]))
    except ValueError:
        return lines[-1]


def start_fork_server(cfg: Config) -> None:
    """Start the fork server before the first trial asks for it, so that its imports (the interpreter, torch, the
    worker's modules: seconds on a fresh machine) run beside the sweep's dataset preparation rather than inside
    the first trial. Nothing with ``trial.fork_server: false``."""
    if cfg.trial.fork_server and program_for(cfg).server_ahead:
        _forks.server_for(_start.child_env())


def release_nodes(cfg: Config, timeout_s: float | None = None) -> bool:
    """Tell the other nodes' ``tunekit node`` loops that the sweep is over (a last rendezvous whose rank 0 hands
    out "stop"). True when the rendezvous completed."""
    if cfg.launch.nnodes < 2:
        return True
    proc = subprocess.Popen(
        torchrun_command(cfg.launch) + ["-m", names.WORKER_MODULE, names.RELEASE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=_start.child_env(),
    )
    if timeout_s is None:  # the rendezvous waits launch.join_timeout_s for the nodes; start-up beside it
        timeout_s = cfg.launch.join_timeout_s + 30.0
    try:
        return proc.wait(timeout=timeout_s) == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        kill_tree(proc)
