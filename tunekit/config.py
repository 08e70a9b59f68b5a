"""Strict loading of a sweep config (YAML) into typed, keyword-only dataclasses.

Every problem in a file is collected and reported at once, one line each, naming the file, the key path and what
is allowed. Nothing here imports torch: the driver loads configs, and import paths are checked in a subprocess.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from tunekit.command import is_python, placeholders, split_command, torchrun_split
from tunekit.contract import KNOB_NAMES
from tunekit.contract import process as names
from tunekit.errors import ConfigError, UsageError

__all__ = [
    "Config",
    "Workload",
    "Script",
    "Search",
    "TrialSettings",
    "Selection",
    "Budget",
    "Cost",
    "Launch",
    "COMPILE_MODES",
    "load",
    "read_yaml",
    "from_dict",
    "auto_workers",
    "ExtraKnob",
    "extra_knobs",
    "cpu_count",
    "set_dotted",
    "max_workers",
    "KNOB_HELP",
    "TOP_LEVEL_KEYS",
    "check_knobs",
    "parse_knob",
]

Precision = Literal["fp32", "bf16", "fp16"]
CompileMode = Literal["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES: tuple[str, ...] = typing.get_args(CompileMode)
_IMPORT_PATH = re.compile(r"^([A-Za-z_][\w.]*|[^:]+\.py):[A-Za-z_][\w.]*$")
_UNIT = re.compile(r"^[A-Za-z][\w-]*$")
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_NAME = re.compile(r"^(?!\.\.?$)[A-Za-z0-9._-]+$")


def _meta(**kw: Any) -> dict[str, Any]:
    return {"check": kw}


@dataclass(kw_only=True)
class Workload:
    """What a trial trains. Every callable is a ``module:attr`` import path."""

    model: str = field(metadata=_meta(import_path=True))
    """Callable returning an ``nn.Module``, e.g. ``torchvision.models:resnet50``."""
    model_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``model``."""
    dataset: str = field(metadata=_meta(import_path=True))
    """Callable returning a map-style Dataset of ``(input, target)`` samples."""
    dataset_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``dataset``."""
    loss: str | None = field(default="torch.nn:CrossEntropyLoss", metadata=_meta(import_path=True))
    """Callable returning the loss module; null means the model's output is the loss."""
    loss_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``loss``."""
    optimizer: str = field(default="torch.optim:SGD", metadata=_meta(import_path=True))
    """Optimizer class, called as ``optimizer(model.parameters(), **optimizer_args)``."""
    optimizer_args: dict[str, Any] = field(default_factory=lambda: {"lr": 0.01})
    """Keyword arguments for ``optimizer``."""
    precision: Precision = "fp32"
    """Autocast precision: fp32 (none), bf16, or fp16 (with a gradient scaler)."""
    channels_last: bool = False
    """Use channels-last memory format for the model and for 4-D inputs."""
    step: str | None = field(default=None, metadata=_meta(import_path=True))
    """Optional custom ``step(model, batch, ctx) -> loss``; the batch arrives already on the device."""
    step_updates: bool = False
    """The custom step runs backward and the optimizer step itself (``ctx.optimizer``, ``ctx.scaler``,
    ``ctx.micro_step``, ``ctx.grad_accum``: clipping, schedulers, several optimizers) and returns the detached loss."""
    collate_fn: str | None = field(default=None, metadata=_meta(import_path=True))
    """The DataLoader's ``collate_fn`` (e.g. one that pads variable-length samples)."""
    sampler: str | None = field(default=None, metadata=_meta(import_path=True))
    """A factory ``sampler(dataset)`` returning the DataLoader's sampler (default: an endless random sampler)."""
    worker_init_fn: str | None = field(default=None, metadata=_meta(import_path=True))
    """The DataLoader's ``worker_init_fn``."""
    loader: str | None = field(default=None, metadata=_meta(import_path=True))
    """Your own DataLoader factory, called as ``loader(dataset, **knobs)`` with batch_size, num_workers,
    pin_memory and, with workers, prefetch_factor and persistent_workers; it must pass them on (a DataLoader that
    does not is a trial error)."""
    count: str | None = field(default=None, metadata=_meta(import_path=True))
    """``count(batch) -> int``: the items a batch holds in ``unit`` (e.g. non-padding tokens); default: the batch's
    samples."""
    unit: str = field(default="samples", metadata=_meta(pattern=_UNIT, allowed="a word such as samples, tokens"))
    """What throughput counts: every figure is in ``unit``/s."""


@dataclass(kw_only=True)
class Script:
    """Your own training script, run unedited in every trial (script mode, instead of ``workload``)."""

    command: list[str]
    """The command, as a string (split as a shell would, never run through one) or a list. ``{knob}``
    placeholders (``{num_workers}``, ``{batch_size}``, any knob, or a ``search.extra`` key by its dotted name) are
    filled per trial; knobs without one are set on the training DataLoader itself."""
    cwd: str | None = None
    """Where the command runs (default: the config file's folder)."""
    env: dict[str, Any] = field(default_factory=dict)
    """Extra environment variables for the command."""
    loader: Any = "auto"
    """The training DataLoader: ``auto`` (the first one iterated with autograd enabled: evaluation runs under
    no_grad) or N (the N-th DataLoader the script builds, from 1)."""
    count: str | None = field(default=None, metadata=_meta(import_path=True))
    """``count(batch) -> int``: the items a batch holds in ``unit``; default: the loader's batch size."""
    unit: str = field(default="samples", metadata=_meta(pattern=_UNIT, allowed="a word such as samples, tokens"))
    """What throughput counts: every figure is in ``unit``/s."""
    baseline: dict[str, Any] = field(default_factory=dict)
    """Placeholder values of the script's own baseline trial; a placeholder not given here is left out with its
    flag, so the script's own default applies."""
    trial_args: list[str] = field(default_factory=list, metadata=_meta(empty_ok=True))
    """Arguments added after the command in trials only (``[--epochs, 1000]``, so the loop outlasts a trial); the
    recommended command leaves them out."""
    epoch_items: int | None = field(default=None, metadata=_meta(min=1))
    """Items (in ``unit``) of the script's real epoch, when trials run a shorter one (a subset of the data): the
    report also gives each figure over epochs of this length, the boundary between them as measured."""
    own_batch: bool = False
    """Keep the script's own batch size: the sweep tries the batch its baseline trial's loader had (in place of
    ``search.batch_size``), and the command needs no ``{batch_size}``."""


@dataclass(kw_only=True)
class Search:
    """The knobs a sweep varies. Lists are deduplicated; numeric lists are sorted."""

    num_workers: list[int] = field(default_factory=lambda: [0, 2, 4], metadata=_meta(min=0))
    """DataLoader worker counts (per rank under launch), or ``auto`` for 0 ... 2x the usable CPUs (per rank)."""
    prefetch_factor: list[int] = field(default_factory=lambda: [2], metadata=_meta(min=1))
    """Batches prefetched per worker (only with num_workers > 0)."""
    pin_memory: list[bool] = field(default_factory=lambda: [False, True])
    """Pinned host memory, always paired with ``non_blocking`` copies."""
    batch_size: list[int] = field(default_factory=lambda: [32], metadata=_meta(min=1))
    """Micro-batch sizes."""
    grad_accum: list[int] = field(default_factory=lambda: [1], metadata=_meta(min=1))
    """Gradient accumulation steps per optimizer step."""
    target_effective_batch: int | None = field(default=None, metadata=_meta(min=1))
    """Effective batch to reach with micro-batch x accumulation steps; null to skip that stage."""
    compile: list[CompileMode] = field(default_factory=lambda: ["none"])
    """torch.compile modes; ``none`` runs eagerly."""
    threads: list[int] | None = field(default=None, metadata=_meta(min=1))
    """Intra-op thread counts of the training process (``torch.set_num_threads``) to try at the knee besides
    PyTorch's default (one per core), which competes with the loader workers for the cores; null tries none."""
    worker_threads: list[int] | None = field(default=None, metadata=_meta(min=1))
    """Intra-op thread counts of each loader worker to try at the knee besides PyTorch's one (workers whose
    transforms run torch ops can use more); null tries none. Not with ``workload.loader``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Knobs of your own: a ``workload.`` key (dotted, e.g. ``workload.dataset_args.crop``) to
    ``{values: [...], changes_result: true|false}``. The config's own value at that key (else the first listed) is
    the baseline; ``changes_result`` says whether a value may change what training learns (a resolution does, a
    decode device does not): such values are measured and reported, never chosen."""


@dataclass(kw_only=True)
class TrialSettings:
    """How long and how carefully each trial measures."""

    warmup_steps: int = field(default=5, metadata=_meta(min=0))
    """Steps trained before timing, after the batches prepared during start-up are set aside."""
    measure_windows: int = field(default=3, metadata=_meta(min=2))
    """Timed windows (the fewest, with ``precision``); the throughput is their median and the noise their spread."""
    window_s: float = field(default=3.0, metadata=_meta(gt=0))
    """Length of one timed window in seconds."""
    precision: float | None = field(default=0.03, metadata=_meta(gt=0, lt=1))
    """Measure until the 95 % confidence interval of the mean window throughput is within this share of it, between
    measure_windows and max_windows windows, leading windows that are still settling left out (the default matches
    the default selection tolerance); null: exactly measure_windows windows."""
    max_windows: int = field(default=8, metadata=_meta(min=2))
    """Most windows a trial measures when ``precision`` is set."""
    timeout_s: float = field(default=300.0, metadata=_meta(gt=0))
    """Wall-clock limit for one trial, start-up and warm-up included."""
    fork_server: bool = True
    """Start single-process trials from a server that has imported torch and the workload's modules once, or a
    script's imports (``python SCRIPT`` or ``python -m MODULE`` run by tunekit's own interpreter: each trial runs the
    program as that interpreter would); each trial still runs in a process and session of its own and initialises
    CUDA itself; false: a fresh interpreter per trial."""
    remeasure_disturbed: bool = True
    """A resumed sweep measures again the trials whose own figures were disturbed (other processes kept the CPUs
    busy during their windows, or their windows scattered over 10 %: ``rules.disturbed``) instead of re-reading
    them; false keeps every finished trial as it was measured."""


@dataclass(kw_only=True)
class Selection:
    """How the knee is chosen."""

    tolerance: float = field(default=0.03, metadata=_meta(min=0, lt=1))
    """Relative throughput loss accepted for a cheaper config (raised to the measured noise)."""
    min_headroom: float = field(default=0.10, metadata=_meta(min=0, lt=1))
    """Smallest share of device memory that must stay free at the peak."""
    repeats: int = field(default=1, metadata=_meta(min=0, lt=10))
    """Further runs of each config a decision rests on (the knee, the best, the script's own settings), in
    alternation at the sweep's end: their spread is the run-to-run noise, which widens the band and every gain's
    interval. 0: none (the band and intervals then rest on each trial's windows alone)."""


@dataclass(kw_only=True)
class Budget:
    """When a sweep stops starting trials."""

    minutes: float = field(default=15.0, metadata=_meta(gt=0))
    """Wall-clock budget for the whole sweep."""
    max_trials: int = field(default=60, metadata=_meta(min=1))
    """Most trials a sweep runs."""


@dataclass(kw_only=True)
class Cost:
    """What the machine costs, to report items per unit of money beside the throughput."""

    per_hour: float | None = field(default=None, metadata=_meta(gt=0))
    """Price of the machine per hour (any currency); null to leave cost out."""


_ENDPOINT = re.compile(r"^[A-Za-z0-9._-]+:\d{1,5}$")


@dataclass(kw_only=True)
class Launch:
    """How an end-to-end trial is launched: one process, or one DDP rank per GPU under torchrun."""

    nproc_per_node: int = field(default=1, metadata=_meta(min=1))
    """Ranks (one per GPU) on each node; above 1, end-to-end trials run under ``torch.distributed.run`` with
    DistributedDataParallel, and num_workers and prefetch_factor are per rank."""
    nnodes: int = field(default=1, metadata=_meta(min=1))
    """Nodes; above 1, this node runs the sweep and every other node runs ``tunekit node CONFIG --node-rank K``
    (docs/distributed.md)."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Process-group backend: auto is nccl on CUDA devices and gloo on the CPU."""
    rdzv_endpoint: str | None = field(default=None, metadata=_meta(pattern=_ENDPOINT, allowed="host:port"))
    """``host:port`` of the node running the sweep, where every node's ranks meet; needed when nnodes > 1."""
    join_timeout_s: float = field(default=60.0, metadata=_meta(gt=0))
    """With nnodes > 1: how long a trial (and the sweep's final release) waits at the rendezvous for the other
    nodes' ``tunekit node`` before it fails, naming how many joined."""

    @property
    def world(self) -> int:
        """Ranks of a multi-GPU trial, all nodes together (1: trials run as single processes)."""
        return self.nproc_per_node * self.nnodes


@dataclass(kw_only=True)
class Config:
    """A whole sweep config, as loaded from YAML."""

    name: str = field(metadata=_meta(pattern=_NAME, allowed="a plain folder name (letters, digits, '.', '_', '-'; "
                                                         "no '/', not '..'); choose another place with --out"))
    """Run name; the default output folder is results/<name>."""
    device: str = field(default="auto", metadata=_meta(pattern=_DEVICE, allowed="auto, cpu, cuda, cuda:N"))
    """auto (cuda when available), cpu, cuda or cuda:N."""
    workload: Workload | None = None
    """What to train, as factories (or ``script``)."""
    script: Script | None = None
    """What to train, as your own training script (or ``workload``)."""
    search: Search = field(default_factory=Search)
    """The knobs to sweep."""
    trial: TrialSettings = field(default_factory=TrialSettings)
    """Per-trial measurement settings."""
    selection: Selection = field(default_factory=Selection)
    """Knee selection settings."""
    budget: Budget = field(default_factory=Budget)
    """Sweep budget."""
    cost: Cost = field(default_factory=Cost)
    """Machine price, for items per unit of money."""
    launch: Launch = field(default_factory=Launch)
    """Single process, or DDP ranks per node (multi-GPU trials)."""
    strategy: Literal["staged", "grid"] = "staged"
    """staged (ceilings, then end to end, then refinements) or grid (every combination)."""
    source: str = field(default="<dict>", metadata={"internal": True})
    """The file this config came from (not a YAML key)."""

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data (what config.resolved.yaml holds)."""
        data = dataclasses.asdict(self)
        data.pop("source")
        for key in ("workload", "script"):
            if data[key] is None:
                data.pop(key)
        return data

    @property
    def unit(self) -> str:
        """What throughput counts (``workload.unit`` or ``script.unit``)."""
        return self.script.unit if self.script is not None else self.workload.unit  # type: ignore[union-attr]

    @property
    def count(self) -> str | None:
        """The function that counts a batch's items (``workload.count`` or ``script.count``); None: the batch size."""
        return self.script.count if self.script is not None else self.workload.count  # type: ignore[union-attr]


TOP_LEVEL_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config)
                                       if not f.metadata.get("internal") and not dataclasses.is_dataclass(f.type)
                                       and f.name not in ("workload", "script", "search", "trial", "selection",
                                                          "budget", "cost", "launch"))
"""The config's keys that hold a value rather than a section (``--set strategy=grid``)."""


def cpu_count() -> int:
    """CPUs this process may run on (affinity and container limits respected)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def auto_workers(cpus: int | None = None) -> list[int]:
    """Worker counts from 0 to 2x the CPU count, denser at the low end where the knee usually is."""
    top = 2 * (cpus or cpu_count())
    values = {0, 1, 2, top, top // 2}
    p = 2
    while p <= top:
        values.update({p, p * 3 // 2})
        p *= 2
    return sorted(v for v in values if v <= top)


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set ``value`` at a dotted key path (``trial.window_s``) of unvalidated config data, making mappings on the way.

    Raises:
        ConfigError: a part of the path is not a mapping.
    """
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError([f"{key}: {part} is not a mapping in the config"])
    node[last] = value


Resolver = Callable[["Config", dict[str, str]], "dict[str, str | None] | str"]
"""Checks import paths for a config (its ``to_dict()``): each path's problem or None, or why the check failed."""


def load(path: str | os.PathLike[str] | dict[str, Any], *, check_imports: bool = True,
         overrides: dict[str, Any] | None = None, resolve: Resolver | None = None) -> Config:
    """Load and validate a config file (or already-parsed config data), with dotted-key overrides applied first.

    Args:
        path: the YAML file, or a mapping of config keys.
        check_imports: also resolve every import path (in a subprocess, so this process never imports torch).
        overrides: ``{"trial.window_s": 10, ...}``, applied before validation.
        resolve: runs the import-path check (a factory config's; ``launch.resolve_paths`` runs it through the
            sweep's fork server); default: a subprocess of its own.

    Raises:
        ConfigError: listing every problem found, one line each.
    """
    if isinstance(path, dict):
        raw: Any = json.loads(json.dumps(path, default=_import_path))  # a copy; callables become import paths
        source, name = "<config>", "run"
    else:
        raw, source, name = read_yaml(path), str(path), Path(path).stem
    if overrides:
        if not isinstance(raw, dict):
            raise ConfigError([f"{source}: the top level must be a mapping of keys, got {_kind(raw)}"])
        for key, value in overrides.items():
            set_dotted(raw, key, json.loads(json.dumps(value, default=_import_path)))
    return from_dict(raw, source=source, check_imports=check_imports, default_name=name, resolve=resolve)


def _import_path(obj: Any) -> str:
    """A callable given in place of an import path (Python API): ``module:qualname``, or ``file.py:qualname`` for
    one defined in the script being run, which the trial process loads by path (its ``__main__`` block does not
    run there)."""
    if not callable(obj):
        raise ConfigError([f"<config>: {obj!r} is neither plain data nor a callable"])
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or "<locals>" in name or "<lambda>" in name:
        raise ConfigError([f"<config>: {name or obj!r} is not importable: define it at the top level of a module "
                           "or of your script"])
    if module == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if not main_file:
            raise ConfigError([f"<config>: {name} lives in an interactive session; define it in a file"])
        return f"{os.path.abspath(main_file)}:{name}"
    return f"{module}:{name}"


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The parsed YAML of a config file, unvalidated.

    Raises:
        ConfigError: the file cannot be read or is not valid YAML (one line, with the position).
    """
    label = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError([f"{label}: cannot read config: {exc.strerror or exc}"]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{label}: {where}invalid YAML: {problem}"]) from None


def from_dict(
    raw: Any, *, source: str = "<dict>", check_imports: bool = False, default_name: str = "run",
    resolve: Resolver | None = None,
) -> Config:
    """Validate already-parsed data (see :func:`load`)."""
    errors: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}: the top level must be a mapping of keys, got {_kind(raw)}"])
    raw = dict(raw)
    raw.setdefault("name", default_name)
    cfg = _load_dataclass(Config, raw, "", source, errors)
    if cfg is not None:
        cfg.source = source
        _launch_from_torchrun(cfg, raw, source, errors)
        search = raw.get("search")
        if isinstance(search, dict) and search.get("num_workers") == "auto" and cfg.launch.nproc_per_node > 1:
            # per rank: the ranks of a node share its CPUs
            cfg.search.num_workers = auto_workers(max(1, cpu_count() // cfg.launch.nproc_per_node))
        _cross_checks(cfg, source, errors)
        if cfg.script is not None:  # the command runs where the config lives, unless it says otherwise
            base = Path(source).parent if source not in ("<dict>", "<config>") else Path.cwd()
            cfg.script.cwd = str((base / (cfg.script.cwd or ".")).resolve())
        if check_imports:  # every problem in one pass, the import paths' and the command's too
            errors.extend(_check_import_paths(cfg, source, resolve))
            if cfg.script is not None and cfg.script.command:
                errors.extend(_check_startable(cfg.script, source))
    if errors:
        raise ConfigError(errors)
    assert cfg is not None
    return cfg


# --- validation engine -------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _load_dataclass(cls: type, raw: Any, path: str, source: str, errors: list[str]) -> Any:
    where = path or "top level"
    if not isinstance(raw, dict):
        errors.append(f"{source}: {where}: expected a mapping, got {_kind(raw)}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    for key in raw:
        if key not in fields:
            hint = difflib.get_close_matches(str(key), fields, n=1)
            maybe = f" (did you mean '{hint[0]}'?)" if hint else ""
            errors.append(
                f"{source}: {_join(path, key)}: unknown key{maybe}; allowed keys: {', '.join(fields)}"
            )
    values: dict[str, Any] = {}
    ok = True
    for name, f in fields.items():
        key_path = _join(path, name)
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                errors.append(f"{source}: {key_path}: required key is missing")
                ok = False
            continue
        value = raw[name]
        if cls is Script and name == "command" and isinstance(value, str):
            try:
                value = split_command(value)
            except ValueError as exc:  # an unclosed quote
                errors.append(f"{source}: {key_path}: cannot split {_show(value)} into arguments: {exc}")
                ok = False
                continue
        if cls is Search and name == "num_workers" and value == "auto":
            values[name] = auto_workers()
            continue
        before = len(errors)
        values[name] = _coerce(value, hints[name], key_path, f.metadata.get("check", {}), source, errors)
        ok = ok and len(errors) == before
    return cls(**values) if ok else None


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _coerce(value: Any, tp: Any, path: str, check: dict[str, Any], source: str, errors: list[str]) -> Any:
    if tp is Any:  # checked by the section's own cross-checks (script.loader: auto or N)
        return value
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _load_dataclass(tp, value, path, source, errors)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path, check, source, errors)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = value if isinstance(value, list) else [value]
        if not items and not check.get("empty_ok"):
            errors.append(f"{source}: {path}: must list at least one value")
            return []
        before = len(errors)
        out = [_coerce(v, item_tp, f"{path}[{i}]", check, source, errors) for i, v in enumerate(items)]
        if len(errors) > before:
            return out
        out = list(dict.fromkeys(out))
        return sorted(out) if item_tp in (int, float) else out
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            errors.append(f"{source}: {path}: expected a mapping of keyword arguments, got {_kind(value)}")
        return dict(value) if isinstance(value, dict) else {}
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            errors.append(f"{source}: {path}: {_show(value)} is not allowed; choose one of: {', '.join(allowed)}")
        return value
    return _scalar(value, tp, path, check, source, errors)


def _scalar(value: Any, tp: Any, path: str, check: dict[str, Any], source: str, errors: list[str]) -> Any:
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[tp]
    good = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not good:
        errors.append(f"{source}: {path}: expected {expected}, got {_kind(value)} {_show(value)}")
        return value
    if tp is float:
        value = float(value)
    bounds = [
        ("min", lambda v, b: v >= b, "at least"),
        ("gt", lambda v, b: v > b, "greater than"),
        ("lt", lambda v, b: v < b, "less than"),
    ]
    for key, ok, words in bounds:
        if key in check and not ok(value, check[key]):
            errors.append(f"{source}: {path}: {_show(value)} is out of range; must be {words} {check[key]}")
    if check.get("import_path") and not _IMPORT_PATH.match(value):
        errors.append(
            f"{source}: {path}: {_show(value)} is not an import path; write it as 'module:attr' (e.g. "
            "'torchvision.models:resnet50') or 'path/to/file.py:attr'"
        )
    if "pattern" in check and not check["pattern"].match(value):
        errors.append(f"{source}: {path}: {_show(value)} is not allowed; choose one of: {check['allowed']}")
    return value


MAX_WORKERS_PER_CPU = 4
"""search.num_workers may go up to this many workers per usable CPU (and to MIN_WORKER_BOUND on any machine):
beyond it the workers only compete for the cores, or wait on storage that more workers do not make faster."""
MIN_WORKER_BOUND = 32


def max_workers(cpus: int | None = None) -> int:
    """The largest num_workers a config may list on a machine with ``cpus`` usable CPUs."""
    return max(MAX_WORKERS_PER_CPU * (cpus or cpu_count()), MIN_WORKER_BOUND)


def _cross_checks(cfg: Config, source: str, errors: list[str]) -> None:
    if (cfg.workload is None) == (cfg.script is None):
        errors.append(f"{source}: workload, script: give exactly one: workload (factories of the model and dataset) "
                      "or script (your own training command)")
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
        errors.append(f"{source}: script.command: --nproc-per-node {found[1]} is not allowed; give the number of "
                      "ranks (one per GPU), e.g. --nproc-per-node 2")
    elif given is not None and given != int(found[1]):
        errors.append(f"{source}: launch.nproc_per_node: {given} differs from the command's --nproc-per-node "
                      f"{found[1]}; give it in one place")
    else:
        cfg.launch.nproc_per_node = int(found[1])


def _check_script(cfg: Config, source: str, errors: list[str]) -> None:
    """script: a command, placeholders that name knobs, a loader choice; no workload-only search keys."""
    script, search = cfg.script, cfg.search
    assert script is not None
    if not script.command:
        errors.append(f"{source}: script.command: must give the command that runs the training script")
    knobs = set(KNOB_NAMES)
    for name in sorted(placeholders(script.command) - knobs - set(search.extra)):
        errors.append(f"{source}: script.command: {{{name}}} is not a knob; allowed: {', '.join(sorted(knobs))}, "
                      "or a search.extra key")
    for name in sorted(set(script.baseline) - placeholders(script.command)):
        errors.append(f"{source}: script.baseline.{name}: the command has no {{{name}}} placeholder")
    if script.own_batch and "batch_size" in placeholders(script.command):
        errors.append(f"{source}: script.own_batch: the command fills {{batch_size}}; keep the script's own batch "
                      "(own_batch: true) or search it, not both")
    loader = script.loader
    if loader != "auto" and not (isinstance(loader, int) and not isinstance(loader, bool) and loader >= 1):
        errors.append(f"{source}: script.loader: {_show(loader)} is not allowed; choose auto or N (an integer, the "
                      "N-th DataLoader the script builds, from 1)")
    # what can be neither filled into the command nor set on the DataLoader
    filled = placeholders(script.command)
    for key, values in (("grad_accum", search.grad_accum), ("compile", search.compile)):
        if len(values) > 1 and key not in filled:
            errors.append(f"{source}: search.{key}: the script sets it itself; searching it needs a {{{key}}} "
                          "placeholder in script.command")
    for key in ("worker_threads",):  # threads (the script's own process) tunekit sets itself at its start
        if getattr(search, key) and key not in filled:
            errors.append(f"{source}: search.{key}: searching it needs a {{{key}}} placeholder in script.command")
    for key in search.extra:
        if key not in filled:
            errors.append(f"{source}: search.extra.{key}: script mode sets a knob of your own through the command; "
                          f"add {{{key}}} to script.command")
    if search.target_effective_batch is not None and "grad_accum" not in filled:
        errors.append(f"{source}: search.target_effective_batch: needs a {{grad_accum}} placeholder in "
                      "script.command")
    if cfg.launch.nnodes > 1:
        errors.append(f"{source}: launch.nnodes: script mode runs a trial's ranks on one node; set 1")
    elif cfg.launch.world > 1 and script.command and torchrun_split(script.command) is None \
            and not is_python(script.command[0]):
        errors.append(f"{source}: script.command: {_show(script.command[0])} is not a Python interpreter; with "
                      "launch.nproc_per_node > 1 the command must be `python train.py …` (run under torchrun) or "
                      "`torchrun … train.py …`")


def _check_startable(script: Script, source: str) -> list[str]:
    """Whether ``script.command`` can start at all: its folder exists, its program is no placeholder and is found
    (on ``PATH``, ``script.env``'s if it sets one, else relative to ``script.cwd``) and may be executed."""
    cwd = Path(script.cwd or ".")
    if not cwd.is_dir():
        return [f"{source}: script.cwd: {_show(script.cwd)} is not a folder; give the folder the command runs in"]
    program = script.command[0]
    if placeholders([program]):
        return [f"{source}: script.command: the program {_show(program)} is a placeholder; the command must start "
                "with the program that runs (python, torchrun, a script), placeholders go in its arguments"]
    if os.sep in program:
        path = cwd / program
        if not path.is_file():
            return [f"{source}: script.command: {_show(program)} does not exist (relative to {cwd})"]
        if not os.access(path, os.X_OK):
            return [f"{source}: script.command: {_show(program)} is not executable (no exec bit): chmod +x it, or "
                    "start the command with its interpreter (python …)"]
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
        errors.append(f"{source}: workload.{beside[0]}: workload.loader builds the whole DataLoader; set "
                      f"{', '.join(beside)} inside it, not beside it")
    if wl.loader and search.worker_threads:
        errors.append(f"{source}: search.worker_threads: workload.loader builds the whole DataLoader, so tunekit "
                      "cannot set its workers' threads; set them in its worker_init_fn, or search them without "
                      "workload.loader")
    if wl.step_updates and not wl.step:
        errors.append(f"{source}: workload.step_updates: true needs workload.step, the step that updates")
    _check_extra(cfg, source, errors)
    _check_gpu_decode(cfg, source, errors)


def _check_common(cfg: Config, source: str, errors: list[str]) -> None:
    search = cfg.search
    if cfg.trial.max_windows < cfg.trial.measure_windows:
        errors.append(f"{source}: trial.max_windows: {cfg.trial.max_windows} is below trial.measure_windows "
                      f"({cfg.trial.measure_windows}); it must be at least that")
    launch = cfg.launch
    if launch.nnodes > 1 and not launch.rdzv_endpoint:
        errors.append(f"{source}: launch.rdzv_endpoint: launch.nnodes = {launch.nnodes} needs the host:port where "
                      "the nodes meet (this node, which runs the sweep)")
    if launch.world > 1 and cfg.device not in ("auto", "cuda", "cpu"):
        errors.append(f"{source}: device: {cfg.device} names one GPU, but launch runs {launch.nproc_per_node} ranks "
                      "per node, one GPU each; choose one of: auto, cuda, cpu")
    if launch.backend == "nccl" and cfg.device == "cpu":
        errors.append(f"{source}: launch.backend: nccl needs CUDA devices, but device is cpu; choose one of: auto, "
                      "gloo")
    bound = max_workers()
    too_many = [w for w in search.num_workers if w > bound]
    if too_many:
        errors.append(f"{source}: search.num_workers: {max(too_many)} is more than this machine allows ({bound}: "
                      f"{MAX_WORKERS_PER_CPU} per usable CPU, {cpu_count()} usable, and at least "
                      f"{MIN_WORKER_BOUND})")
    if search.target_effective_batch is not None:
        if search.grad_accum != [1]:
            errors.append(
                f"{source}: search.grad_accum: set either search.grad_accum or search.target_effective_batch, "
                "not both"
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
    return [ExtraKnob(key, tuple(spec["values"]), bool(spec["changes_result"]), _baseline(raw, key, spec["values"]))
            for key, spec in sorted(cfg.search.extra.items())]


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
        if m is None or top not in fields or top in ("model", "dataset", "loss", "optimizer") or (
                m.group(2) and not top.endswith("_args")) or (not m.group(2) and top.endswith("_args")):
            errors.append(f"{where}: not a knob key; use workload.<name>_args.<argument> (an argument of the model, "
                          "dataset, loss or optimizer factory) or a workload setting such as workload.precision")
            continue
        if not isinstance(spec, dict) or set(spec) != {"values", "changes_result"}:
            errors.append(f"{where}: expected a mapping with values (a list) and changes_result (true or false), "
                          f"got {_show(spec) if not isinstance(spec, dict) else sorted(spec)}")
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
        errors.append(f"{source}: {where}: {value} decodes on the CUDA device, but device is cpu; choose cpu, or run "
                      "on a GPU (device: auto or cuda)")


IMPORT_PATH_KEYS = tuple(f.name for f in dataclasses.fields(Workload) if f.metadata.get("check", {}).get("import_path"))
"""The workload keys that name a ``module:attr`` import path."""


def _check_import_paths(cfg: Config, source: str, resolve: Resolver | None = None) -> list[str]:
    if cfg.script is not None:
        paths = {"script.count": cfg.script.count} if cfg.script.count else {}
    elif cfg.workload is None:
        return []
    else:
        paths = {f"workload.{key}": getattr(cfg.workload, key) for key in IMPORT_PATH_KEYS
                 if getattr(cfg.workload, key) is not None}
    if not paths:
        return []
    if resolve is not None and cfg.script is None:
        found = resolve(cfg, paths)
        if isinstance(found, str):
            return [f"{source}: workload: could not check import paths: {found}"]
        return [f"{source}: {key}: {_show(paths[key])} {msg}" for key, msg in found.items() if msg]
    cmd = [sys.executable, "-m", names.WORKER_MODULE, names.RESOLVE, json.dumps(paths)]  # imports torch: not here
    # a script's count resolves where the script runs (its folder is on its path), a factory's where tunekit does
    cwd = cfg.script.cwd if cfg.script is not None else None
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return [f"{source}: workload: could not check import paths: {tail}"]
    problems = json.loads(proc.stdout.strip().splitlines()[-1])
    return [f"{source}: {key}: {_show(paths[key])} {msg}" for key, msg in problems.items() if msg]


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
_AT_LEAST = {"num_workers": 0, "prefetch_factor": 1, "batch_size": 1, "grad_accum": 1, "ranks": 1, "threads": 1,
             "worker_threads": 1}


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
        return (f"more than this machine allows ({max_workers()}: {MAX_WORKERS_PER_CPU} per usable CPU, "
                f"{cpu_count()} usable, and at least {MIN_WORKER_BOUND})")
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
