"""The fork server: pays a trial's start-up (the interpreter, ``import torch``, the worker's and the workload's
modules) once per sweep, then forks a fresh child per single-process trial.

``python -m tunekit.worker --fork-server FD`` serves requests on the SOCK_SEQPACKET socket ``FD``, one at a time;
the messages are ``tunekit.contract.process``'s. A request (``fork_request``) is sent with one file descriptor, the
write end of the pipe that becomes the trial's stdout and stderr; a script-mode trial's names the user's program
instead of the worker's argv: the child runs it as the interpreter would (``runpy``), its DataLoader hooked by
``tunekit.worker.script._hook``. The server imports the preload modules (a failing import is left for the trial to
report), then forks; it answers ``forked(PID)``, and ``exited(PID, CODE)`` once that child has ended. It answers
``unsafe(REASON)`` and exits instead when an import initialised CUDA or started its driver (a child forked after that
could not use the GPU), or started a thread.

Isolation stays what a fresh interpreter gives: the child starts a session of its own (the launcher kills its whole
process tree on timeout), takes the launcher's environment, and initialises CUDA itself, after the fork; what one
trial changes in its modules dies with it. The server holds no thread (forking a threaded process can deadlock the
child) and ends when the launcher closes its end of the socket, which the kernel also does when the launcher dies.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import threading
from typing import Any

from tunekit.contract import process as names

__all__ = ["serve"]

_MAX_MESSAGE = 1 << 20


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def _preload(modules: list[str]) -> None:
    for name in modules:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the trial imports it again and reports what fails
            pass


def _child(
    argv: list[str], env: dict[str, str], out_fd: int, sock: socket.socket, script: dict[str, Any] | None = None
) -> None:
    """The trial: a session of its own, the pipe as stdout and stderr, the launcher's environment, the signal
    dispositions of a fresh interpreter (the server's own: it installs none); never returns."""
    code = 1
    try:
        sock.close()
        os.setsid()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.environ.clear()
        os.environ.update(env)
        os.environ[names.FORKED_FROM] = str(os.getppid())  # the monitor counts the pages shared with the server
        numpy = sys.modules.get("numpy")  # its global generator reseeded, as in a fresh interpreter (``random``
        if numpy is not None:  # reseeds itself at a fork); else every trial would draw the same numbers
            numpy.random.seed()
        if script is not None:
            code = _run_script(script)
        else:
            sys.argv = [os.path.join(os.path.dirname(__file__), "__main__.py"), *argv]
            from tunekit.worker import main

            code = main(argv)
    except SystemExit as exc:  # as the interpreter would exit
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 - whatever happens, the child never returns into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if isinstance(exc.code, int):
        return exc.code
    if exc.code is not None:  # sys.exit("message") prints it, as the interpreter does
        sys.stderr.write(f"{exc.code}\n")
        return 1
    return 0


def _run_script(script: dict[str, Any]) -> int:
    """The user's program as ``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` would run it, in its folder, with
    the meter's hook installed (what the bootstrap's sitecustomize does in a fresh interpreter); an uncaught
    exception goes to ``sys.excepthook`` (the hook's writes the trial's failure), and the interpreter's exit follows:
    non-daemon threads joined, ``atexit`` handlers run."""
    import atexit
    import runpy

    os.chdir(script["cwd"])
    from tunekit.worker.script import _hook

    _hook.install()
    code = 0
    try:
        if "module" in script:
            sys.argv = [script["module"], *script["args"]]
            sys.path[0] = script["cwd"]
            runpy.run_module(script["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [script["path"], *script["args"]]
            sys.path[0] = os.path.dirname(os.path.realpath(script["path"]))  # as the interpreter: symlinks resolved
            runpy.run_path(script["path"], run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own exit: non-daemon threads joined
    atexit._run_exitfuncs()
    return code


def _cuda_poisoned() -> bool:
    """Whether a child forked now could not use CUDA: something here initialised CUDA, or started its driver
    (``torch.cuda.is_available()`` without the NVML check does, and ``is_initialized()`` does not show it), which a
    throwaway child sees as a bad fork."""
    import torch

    if torch.cuda.is_initialized():
        return True
    pid = os.fork()
    if pid == 0:
        os._exit(2 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 2


def _unsafe() -> str | None:
    """Why a child forked now would not be a clean trial, or None."""
    if threading.active_count() > 1:  # a fork copies the lock states of threads it does not copy (checked first:
        # the CUDA check forks)
        return "a module imported for the trials started a thread; a child forked after that could deadlock"
    if _cuda_poisoned():
        return "a module imported for the trials initialised CUDA; a child forked after that cannot use the GPU"
    return None


def serve(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    # a workload module asking torch.cuda.is_available() at import must not start the driver here (the trials the
    # server forks could not use CUDA); the trials themselves run with the launcher's environment
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    import torch  # noqa: F401 - paid once

    import tunekit.worker.factory._measure  # noqa: F401 - the worker's own imports, paid once

    _preload(["torchvision"])
    checked = False  # whether the modules imported so far are known to leave CUDA untouched
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 1)
        except OSError:
            return 0
        if not data:
            return 0  # the launcher closed its end (or died)
        request = json.loads(data)
        before = len(sys.modules)
        _preload(list(request.get("preload") or []))
        checked = checked and len(sys.modules) == before
        unsafe = None if checked else _unsafe()
        if unsafe:
            for f in fds:
                os.close(f)
            _send(sock, names.unsafe(unsafe))
            return 1
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(list(request["argv"]), dict(request["env"]), fds[0], sock, request.get("script"))
        checked = True
        for f in fds:
            os.close(f)
        _send(sock, names.forked(pid))
        _, status = os.waitpid(pid, 0)
        _send(sock, names.exited(pid, os.waitstatus_to_exitcode(status)))
