"""The process contract: every name the launcher and a trial's processes share, defined once.

The launcher (``tunekit.launch``) starts a trial's processes and reads what they leave; the worker
(``tunekit.worker``), the fork server and the script-mode bootstrap run inside them. Between the two sides there is
no Python call, only these: environment variables, the worker's command lines, the files of a trial's folder and the
fork server's messages. This module imports nothing (the script-mode bootstrap loads it by path, in an interpreter
that may not import tunekit at all, to say so).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

# -- environment variables -------------------------------------------------------------------------------------

LAUNCHER_PID = "TUNEKIT_LAUNCHER_PID"
"""The sweep's pid: a trial's processes watch it and die with it."""
SWEEP = "TUNEKIT_SWEEP"
"""The sweep's token (:func:`sweep_token`): every process a trial starts inherits it, whatever session it moves to,
so a resumed sweep finds and ends what a killed one left (the run folder's lock file records it)."""
STARTED_AT = "TUNEKIT_STARTED_AT"
"""``time.time()`` when the launcher started the trial: the worker counts its start-up from it."""
TRIAL_DIR = "TUNEKIT_TRIAL_DIR"
"""The trial's folder (absolute)."""
SCRIPT_SPEC = "TUNEKIT_SCRIPT_SPEC"
"""Script mode: the trial's spec.json. The script's own process takes it out of its environment as the meter installs,
so no other Python child of the script installs the meter too."""
SCRIPT_MEASUREMENT = "TUNEKIT_SCRIPT_MEASUREMENT"
"""Script mode: where the script's process writes measurement.json."""
FORKED_FROM = "TUNEKIT_FORKED_FROM"
"""Set in a trial the fork server forked: the server's pid (the monitor counts the pages shared with it)."""
PER_TRIAL = (STARTED_AT, TRIAL_DIR, SCRIPT_SPEC, SCRIPT_MEASUREMENT)
"""What differs between the trials of one environment: a fork server is started without them."""

# -- the worker's command lines: python -m tunekit.worker ... ---------------------------------------------------

WORKER_MODULE = "tunekit.worker"
"""``python -m tunekit.worker SPEC MEASUREMENT``: one trial (every rank of it, under torchrun)."""
FORK_SERVER = "--fork-server"
"""``--fork-server FD``: the fork server, serving requests on the socket FD."""
RESOLVE = "--resolve"
"""``--resolve PATHS``: which import paths (JSON) do not resolve, as JSON on the last line."""
PREPARE = "--prepare"
"""``--prepare WORKLOAD``: build the dataset once before the sweep's first trial."""
FOLLOW = "--follow"
"""``--follow FOLDER``: another node's ranks of every trial (``tunekit node``)."""
RELEASE = "--release"
"""``--release``: the last rendezvous of a multi-node sweep, telling the other nodes it is over."""

# -- a trial's folder -------------------------------------------------------------------------------------------

SPEC_FILE = "spec.json"
MEASUREMENT_FILE = "measurement.json"
LOG_FILE = "worker.log"
"""The trial's output (stdout and stderr of every process), its head and tail kept."""
PID_FILE = "worker.pid"
"""The trial's pid while it runs."""
RANK_FAILURES = "measurement.rank*.json"
PROGRESS_MARKS = "progress.rank*"
SCRIPT_MARKS = "script.marks"
"""Script mode: where the script's process is, kept current as it goes (``SCRIPT_MARKS_FORMAT``: the DataLoaders it
built, whether its training loader was iterated, the training batches handed to its loop), so a script that ends
without a word (``os._exit``, a signal) is still said where it was."""
SCRIPT_MARKS_FORMAT = "<qqq"
NODE_TRIAL_FILE = "trial"
"""In a ``tunekit node`` folder: the number of the trial its ranks are serving."""
NODE_STOP_FILE = "stop"
"""In a ``tunekit node`` folder: the sweep released this node."""
NODE_LOG_FILE = "node.log"


def rank_failure_file(rank: int) -> str:
    """The failure a rank of a multi-rank trial writes beside measurement.json."""
    return f"measurement.rank{rank}.json"


def progress_file(rank: int) -> str:
    """The batch a rank last asked for or held (``tunekit.launch`` names the ranks that hung from them)."""
    return f"progress.rank{rank}"


def read_marks(path: str | os.PathLike[str]) -> tuple[int, int, int] | None:
    """``(built, iterated, batches)`` of a :data:`SCRIPT_MARKS` file; None without one."""
    import struct

    try:
        with open(path, "rb") as f:
            data = f.read(struct.calcsize(SCRIPT_MARKS_FORMAT))
        built, iterated, batches = struct.unpack(SCRIPT_MARKS_FORMAT, data)
    except (OSError, struct.error):
        return None
    return int(built), int(iterated), int(batches)


def rank_of(name: str) -> int:
    """The rank in a :func:`rank_failure_file` or :func:`progress_file` name."""
    return int(name.split(".")[1].removeprefix("rank"))


# -- the fork server's messages ---------------------------------------------------------------------------------


def fork_request(
    argv: list[str], env: dict[str, str], preload: list[str], script: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Fork one trial: the worker on ``argv``, or the user's program (``script``: ``path`` or ``module``, ``args``,
    ``cwd``), in ``env``, after importing ``preload``. Sent with one file descriptor, the trial's output pipe."""
    return {"argv": argv, "env": env, "preload": preload, **({"script": script} if script else {})}


def forked(pid: int) -> dict[str, Any]:
    """The server's answer to a request: the trial's pid."""
    return {"pid": pid}


def exited(pid: int, code: int) -> dict[str, Any]:
    """The server's word once a trial has ended (``code`` as ``subprocess.Popen.returncode``: negative for a
    signal)."""
    return {"exit": pid, "code": code}


def unsafe(reason: str) -> dict[str, Any]:
    """The server refuses to fork (an import initialised CUDA or started a thread) and exits."""
    return {"unsafe": reason}


def forked_pid(reply: dict[str, Any] | None) -> int | None:
    """The pid in a :func:`forked` answer; None for any other message."""
    return int(reply["pid"]) if reply and "pid" in reply else None


def exit_of(reply: dict[str, Any] | None) -> tuple[int, int] | None:
    """``(pid, code)`` of an :func:`exited` message; None for any other message."""
    return (int(reply["exit"]), int(reply["code"])) if reply and "exit" in reply else None


def unsafe_reason(reply: dict[str, Any] | None) -> str:
    """The reason of an :func:`unsafe` refusal; "" for any other message."""
    return str((reply or {}).get("unsafe") or "")


# -- the sweep's token -------------------------------------------------------------------------------------------

_TOKEN: dict[int, str] = {}


def sweep_token() -> str:
    """This process's token as a launcher (:data:`SWEEP`): random, one per process (a fork gets its own)."""
    pid = os.getpid()
    if pid not in _TOKEN:
        _TOKEN[pid] = f"{pid}-{uuid.uuid4().hex[:12]}"
    return _TOKEN[pid]
