"""How a trial's processes start, as two choices made once per trial from its config: what runs (a
:class:`Program`: tunekit's worker on factories, or the user's own script with the meter hooked in, :func:`program_for`)
and how it is started (a :class:`Starter`: a fresh interpreter, torchrun, or a fork of the fork server,
:func:`starter_for`); and the commands and environment they start with. This module never imports torch."""

from __future__ import annotations

import abc
import math
import os
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import tunekit
from tunekit.command import fill_command, torchrun_split
from tunekit.config import Config, Launch, from_dict
from tunekit.contract import TrialSpec
from tunekit.contract import process as names
from tunekit.launch import _forks

__all__ = [
    "Program",
    "Worker",
    "Script",
    "program_for",
    "Starter",
    "Interpreter",
    "Torchrun",
    "Forked",
    "TrialFiles",
    "starter_for",
    "child_env",
    "worker_command",
    "script_command",
    "torchrun_command",
    "BOOTSTRAP",
    "POPEN_PIPES",
]

BOOTSTRAP = Path(tunekit.__file__).resolve().parent / "worker" / "script" / "_bootstrap"
"""The folder of script mode's ``sitecustomize``: first on a script trial's PYTHONPATH, it loads the meter into the
user's own process (and into torchrun's ranks); the process that loads it takes the trial out of its environment,
so no other Python child of the script loads it too."""

POPEN_PIPES: dict[str, Any] = {
    "stdout": subprocess.PIPE,
    "stderr": subprocess.STDOUT,
    "stdin": subprocess.DEVNULL,
    "start_new_session": True,
}
"""A trial's process: its own session, stdout and stderr into one pipe (worker.log), no stdin."""


@dataclass(frozen=True)
class TrialFiles:
    """What a starter needs of one trial: its spec (and typed config), its folder's spec.json and measurement.json."""

    spec: TrialSpec
    cfg: Config
    program: Program
    """What this trial runs (:func:`program_for`)."""
    spec_path: Path
    out_path: Path

    def env(self) -> dict[str, str]:
        """The trial's environment: the launcher's (:func:`child_env`), when it started, its folder."""
        # the worker counts its start-up from here: interpreter and imports, or the fork
        return {**child_env(), names.STARTED_AT: repr(time.time()), names.TRIAL_DIR: str(self.spec_path.parent)}


class Starter(abc.ABC):
    """Starts one trial's processes. The process it returns leads its own session, its stdout and stderr one pipe;
    it offers what ``subprocess.Popen`` offers of ``pid``, ``stdout``, ``poll()``, ``wait(timeout)`` and
    ``returncode`` (``kill_tree`` ends it and every descendant)."""

    name: ClassVar[str]
    """What measurement.json's ``started_by`` says."""

    @abc.abstractmethod
    def start(self, trial: TrialFiles) -> Any:
        """Start the trial; None when this starter cannot (the caller then falls back to :class:`Interpreter`)."""


class Program(abc.ABC):
    """What a trial runs: the command a fresh interpreter (or torchrun) starts, or the fork the fork server makes.
    One implementation per kind of job (:func:`program_for`); the starters call these and never ask which."""

    script: ClassVar[bool]
    """Whether the user's own script runs (its exit code and last words then explain a failure)."""
    server_ahead: ClassVar[bool]
    """Whether the fork server its trials fork from can start before the first trial and fork the sweep's short
    tasks: the worker's is this process's environment; a script's has the script's folder and environment."""

    @abc.abstractmethod
    def command(self, trial: TrialFiles) -> tuple[list[str], str | None, dict[str, str]]:
        """The trial's command line, its folder (None: this process's) and environment."""

    @abc.abstractmethod
    def fork(self, trial: TrialFiles) -> Any:
        """The trial forked by the fork server (its process as ``_forks`` returns it), None when it cannot be."""

    @abc.abstractmethod
    def torchrun(self, spec: TrialSpec, cfg: Config) -> bool:
        """Whether the trial's ranks are started under torchrun."""


class Worker(Program):
    """tunekit's worker measuring the factories a config names: ``python -m tunekit.worker SPEC MEASUREMENT``."""

    script = False
    server_ahead = True

    def command(self, trial: TrialFiles) -> tuple[list[str], str | None, dict[str, str]]:
        command = worker_command(trial.spec, trial.cfg) + [str(trial.spec_path), str(trial.out_path)]
        return command, None, trial.env()

    def fork(self, trial: TrialFiles) -> Any:
        return _forks.fork_trial(trial.cfg, [str(trial.spec_path), str(trial.out_path)], child_env(), trial.env())

    def torchrun(self, spec: TrialSpec, cfg: Config) -> bool:
        return spec.knobs.ranks > 1


class Script(Program):
    """The user's own command, its knobs filled in, the meter loaded into its interpreter by the bootstrap."""

    script = True
    server_ahead = False

    def command(self, trial: TrialFiles) -> tuple[list[str], str | None, dict[str, str]]:
        script = trial.cfg.script
        assert script is not None
        return script_command(trial.spec, cfg=trial.cfg), script.cwd or None, _script_env(trial.cfg, trial.env(), trial)

    def fork(self, trial: TrialFiles) -> Any:
        command, cwd, env = self.command(trial)
        return _forks.fork_script(command, cwd or os.getcwd(), env)

    def torchrun(self, spec: TrialSpec, cfg: Config) -> bool:
        # a multi-rank script keeps its torchrun even for the one-rank ceilings: its loop may expect the ranks' env
        return spec.knobs.ranks > 1 or cfg.launch.world > 1


def program_for(cfg: Config) -> Program:
    """What a trial of ``cfg`` runs: its ``script``, or the worker on its ``workload``."""
    return Script() if cfg.script is not None else Worker()


class Interpreter(Starter):
    """A fresh interpreter: the trial's program as a command (``python -m tunekit.worker ...`` or the user's)."""

    name = "interpreter"

    def start(self, trial: TrialFiles) -> Any:
        command, cwd, env = trial.program.command(trial)
        return subprocess.Popen(command, cwd=cwd, env=env, **POPEN_PIPES)


class Torchrun(Interpreter):
    """torchrun starting the trial's ranks (each in a session of its own; ``kill_tree`` walks them)."""

    name = "torchrun"


class Forked(Starter):
    """A fork of the fork server (``_forks``), with torch and the workload's modules already imported: the worker, or
    the user's ``python SCRIPT`` / ``python -m MODULE`` run as its interpreter would."""

    name = "fork server"

    def start(self, trial: TrialFiles) -> Any:
        return trial.program.fork(trial)


def starter_for(spec: TrialSpec) -> tuple[Starter, Program, Config]:
    """The one way this trial starts and what it runs, from its config: torchrun for several ranks; else a fork of
    the fork server (``trial.fork_server``, on by default); else a fresh interpreter. Also the spec's config,
    typed."""
    cfg = from_dict(spec.config, check_imports=False)
    program = program_for(cfg)
    if program.torchrun(spec, cfg):
        return Torchrun(), program, cfg
    if cfg.trial.fork_server:
        return Forked(), program, cfg
    return Interpreter(), program, cfg


def torchrun_command(launch: Launch, node_rank: int = 0, nproc_per_node: int | None = None) -> list[str]:
    """torchrun starting ``launch``'s ranks of this node (node ``node_rank``), before ``-m tunekit.worker ...``."""
    nproc = launch.nproc_per_node if nproc_per_node is None else nproc_per_node
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={int(nproc)}",
        f"--nnodes={launch.nnodes}",
        "--max-restarts=0",
        "--monitor-interval=0.5",
    ]
    if launch.nnodes == 1:
        return cmd + ["--standalone"]  # a free port on this host
    host, port = str(launch.rdzv_endpoint).rsplit(":", 1)  # static rendezvous: node 0 hosts the store
    join = max(1, math.ceil(launch.join_timeout_s))  # the store waits this long for the nodes
    return cmd + [
        f"--node-rank={node_rank}",
        f"--master-addr={host}",
        f"--master-port={port}",
        f"--rdzv-conf=timeout={join}",
    ]


def worker_command(spec: TrialSpec, cfg: Config | None = None) -> list[str]:
    """The command that runs a trial's worker (its spec and measurement paths follow): the worker itself, or
    torchrun starting ``knobs.ranks`` of them across ``launch.nnodes`` nodes (this one node 0)."""
    if spec.knobs.ranks <= 1:
        return [sys.executable, "-m", names.WORKER_MODULE]
    launch = (cfg or from_dict(spec.config, check_imports=False)).launch
    return torchrun_command(launch, nproc_per_node=spec.knobs.ranks // launch.nnodes) + ["-m", names.WORKER_MODULE]


def script_command(
    spec: TrialSpec, *, trial: bool = True, leave_out: Collection[str] = (), cfg: Config | None = None
) -> list[str]:
    """A script trial's command: ``script.command`` with the trial's knobs filled in, ``script.trial_args`` after
    it; for the script's own baseline (stage ``baseline``), only ``script.baseline``'s values, every other
    placeholder left out with its flag. ``trial=False``: the command to apply, without the trial's own arguments;
    ``leave_out``: knobs whose placeholders go with their flags (values the script has as its own defaults);
    ``cfg``: the spec's config, typed, when the caller has parsed it."""
    cfg = cfg or from_dict(spec.config, check_imports=False)
    script = cfg.script
    assert script is not None
    own = list(script.trial_args) if trial else []
    if spec.stage == "baseline":
        return _ranks_of(spec, cfg.launch, fill_command(script.command, dict(script.baseline)) + own)
    knobs = spec.knobs.to_dict()
    extra = knobs.pop("extra")
    baselines = {key: (value.get("values") or [None])[0] for key, value in cfg.search.extra.items()}
    values = {k: v for k, v in {**knobs, **baselines, **extra}.items() if k not in leave_out}
    return _ranks_of(spec, cfg.launch, fill_command(script.command, values) + own)


def _ranks_of(spec: TrialSpec, launch: Launch, command: list[str]) -> list[str]:
    """A script trial of a multi-rank config runs under torchrun with the trial's ranks (1 for the ceilings and
    the scaling trial): a ``torchrun …`` command keeps its own options, ``python train.py …`` gets launch's."""
    if launch.world <= 1:
        return command
    found = torchrun_split(command)
    if found is None:
        return torchrun_command(launch, nproc_per_node=spec.knobs.ranks) + command[1:]
    options, _, program = found
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={spec.knobs.ranks}",
        "--max-restarts=0",
        "--monitor-interval=0.5",
        *options,
        *program,
    ]


def _script_env(cfg: Config, env: dict[str, str], trial: TrialFiles) -> dict[str, str]:
    """The script's environment: the trial's, ``script.env`` over it, the bootstrap first on PYTHONPATH, and where
    the hook finds the trial's spec and writes its measurement."""
    assert cfg.script is not None
    extra = {str(k): str(v) for k, v in cfg.script.env.items()}
    # the bootstrap first, then the script's own PYTHONPATH (script.env), then the launcher's
    path = os.pathsep.join(p for p in (str(BOOTSTRAP), extra.get("PYTHONPATH"), env.get("PYTHONPATH")) if p)
    return {
        **env,
        **extra,
        "PYTHONPATH": path,
        names.SCRIPT_SPEC: str(trial.spec_path),
        names.SCRIPT_MEASUREMENT: str(trial.out_path),
    }


def child_env() -> dict[str, str]:
    """The environment of a trial's processes: this tunekit and the caller's folder importable, unbuffered output,
    this process's pid, which every trial process watches (a trial dies with whoever launched it), and this
    sweep's token, which every descendant inherits (a resumed sweep ends what a killed one left)."""
    env = dict(os.environ)
    # The worker must import this tunekit and the user's own modules (relative to where they ran us).
    roots = [str(Path(tunekit.__file__).resolve().parent.parent), os.getcwd()]
    if env.get("PYTHONPATH"):
        roots.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(roots)
    env["PYTHONUNBUFFERED"] = "1"
    env[names.LAUNCHER_PID] = str(os.getpid())  # the worker (every rank) dies with the sweep
    env[names.SWEEP] = names.sweep_token()
    return env
