"""Run one trial in its own subprocess and session, and turn however it ended into a measurement.

A trial of several ranks (``knobs.ranks > 1``) runs under ``torch.distributed.run`` (torchrun) in that same session;
torchrun starts each rank in a session of its own, so killing a trial also walks its process tree. A rank that fails
writes measurement.rank<r>.json, which stands in for the missing measurement.json.

The worker writes measurement.json itself when it can. What it cannot report — a timeout, a signal, a missing or
malformed file — the launcher classifies with ``tunekit.ending``. On timeout (or when the caller is interrupted) the
launcher terminates the trial's whole process group, then kills it (``_procs.kill_tree``), so no DataLoader worker
outlives its trial. A single-process trial is forked by the fork server when it can be (``_forks``). This module
never imports torch.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import tunekit
from tunekit import _forks, ending
from tunekit._files import write_json_atomic
from tunekit._procs import TERM_GRACE_S, kill_tree
from tunekit.contract import Measurement, TrialSpec

__all__ = ["run_trial", "run_task", "resolve_paths", "kill_tree", "worker_command", "script_command",
           "torchrun_command", "release_nodes",
           "child_env", "LOG_KEEP_BYTES", "BOOTSTRAP"]

LOG_KEEP_BYTES = 4 * 2**20
"""worker.log keeps the first and the last this many bytes of a trial's output (a dataset that prints on every
sample would otherwise fill the disk), with a line saying how much was left out between them."""


class _CappedLog:
    """The trial's output, read from its pipe by a thread: the head written as it comes, the tail kept in memory
    and written when the trial ends."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "wb")
        self._written = 0
        self._tail = bytearray()
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self._pipe: Any = None

    def __enter__(self) -> _CappedLog:
        return self

    def follow(self, pipe: Any) -> None:
        self._pipe = pipe
        self._thread = threading.Thread(target=self._read, args=(pipe,), name="tunekit-log", daemon=True)
        self._thread.start()

    def _read(self, pipe: Any) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            head = max(0, min(len(chunk), LOG_KEEP_BYTES - self._written))
            if head:
                self._file.write(chunk[:head])
                self._file.flush()
                self._written += head
            self._tail += chunk[head:]
            if len(self._tail) > LOG_KEEP_BYTES:
                self._dropped += len(self._tail) - LOG_KEEP_BYTES
                del self._tail[: len(self._tail) - LOG_KEEP_BYTES]

    def __exit__(self, *exc: Any) -> None:
        if self._thread is not None:
            self._thread.join(timeout=TERM_GRACE_S)
        if self._pipe is not None:
            self._pipe.close()
        if self._dropped:
            self._file.write(f"\n[tunekit: {self._dropped} bytes of output left out here; worker.log keeps the "
                             f"first and last {LOG_KEEP_BYTES} bytes]\n".encode())
        self._file.write(bytes(self._tail))
        self._file.close()


def _start(spec: TrialSpec, spec_path: Path, out_path: Path) -> Any:
    """The trial's process: the user's command (script mode), else a fork of the fork server, else a fresh
    interpreter running the worker; each leads its own session, its output piped to worker.log."""
    env = child_env()
    # the worker counts its start-up from here: interpreter and imports, or the fork
    trial_env = {**env, "TUNEKIT_STARTED_AT": repr(time.time()), "TUNEKIT_TRIAL_DIR": str(spec_path.parent)}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL,
             "start_new_session": True}
    script = spec.config.get("script")
    if script:
        command, script_env = script_command(spec), _script_env(script, trial_env, spec_path, out_path)
        forked = _forks.fork_script(spec, command, script.get("cwd") or os.getcwd(), script_env)
        if forked is not None:
            return forked
        return subprocess.Popen(command, cwd=script.get("cwd") or None, env=script_env, **pipes)
    forked = _forks.fork_trial(spec, [str(spec_path), str(out_path)], env, trial_env)
    if forked is not None:
        return forked
    return subprocess.Popen(worker_command(spec) + [str(spec_path), str(out_path)], env=trial_env, **pipes)


def run_trial(spec: TrialSpec, trial_dir: str | os.PathLike[str], timeout_s: float) -> Measurement:
    """Run ``spec`` in a fresh subprocess and return its measurement, also written to trial_dir/measurement.json
    (version 2, with the launcher's fields added).

    Never raises for a failed trial: the status and reason say what happened. KeyboardInterrupt (or any other
    exception in the caller while waiting) kills the trial's process tree before propagating.
    """
    trial_dir = Path(trial_dir).resolve()  # absolute in the worker's command line, so a resume can find it
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = trial_dir / "spec.json", trial_dir / "measurement.json"
    write_json_atomic(spec_path, spec.to_dict())
    out_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with _CappedLog(trial_dir / "worker.log") as log:
        for stale in [*trial_dir.glob("measurement.rank*.json"), *trial_dir.glob("progress.rank*")]:
            stale.unlink()
        proc = _start(spec, spec_path, out_path)
        log.follow(proc.stdout)
        pid_file = trial_dir / "worker.pid"
        pid_file.write_text(str(proc.pid))  # lets a resumed sweep kill a trial its dead predecessor left running
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:
            kill_tree(proc)
            raise
        finally:
            kill_tree(proc)
            pid_file.unlink(missing_ok=True)
    wall = time.perf_counter() - t0
    result = ending.classify(spec, proc.returncode, timed_out, timeout_s, out_path, trial_dir / "worker.log")
    if spec.config.get("script") and result.status != "ok" and proc.returncode and not timed_out:
        result = ending.script_exit(result, proc.returncode, trial_dir / "worker.log")
    result.returncode, result.launcher_wall_s, result.pid = proc.returncode, wall, proc.pid
    result.started_by = "fork server" if isinstance(proc, _forks.Forked) else "interpreter"
    refused = _forks.refusal() if _forks.forkable(spec) and not isinstance(proc, _forks.Forked) else ""
    if refused:
        result.fork_server_refused = refused  # why this trial paid a fresh interpreter
    write_json_atomic(out_path, result.to_dict())
    return result


def run_task(config: dict[str, Any], argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """One of the worker's short tasks (``--resolve PATHS``, ``--prepare WORKLOAD``) for ``config``: forked by the
    fork server (whose imports of torch and the workload's modules are then paid once for the whole sweep), else
    in a fresh interpreter. Returns its exit code (None when it timed out and was killed) and its output. An
    interrupt kills it before propagating."""
    env = child_env()
    proc: Any = None
    if bool((config.get("trial") or {}).get("fork_server", True)) and not config.get("script"):
        server = _forks.server_for(env)
        proc = None if server.broken else server.request(argv, env, _forks.workload_modules(config))
    if proc is None:
        proc = subprocess.Popen([sys.executable, "-m", "tunekit.worker", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
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


def resolve_paths(config: dict[str, Any], paths: dict[str, str]) -> dict[str, str | None] | str:
    """``config.load``'s import-path check run by :func:`run_task` (through the fork server, which the sweep's
    trials then use): each path's problem or None; a one-line reason when the check itself failed."""
    rc, out = run_task(config, ["--resolve", json.dumps(paths)], 300.0)
    lines = [line for line in out.strip().splitlines() if line.strip()]
    if rc != 0 or not lines:
        return lines[-1] if lines else f"the check ended with exit code {rc} and no output"
    try:
        return dict(json.loads(lines[-1]))
    except ValueError:
        return lines[-1]


def start_fork_server(config: dict[str, Any]) -> None:
    """Start the fork server before the first trial asks for it, so that its imports (the interpreter, torch, the
    worker's modules: seconds on a fresh machine) run beside the sweep's dataset preparation rather than inside
    the first trial. Nothing with ``trial.fork_server: false``."""
    if bool((config.get("trial") or {}).get("fork_server", True)) and not config.get("script"):
        _forks.server_for(child_env())


def torchrun_command(launch: dict[str, Any], node_rank: int = 0) -> list[str]:
    """torchrun starting ``launch``'s ranks of this node (node ``node_rank``), before ``-m tunekit.worker ...``."""
    nnodes = int(launch.get("nnodes") or 1)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={int(launch['nproc_per_node'])}",
           f"--nnodes={nnodes}", "--max-restarts=0", "--monitor-interval=0.5"]
    if nnodes == 1:
        return cmd + ["--standalone"]  # a free port on this host
    host, port = str(launch["rdzv_endpoint"]).rsplit(":", 1)  # static rendezvous: node 0 hosts the store
    join = max(1, math.ceil(_join_timeout_s(launch)))  # the store waits this long for the nodes
    return cmd + [f"--node-rank={node_rank}", f"--master-addr={host}", f"--master-port={port}",
                  f"--rdzv-conf=timeout={join}"]


def _join_timeout_s(launch: dict[str, Any]) -> float:
    """``launch.join_timeout_s`` of a launch section as a dict (config's default where a hand-made one lacks it)."""
    from tunekit.config import Launch

    return float(launch.get("join_timeout_s") or Launch().join_timeout_s)


def worker_command(spec: TrialSpec) -> list[str]:
    """The command that runs a trial's worker (its spec and measurement paths follow): the worker itself, or
    torchrun starting ``knobs.ranks`` of them across ``launch.nnodes`` nodes (this one node 0)."""
    if spec.knobs.ranks <= 1:
        return [sys.executable, "-m", "tunekit.worker"]
    launch = dict(spec.config.get("launch") or {})
    launch["nproc_per_node"] = spec.knobs.ranks // int(launch.get("nnodes") or 1)
    return torchrun_command(launch) + ["-m", "tunekit.worker"]


BOOTSTRAP = Path(tunekit.__file__).resolve().parent / "worker" / "_bootstrap"
"""The folder of script mode's ``sitecustomize``: first on a script trial's PYTHONPATH, it loads the meter into the
user's own process (and every process the command starts: torchrun's ranks too)."""


def script_command(spec: TrialSpec) -> list[str]:
    """A script trial's command: ``script.command`` with the trial's knobs filled in; for the script's own
    baseline (stage ``baseline``), only ``script.baseline``'s values, every other placeholder left out with its flag."""
    from tunekit.command import fill_command

    script = spec.config["script"]
    if spec.stage == "baseline":
        return _ranks_of(spec, fill_command(script["command"], dict(script.get("baseline") or {})))
    knobs = spec.knobs.to_dict()
    extra = knobs.pop("extra")
    baselines = {key: (value.get("values") or [None])[0]
                 for key, value in ((spec.config.get("search") or {}).get("extra") or {}).items()}
    return _ranks_of(spec, fill_command(script["command"], {**knobs, **baselines, **extra}))


def _ranks_of(spec: TrialSpec, command: list[str]) -> list[str]:
    """A script trial of a multi-rank config runs under torchrun with the trial's ranks (1 for the ceilings and
    the scaling trial): a ``torchrun …`` command keeps its own options, ``python train.py …`` gets launch's."""
    from tunekit.command import torchrun_split

    launch = dict(spec.config.get("launch") or {})
    if int(launch.get("nproc_per_node") or 1) * int(launch.get("nnodes") or 1) <= 1:
        return command
    found = torchrun_split(command)
    if found is None:
        return torchrun_command({**launch, "nproc_per_node": spec.knobs.ranks}) + command[1:]
    options, _, program = found
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={spec.knobs.ranks}",
            "--max-restarts=0", "--monitor-interval=0.5", *options, *program]


def _script_env(script: dict[str, Any], env: dict[str, str], spec_path: Path, out_path: Path) -> dict[str, str]:
    """The script's environment: the trial's, ``script.env`` over it, the bootstrap first on PYTHONPATH, and where
    the hook finds the trial's spec and writes its measurement."""
    extra = {str(k): str(v) for k, v in (script.get("env") or {}).items()}
    # the bootstrap first, then the script's own PYTHONPATH (script.env), then the launcher's
    path = os.pathsep.join(p for p in (str(BOOTSTRAP), extra.get("PYTHONPATH"), env.get("PYTHONPATH")) if p)
    return {**env, **extra, "PYTHONPATH": path, "TUNEKIT_SCRIPT_SPEC": str(spec_path),
            "TUNEKIT_SCRIPT_MEASUREMENT": str(out_path)}


def release_nodes(config: dict[str, Any], timeout_s: float | None = None) -> bool:
    """Tell the other nodes' ``tunekit node`` loops that the sweep is over (a last rendezvous whose rank 0 hands
    out "stop"). True when the rendezvous completed."""
    launch = config.get("launch") or {}
    if int(launch.get("nnodes") or 1) < 2:
        return True
    proc = subprocess.Popen(torchrun_command(launch) + ["-m", "tunekit.worker", "--release"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=child_env())
    if timeout_s is None:  # the rendezvous waits launch.join_timeout_s for the nodes; start-up beside it
        timeout_s = _join_timeout_s(launch) + 30.0
    try:
        return proc.wait(timeout=timeout_s) == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        kill_tree(proc)


def child_env() -> dict[str, str]:
    """The environment of a trial's processes: this tunekit and the caller's folder importable, unbuffered output,
    and this process's pid, which every trial process watches (a trial dies with whoever launched it)."""
    env = dict(os.environ)
    # The worker must import this tunekit and the user's own modules (relative to where they ran us).
    roots = [str(Path(tunekit.__file__).resolve().parent.parent), os.getcwd()]
    if env.get("PYTHONPATH"):
        roots.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(roots)
    env["PYTHONUNBUFFERED"] = "1"
    env["TUNEKIT_LAUNCHER_PID"] = str(os.getpid())  # the worker (every rank) dies with the sweep
    return env
