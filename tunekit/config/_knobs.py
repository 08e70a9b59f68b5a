"""The knobs of one trial: what each may be (``KNOB_HELP``), their checks and their parsing from ``--set``."""

from __future__ import annotations

from typing import Any

import yaml

from tunekit.config._schema import COMPILE_MODES, _kind, _show, cpu_count
from tunekit.contract import KNOB_NAMES
from tunekit.errors import UsageError

MAX_WORKERS_PER_CPU = 4
"""search.num_workers may go up to this many workers per usable CPU (and to MIN_WORKER_BOUND on any machine):
beyond it the workers only compete for the cores, or wait on storage that more workers do not make faster."""
MIN_WORKER_BOUND = 32


def max_workers(cpus: int | None = None) -> int:
    """The largest num_workers a config may list on a machine with ``cpus`` usable CPUs."""
    return max(MAX_WORKERS_PER_CPU * (cpus or cpu_count()), MIN_WORKER_BOUND)


# --- the knobs of one trial ----------------------------------------------------------------------------------

KNOB_HELP: dict[str, str] = {
    "num_workers": f"DataLoader worker processes (per rank): an integer from 0 up to {MAX_WORKERS_PER_CPU} per "
    f"usable CPU (and up to {MIN_WORKER_BOUND} on any machine)",
    "prefetch_factor": "batches prefetched per worker: an integer of at least 1 (with num_workers > 0)",
    "pin_memory": "pinned host memory with non_blocking copies: true or false",
    "batch_size": "micro-batch size: an integer of at least 1",
    "grad_accum": "micro-batches per optimizer step: an integer of at least 1",
    "compile": f"torch.compile mode: one of {', '.join(COMPILE_MODES)}",
    "ranks": "DDP ranks of the trial: 1, or every rank of the config's launch section",
    "threads": "intra-op threads of the training process: an integer of at least 1, or null for PyTorch's default",
    "worker_threads": "intra-op threads of each loader worker: an integer of at least 1, or null for one",
}
"""Every knob of one trial and what it may be: the one list ``tunekit trial --set``, ``tunekit sweep --set``,
``tunekit.trial(knobs=...)``, script placeholders and the README's knob paragraph are made from."""
assert tuple(KNOB_HELP) == KNOB_NAMES, "KNOB_HELP must describe exactly contract.Knobs' fields"

_NULLABLE = ("prefetch_factor", "threads", "worker_threads")
_AT_LEAST = {
    "num_workers": 0,
    "prefetch_factor": 1,
    "batch_size": 1,
    "grad_accum": 1,
    "ranks": 1,
    "threads": 1,
    "worker_threads": 1,
}


def _knob_problem(key: str, value: Any, bound: bool = True) -> str | None:
    """Why ``value`` is not allowed for knob ``key`` (None when it is); ``bound``: also this machine's worker
    bound."""
    if value is None and key in _NULLABLE:
        return None
    if key == "pin_memory":
        return None if isinstance(value, bool) else "expected true or false"
    if key == "compile":
        return None if value in COMPILE_MODES else f"choose one of: {', '.join(COMPILE_MODES)}"
    if not isinstance(value, int) or isinstance(value, bool):
        return f"expected an integer, got {_kind(value)} {_show(value)}"
    if value < _AT_LEAST[key]:
        return f"must be at least {_AT_LEAST[key]}"
    if key == "num_workers" and bound and value > max_workers():
        return (
            f"more than this machine allows ({max_workers()}: {MAX_WORKERS_PER_CPU} per usable CPU, "
            f"{cpu_count()} usable, and at least {MIN_WORKER_BOUND})"
        )
    return None


def check_knobs(knobs: dict[str, Any], where: str = "knobs", bound: bool = True) -> dict[str, Any]:
    """Knob values (typed, as Python or YAML gives them) checked as a config's search lists are: every problem at
    once, one line each naming ``where``, the knob and what is allowed.

    Raises:
        UsageError: an unknown knob or a value not allowed.
    """
    problems = []
    for key, value in knobs.items():
        if key not in KNOB_HELP:
            problems.append(f"{where}: {key} is not a knob; allowed: {', '.join(KNOB_HELP)}, or a dotted config key")
        elif (why := _knob_problem(key, value, bound)) is not None:
            problems.append(f"{where}: {key}={_show(value)}: {why}")
    if problems:
        raise UsageError("; ".join(problems))
    return dict(knobs)


def parse_knob(key: str, text: str) -> Any:
    """A ``--set`` knob value: read as YAML (``4``, ``true``, ``null``), then checked by :func:`check_knobs`."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    if key not in KNOB_HELP:
        check_knobs({key: value}, where="--set")
    if (why := _knob_problem(key, value)) is not None:
        raise UsageError(f"--set {key}={text}: {why}")
    return value
