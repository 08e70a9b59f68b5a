"""The checks across keys and sections once the config is typed: script or workload, the script's command, the
user-defined knobs of ``search.extra``, GPU decoding."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunekit.command import is_python, placeholders, torchrun_split
from tunekit.config._knobs import MAX_WORKERS_PER_CPU, MIN_WORKER_BOUND, max_workers
from tunekit.config._schema import Config, Script, Workload, _kind, _show, cpu_count
from tunekit.contract import KNOB_NAMES


def _cross_checks(cfg: Config, source: str, errors: list[str]) -> None:
    if (cfg.workload is None) == (cfg.script is None):
        errors.append(
            f"{source}: workload, script: give exactly one: workload (factories of the model and dataset) "
            "or script (your own training command)"
        )
        return
    if cfg.script is not None:
        _check_script(cfg, source, errors)
    else:
        _check_workload(cfg, source, errors)
    _check_common(cfg, source, errors)


def _launch_from_torchrun(cfg: Config, raw: dict[str, Any], source: str, errors: list[str]) -> None:
    """A script command that starts torchrun sets the ranks of the end-to-end trials (``launch.nproc_per_node``),
    as a ``launch`` section would."""
    found = torchrun_split(cfg.script.command) if cfg.script is not None else None
    if found is None or found[1] is None:
        return
    given = (raw.get("launch") or {}).get("nproc_per_node") if isinstance(raw.get("launch"), dict) else None
    if not found[1].isdigit() or int(found[1]) < 1:
        errors.append(
            f"{source}: script.command: --nproc-per-node {found[1]} is not allowed; give the number of "
            "ranks (one per GPU), e.g. --nproc-per-node 2"
        )
    elif given is not None and given != int(found[1]):
        errors.append(
            f"{source}: launch.nproc_per_node: {given} differs from the command's --nproc-per-node "
            f"{found[1]}; give it in one place"
        )
    else:
        cfg.launch.nproc_per_node = int(found[1])


def _check_unfilled(cfg: Config, source: str, errors: list[str]) -> None:
    """Searched knobs a script can take only through its command (neither set on its DataLoader nor by tunekit in
    its process) need a placeholder there."""
    script, search = cfg.script, cfg.search
    assert script is not None
    filled = placeholders(script.command)
    for key, values in (("grad_accum", search.grad_accum), ("compile", search.compile)):
        if len(values) > 1 and key not in filled:
            errors.append(
                f"{source}: search.{key}: the script sets it itself; searching it needs a {{{key}}} "
                "placeholder in script.command"
            )
    for key in ("worker_threads",):  # threads (the script's own process) tunekit sets itself at its start
        if getattr(search, key) and key not in filled:
            errors.append(f"{source}: search.{key}: searching it needs a {{{key}}} placeholder in script.command")
    for key in search.extra:
        if key not in filled:
            errors.append(
                f"{source}: search.extra.{key}: script mode sets a knob of your own through the command; "
                f"add {{{key}}} to script.command"
            )
    if search.target_effective_batch is not None and "grad_accum" not in filled:
        errors.append(f"{source}: search.target_effective_batch: needs a {{grad_accum}} placeholder in script.command")


def _check_script(cfg: Config, source: str, errors: list[str]) -> None:
    """script: a command, placeholders that name knobs, a loader choice; no workload-only search keys."""
    script, search = cfg.script, cfg.search
    assert script is not None
    if not script.command:
        errors.append(f"{source}: script.command: must give the command that runs the training script")
    knobs = set(KNOB_NAMES)
    for name in sorted(placeholders(script.command) - knobs - set(search.extra)):
        errors.append(
            f"{source}: script.command: {{{name}}} is not a knob; allowed: {', '.join(sorted(knobs))}, "
            "or a search.extra key"
        )
    for name in sorted(set(script.baseline) - placeholders(script.command)):
        errors.append(f"{source}: script.baseline.{name}: the command has no {{{name}}} placeholder")
    if script.own_batch and "batch_size" in placeholders(script.command):
        errors.append(
            f"{source}: script.own_batch: the command fills {{batch_size}}; keep the script's own batch "
            "(own_batch: true) or search it, not both"
        )
    loader = script.loader
    if loader != "auto" and not (isinstance(loader, int) and not isinstance(loader, bool) and loader >= 1):
        errors.append(
            f"{source}: script.loader: {_show(loader)} is not allowed; choose auto or N (an integer, the "
            "N-th DataLoader the script builds, from 1)"
        )
    _check_unfilled(cfg, source, errors)
    if cfg.launch.nnodes > 1:
        errors.append(f"{source}: launch.nnodes: script mode runs a trial's ranks on one node; set 1")
    elif (
        cfg.launch.world > 1
        and script.command
        and torchrun_split(script.command) is None
        and not is_python(script.command[0])
    ):
        errors.append(
            f"{source}: script.command: {_show(script.command[0])} is not a Python interpreter; with "
            "launch.nproc_per_node > 1 the command must be `python train.py …` (run under torchrun) or "
            "`torchrun … train.py …`"
        )


def _check_startable(script: Script, source: str) -> list[str]:
    """Whether ``script.command`` can start at all: its folder exists, its program is no placeholder and is found
    (on ``PATH``, ``script.env``'s if it sets one, else relative to ``script.cwd``) and may be executed."""
    cwd = Path(script.cwd or ".")
    if not cwd.is_dir():
        return [f"{source}: script.cwd: {_show(script.cwd)} is not a folder; give the folder the command runs in"]
    program = script.command[0]
    if placeholders([program]):
        return [
            f"{source}: script.command: the program {_show(program)} is a placeholder; the command must start "
            "with the program that runs (python, torchrun, a script), placeholders go in its arguments"
        ]
    if os.sep in program:
        path = cwd / program
        if not path.is_file():
            return [f"{source}: script.command: {_show(program)} does not exist (relative to {cwd})"]
        if not os.access(path, os.X_OK):
            return [
                f"{source}: script.command: {_show(program)} is not executable (no exec bit): chmod +x it, or "
                "start the command with its interpreter (python …)"
            ]
        return []
    search_path = str(script.env.get("PATH") or os.environ.get("PATH", os.defpath))
    if shutil.which(program, path=search_path) is None:
        names = sorted({n for d in search_path.split(os.pathsep) if os.path.isdir(d) for n in _listdir(d)})
        near = difflib.get_close_matches(program, names, n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        return [f"{source}: script.command: {_show(program)} is not found on PATH{hint}"]
    return []


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _check_workload(cfg: Config, source: str, errors: list[str]) -> None:
    search, wl = cfg.search, cfg.workload
    assert wl is not None
    beside = [k for k in ("collate_fn", "sampler", "worker_init_fn") if getattr(wl, k)]
    if wl.loader and beside:
        errors.append(
            f"{source}: workload.{beside[0]}: workload.loader builds the whole DataLoader; set "
            f"{', '.join(beside)} inside it, not beside it"
        )
    if wl.loader and search.worker_threads:
        errors.append(
            f"{source}: search.worker_threads: workload.loader builds the whole DataLoader, so tunekit "
            "cannot set its workers' threads; set them in its worker_init_fn, or search them without "
            "workload.loader"
        )
    if wl.step_updates and not wl.step:
        errors.append(f"{source}: workload.step_updates: true needs workload.step, the step that updates")
    _check_extra(cfg, source, errors)
    _check_gpu_decode(cfg, source, errors)


def _check_common(cfg: Config, source: str, errors: list[str]) -> None:
    search = cfg.search
    if cfg.trial.max_windows < cfg.trial.measure_windows:
        errors.append(
            f"{source}: trial.max_windows: {cfg.trial.max_windows} is below trial.measure_windows "
            f"({cfg.trial.measure_windows}); it must be at least that"
        )
    if cfg.fleet.grace_s <= cfg.fleet.heartbeat_s:
        errors.append(
            f"{source}: fleet.grace_s: {cfg.fleet.grace_s} is not more than fleet.heartbeat_s "
            f"({cfg.fleet.heartbeat_s}); a live node would be taken for a dead one"
        )
    launch = cfg.launch
    if launch.nnodes > 1 and not launch.rdzv_endpoint:
        errors.append(
            f"{source}: launch.rdzv_endpoint: launch.nnodes = {launch.nnodes} needs the host:port where "
            "the nodes meet (this node, which runs the sweep)"
        )
    if launch.world > 1 and cfg.device not in ("auto", "cuda", "cpu"):
        errors.append(
            f"{source}: device: {cfg.device} names one GPU, but launch runs {launch.nproc_per_node} ranks "
            "per node, one GPU each; choose one of: auto, cuda, cpu"
        )
    if launch.backend == "nccl" and cfg.device == "cpu":
        errors.append(
            f"{source}: launch.backend: nccl needs CUDA devices, but device is cpu; choose one of: auto, gloo"
        )
    bound = max_workers()
    too_many = [w for w in search.num_workers if w > bound]
    if too_many:
        errors.append(
            f"{source}: search.num_workers: {max(too_many)} is more than this machine allows ({bound}: "
            f"{MAX_WORKERS_PER_CPU} per usable CPU, {cpu_count()} usable, and at least "
            f"{MIN_WORKER_BOUND})"
        )
    if search.target_effective_batch is not None:
        if search.grad_accum != [1]:
            errors.append(
                f"{source}: search.grad_accum: set either search.grad_accum or search.target_effective_batch, not both"
            )
        elif not any(search.target_effective_batch % b == 0 for b in search.batch_size):
            errors.append(
                f"{source}: search.target_effective_batch: {search.target_effective_batch} is not a multiple "
                f"of any search.batch_size ({', '.join(map(str, search.batch_size))})"
            )


@dataclass(frozen=True)
class ExtraKnob:
    """One user-defined knob of ``search.extra``, validated."""

    key: str
    values: tuple[Any, ...]
    changes_result: bool
    baseline: Any
    """The config's own value at ``key``, else the first listed: what every other stage runs with."""


_EXTRA_KEY = re.compile(r"^workload\.([a-z_]+)(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def extra_knobs(cfg: Config) -> list[ExtraKnob]:
    """``search.extra`` as knobs, sorted by key (validated by :func:`from_dict`)."""
    raw = cfg.to_dict()
    return [
        ExtraKnob(key, tuple(spec["values"]), bool(spec["changes_result"]), _baseline(raw, key, spec["values"]))
        for key, spec in sorted(cfg.search.extra.items())
    ]


def _baseline(raw: dict[str, Any], key: str, values: list[Any]) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return values[0]
        node = node[part]
    return node


def _check_extra(cfg: Config, source: str, errors: list[str]) -> None:
    """search.extra: workload keys, each with a non-empty list of distinct scalar values and changes_result."""
    scalar = (str, int, float, bool, type(None))
    fields = {f.name: f for f in dataclasses.fields(Workload)}
    raw = cfg.to_dict()
    for key, spec in cfg.search.extra.items():
        where = f"{source}: search.extra.{key}"
        m = _EXTRA_KEY.match(key)
        top = m.group(1) if m else None
        if (
            m is None
            or top not in fields
            or top in ("model", "dataset", "loss", "optimizer")
            or (m.group(2) and not top.endswith("_args"))
            or (not m.group(2) and top.endswith("_args"))
        ):
            errors.append(
                f"{where}: not a knob key; use workload.<name>_args.<argument> (an argument of the model, "
                "dataset, loss or optimizer factory) or a workload setting such as workload.precision"
            )
            continue
        if not isinstance(spec, dict) or set(spec) != {"values", "changes_result"}:
            errors.append(
                f"{where}: expected a mapping with values (a list) and changes_result (true or false), "
                f"got {_show(spec) if not isinstance(spec, dict) else sorted(spec)}"
            )
            continue
        values, changes = spec["values"], spec["changes_result"]
        if not isinstance(values, list) or not values or not all(isinstance(v, scalar) for v in values):
            errors.append(f"{where}.values: expected a non-empty list of strings, numbers, booleans or null")
        elif len({json.dumps(v) for v in values}) != len(values):
            errors.append(f"{where}.values: lists a value twice")
        elif (base := _baseline(raw, key, values)) not in values:
            errors.append(f"{where}.values: the config's own value {key} = {_show(base)} must be one of them")
        if not isinstance(changes, bool):
            errors.append(f"{where}.changes_result: expected true or false, got {_kind(changes)} {_show(changes)}")


def _check_gpu_decode(cfg: Config, source: str, errors: list[str]) -> None:
    """The built-in image pipelines decode on the GPU with ``decode: gpu`` or ``gpu-overlap``: not on a CPU
    device."""
    if cfg.device != "cpu" or not cfg.workload.dataset.startswith("tunekit.workloads.images:"):
        return
    key = "workload.dataset_args.decode"
    listed = [v for v in (cfg.search.extra.get(key) or {}).get("values") or [] if str(v).startswith("gpu")]
    own = str(cfg.workload.dataset_args.get("decode", "cpu"))
    if own.startswith("gpu") or listed:
        where, value = (f"search.extra.{key}", listed[0]) if listed else ("workload.dataset_args.decode", own)
        errors.append(
            f"{source}: {where}: {value} decodes on the CUDA device, but device is cpu; choose cpu, or run "
            "on a GPU (device: auto or cuda)"
        )
