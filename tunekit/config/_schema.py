"""The config's schema: keyword-only dataclasses, one per section, each field with its type, default and checks
(``_meta``), and how a value is named in an error line."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from tunekit.config._cpus import cpu_count
from tunekit.contract import Strategy

Precision = Literal["fp32", "bf16", "fp16"]
StrategyName = Literal[tuple(s.value for s in Strategy)]  # type: ignore[valid-type]
"""A sweep's strategy, as the config writes it (``contract.Strategy``)."""
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
    """Relative throughput loss accepted for a cheaper config: the knee is the cheapest config shown (at 95 %) to be
    within it of the best; also ``tunekit check``'s tolerance when wider than 5 %."""
    min_headroom: float = field(default=0.10, metadata=_meta(min=0, lt=1))
    """Smallest share of device memory that must stay free at the peak."""
    repeats: int = field(default=1, metadata=_meta(min=0, lt=10))
    """Further runs of each config a decision rests on (the script's own settings, the cheapest config still
    undecided, the knee, the best), in alternated blocks at the sweep's end: they measure the run-to-run spread every
    interval carries and pair the gains; while a cheaper config stays undecided, further blocks of it and the best
    follow (``rules.DECIDING_RUNS``). 0: none (every interval then rests on the stated 5 % prior between runs)."""


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


@dataclass(kw_only=True)
class Fleet:
    """How the nodes of one sweep share its study in a database (``storage``, ``tunekit sweep --join``)."""

    heartbeat_s: int = field(default=10, metadata=_meta(min=1))
    """How often a node records, in the study, that the trial it runs is still running."""
    grace_s: int = field(default=60, metadata=_meta(min=2))
    """A trial whose node has recorded no heartbeat for this long is failed (its node died) and run again by
    another node; more than ``heartbeat_s``."""
    poll_s: float = field(default=2.0, metadata=_meta(gt=0))
    """How often a node that waits for a result another node is measuring reads the study again."""


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

    name: str = field(
        metadata=_meta(
            pattern=_NAME,
            allowed="a plain folder name (letters, digits, '.', '_', '-'; "
            "no '/', not '..'); choose another place with --out",
        )
    )
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
    strategy: StrategyName = Strategy.staged.value
    """staged (ceilings, then end to end, then refinements) or grid (every combination)."""
    storage: str | None = None
    """Where the run's studies live: null for study.db in the run folder (one machine); a database URL
    (``postgresql://USER@HOST/DB``, ``sqlite:///PATH``) that several runs, and the machines of one sweep
    (``tunekit sweep --join``), share. Its password is never written: give it in the URL, ``PGPASSWORD`` or
    ``~/.pgpass``."""
    fleet: Fleet = field(default_factory=Fleet)
    """With ``storage``: the heartbeat of the nodes that share a sweep."""
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

    @property
    def own_settings(self) -> bool:
        """Whether the job has settings of its own to measure against (a script: its own loader, run by the
        ``baseline`` trial); factories have none, and PyTorch's defaults stand in."""
        return self.script is not None

    @property
    def own_batch(self) -> bool:
        """Whether the batch is the script's own (``script.own_batch``): tried as its baseline ran it, not searched."""
        return self.script is not None and self.script.own_batch


TOP_LEVEL_KEYS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(Config)
    if not f.metadata.get("internal")
    and not dataclasses.is_dataclass(f.type)
    and f.name not in ("workload", "script", "search", "trial", "selection", "budget", "cost", "launch", "fleet")
)
"""The config's keys that hold a value rather than a section (``--set strategy=grid``)."""


def auto_workers(cpus: int | None = None) -> list[int]:
    """Worker counts from 0 to 2x the CPU count, denser at the low end where the knee usually is."""
    top = 2 * (cpus or cpu_count())
    values = {0, 1, 2, top, top // 2}
    p = 2
    while p <= top:
        values.update({p, p * 3 // 2})
        p *= 2
    return sorted(v for v in values if v <= top)


# --- how a value is named in an error line --------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)
