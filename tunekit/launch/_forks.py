"""The launcher's end of the fork server (``python -m tunekit.worker --fork-server``,
tunekit/worker/script/_forkserver.py): one server per environment and working folder, started at the first trial
that can use it and ended with this process; it forks a trial (the worker, or the user's script run as its
interpreter would) with torch and the workload's modules already imported. This module never imports torch."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from tunekit.config import IMPORT_PATH_KEYS, Config
from tunekit.contract import process as names
from tunekit.launch._procs import TERM_GRACE_S, group_alive, signal_group

__all__ = [
    "ForkServer",
    "Forked",
    "fork_trial",
    "fork_script",
    "server_for",
    "workload_modules",
    "refusal",
    "close_servers",
    "server_pids",
    "SERVERS",
]


class ForkServer:
    """One fork server process and the socket to it (its key: the environment and folder it was started for)."""

    def __init__(self, env: dict[str, str], cwd: str | None = None):
        self.key = server_key(env, cwd)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", names.WORKER_MODULE, names.FORK_SERVER, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )
        theirs.close()
        self.sock = ours
        self.broken = False
        self.refusal = ""  # the server's reason when it refused to fork (an import made forking unsafe)

    def request(
        self, argv: list[str], env: dict[str, str], preload: list[str], script: dict[str, Any] | None = None
    ) -> Forked | None:
        """Fork one trial (the worker on ``argv``, or the user's ``script``, `script_entry`); None when the server
        cannot (then it is not asked again)."""
        read_end, write_end = os.pipe()
        reply: dict[str, Any] | None = None
        message = names.fork_request(argv, env, preload, script)
        try:
            socket.send_fds(self.sock, [json.dumps(message).encode()], [write_end])
            while reply is None or names.exit_of(reply):  # an earlier trial's exit, unread after an interrupt
                reply = self.receive(timeout=_FORK_REPLY_S)
                if reply is None:
                    break
        except (OSError, TimeoutError):
            reply = None
        except BaseException:  # interrupted before the pid came: the server goes, and its child with it
            os.close(read_end)
            self.close()
            raise
        finally:
            os.close(write_end)
        pid = names.forked_pid(reply)
        if pid is None:
            self.refusal = names.unsafe_reason(reply)
            os.close(read_end)
            self.close()
            return None
        return Forked(self, pid, os.fdopen(read_end, "rb"))

    def receive(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next message; None when it closed the socket; TimeoutError when none came in time."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            raise TimeoutError
        data = self.sock.recv(1 << 16)
        if not data:
            self.broken = True
            return None
        return dict(json.loads(data))

    def close(self) -> None:
        self.broken = True
        self.sock.close()
        try:
            self.proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Forked:
    """A trial the fork server forked: what run_trial and kill_tree use of ``subprocess.Popen``."""

    def __init__(self, server: ForkServer, pid: int, stdout: Any):
        self.server, self.pid, self.stdout = server, pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.wait(timeout=0)
            except subprocess.TimeoutExpired:
                pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        gone_since = None  # when the trial's group was first seen gone with no exit message yet
        while self.returncode is None:
            left = _EXIT_POLL_S if deadline is None else min(_EXIT_POLL_S, max(0.0, deadline - time.monotonic()))
            try:
                reply = self.server.receive(timeout=left)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(f"trial {self.pid}", timeout or 0.0) from None
                if group_alive(self.pid):
                    gone_since = None
                elif gone_since is None:
                    gone_since = time.monotonic()
                elif time.monotonic() - gone_since >= _EXIT_POLL_S:
                    # the server answers as soon as it has reaped the trial: its exit message was read by a wait
                    # that an interrupt cut short before it kept the code
                    self.returncode = -signal.SIGKILL
                continue
            if reply is None:  # the server died: wait for the trial's own group to go
                while group_alive(self.pid):
                    if deadline is not None and time.monotonic() >= deadline:
                        raise subprocess.TimeoutExpired(f"trial {self.pid}", timeout or 0.0)
                    time.sleep(0.05)
                self.returncode = -signal.SIGKILL
            elif (names.exit_of(reply) or (None,))[0] == self.pid:
                self.returncode = names.exit_of(reply)[1]  # type: ignore[index]
        return self.returncode


_EXIT_POLL_S = 1.0
"""How often a wait on a forked trial looks whether its process group is still there."""
_FORK_REPLY_S = 120.0
"""How long the fork server may take to answer a request: its imports of torch and the workload's modules."""
SERVERS: dict[str, ForkServer] = {}


def server_key(env: dict[str, str], cwd: str | None = None) -> tuple[Any, ...]:
    """What a fork server is started for: the trials' environment and working folder (``cwd``, else this
    process's)."""
    return (tuple(sorted(env.items())), os.path.abspath(cwd or os.getcwd()))


def fork_trial(cfg: Config, argv: list[str], env: dict[str, str], trial_env: dict[str, str]) -> Forked | None:
    """The worker's trial forked by this process's fork server (one per environment and working folder, started
    when first needed); None once the server for this environment could not fork (a module it imported initialised
    CUDA, or it died): the caller then starts a fresh interpreter."""
    server = server_for(env)
    return None if server.broken else server.request(argv, trial_env, workload_modules(cfg))


def fork_script(command: list[str], cwd: str, env: dict[str, str]) -> Forked | None:
    """A script trial forked by a fork server started in the script's environment (``script.env`` and the
    bootstrap on ``PYTHONPATH``), which then runs the program as its interpreter would (``runpy``: ``__main__``, its
    ``sys.argv`` and ``sys.path[0]``) in the script's folder: the interpreter's start and ``import torch`` are paid
    once per sweep. Only for a single-process trial whose command is ``python SCRIPT …`` or ``python -m MODULE …``
    run by this very interpreter (``sys.executable``), without interpreter options; None otherwise, or once the
    server could not fork (the caller then runs the command itself)."""
    from tunekit.command import script_entry, script_imports

    entry = script_entry(command, cwd, env.get("PATH"), sys.executable)
    if entry is None:
        return None
    # started in the script's folder, as the command would be: the interpreter makes the relative entries of
    # PYTHONPATH absolute against the folder it starts in, and the server's imports and sys.path are the child's
    server = server_for({k: v for k, v in env.items() if k not in names.PER_TRIAL}, cwd)
    preload = ["tunekit.worker.script._hook", *script_imports(entry)]
    return None if server.broken else server.request([], env, preload, script=entry)


def server_for(env: dict[str, str], cwd: str | None = None) -> ForkServer:
    """This process's fork server for ``env`` in ``cwd`` (else this process's folder), started when there is none
    for it yet."""
    server = SERVERS.get("server")
    if server is not None and server.key != server_key(env, cwd):
        server.close()
        server = None
    if server is None:
        server = SERVERS["server"] = ForkServer(env, cwd)
    return server


def workload_modules(cfg: Config) -> list[str]:
    """The modules of the workload's import paths (``module:attr``), for the fork server to import once."""
    if cfg.workload is None:
        return []
    paths = [getattr(cfg.workload, n, None) for n in IMPORT_PATH_KEYS]
    return sorted({p.split(":", 1)[0] for p in paths if isinstance(p, str) and ":" in p})


@atexit.register
def close_servers() -> None:
    for server in list(SERVERS.values()):
        server.close()
    SERVERS.clear()


def server_pids() -> set[int]:
    """The pids of this process's fork servers (children of the launcher that are no trial's)."""
    return {server.proc.pid for server in SERVERS.values() if server.proc.poll() is None}


def refusal() -> str:
    """Why the current fork server refused to fork (an import made forking unsafe), or ""."""
    current = SERVERS.get("server")
    return current.refusal if current is not None else ""
