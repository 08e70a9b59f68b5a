"""The trial's process boundary: starting, watching and ending a trial's processes, and reading how it ended.

A trial starts one way, chosen once per trial from its config (``_start``: a fork of the fork server, ``_forks``; a
fresh interpreter; torchrun for several ranks). Its output goes to worker.log without any read that could hold the
sweep (``_log``). However it ends, its process tree is ended, and so is whatever it left in other sessions, adopted
by the launcher as a child subreaper (``_procs``); a run folder's next holder ends what a killed sweep left
(``_leftovers``). What the trial could not report itself is classified from what it left (``_ending``, with the error
texts of ``_outcome``). ``_node`` is the loop of a multi-node sweep's other nodes. The names both sides of the
boundary share are ``tunekit.contract.process``'s. Nothing here imports torch.
"""

from tunekit.launch._ending import classify, script_exit
from tunekit.launch._leftovers import LOCK_FILE, lock_run
from tunekit.launch._log import LOG_KEEP_BYTES
from tunekit.launch._node import run_node
from tunekit.launch._outcome import classify_error, silent_ranks
from tunekit.launch._procs import TERM_GRACE_S, kill_tree
from tunekit.launch._run import release_nodes, resolve_paths, run_task, run_trial, start_fork_server
from tunekit.launch._start import (
    BOOTSTRAP,
    Forked,
    Interpreter,
    Starter,
    Torchrun,
    child_env,
    script_command,
    starter_for,
    torchrun_command,
    worker_command,
)

__all__ = [
    "run_trial",
    "run_task",
    "resolve_paths",
    "start_fork_server",
    "release_nodes",
    "run_node",
    "lock_run",
    "LOCK_FILE",
    "kill_tree",
    "TERM_GRACE_S",
    "classify",
    "script_exit",
    "classify_error",
    "silent_ranks",
    "Starter",
    "Interpreter",
    "Forked",
    "Torchrun",
    "starter_for",
    "child_env",
    "worker_command",
    "script_command",
    "torchrun_command",
    "BOOTSTRAP",
    "LOG_KEEP_BYTES",
]
