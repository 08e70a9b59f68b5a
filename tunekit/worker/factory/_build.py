"""Assemble a trial's workload from the config: model, data, loss, optimizer and the step that trains them."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler

from tunekit.config import Config
from tunekit.contract import Knobs
from tunekit.recommended import worker_threads_init
from tunekit.workloads import resolve

__all__ = ["Built", "StepContext", "LoaderError", "build", "make_loader", "pick_device", "to_device", "loader_kwargs"]

# Large enough that no trial reaches the end: the sampler never crosses an epoch boundary mid-trial.
_SAMPLES_PER_EPOCH = 1 << 40
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class LoaderError(RuntimeError):
    """The user's DataLoader factory did not build the loader the trial asked for."""


@dataclass
class StepContext:
    """What a custom ``step(model, batch, ctx)`` may use. The batch is already on ``device``.

    With ``workload.step_updates`` the step owns the update: it calls backward (through ``scaler`` when it is not
    None), and steps and zeroes ``optimizer`` when ``micro_step`` completes an accumulation of ``grad_accum``."""

    device: torch.device
    loss_fn: Callable[..., torch.Tensor] | None
    precision: str
    channels_last: bool
    optimizer: torch.optim.Optimizer | None = None
    scaler: Any = None
    grad_accum: int = 1
    micro_step: int = 0
    """Micro-batches trained before this one (``(micro_step + 1) % grad_accum == 0``: this one ends a step)."""


@dataclass
class Built:
    model: torch.nn.Module
    dataset: Dataset
    optimizer: torch.optim.Optimizer
    ctx: StepContext
    step_fn: Callable[[torch.nn.Module, Any, StepContext], torch.Tensor]
    scaler: Any
    compile_mode: str
    build_s: float
    ddp: Any = None
    """The DistributedDataParallel module of a multi-rank trial (``no_sync`` lives there), else None."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = _DTYPES.get(self.ctx.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=dtype)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {name!r} was asked for but CUDA is not available here")
        if device.index is None:  # memory and NVML queries need an explicit ordinal
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _default_step(model: torch.nn.Module, batch: Any, ctx: StepContext) -> torch.Tensor:
    if isinstance(batch, Mapping):  # e.g. input_ids, attention_mask, labels: the model computes its loss
        out = model(**batch)
        loss = out["loss"] if isinstance(out, Mapping) else getattr(out, "loss", out)
        return loss if loss.dim() == 0 else loss.float().mean()
    inputs, targets = batch[0], batch[1]
    out = model(inputs)
    if ctx.loss_fn is None:
        return out if out.dim() == 0 else out.float().mean()
    return ctx.loss_fn(out, targets)


def build(cfg: Config, knobs: Knobs, device: torch.device, distributed: bool = False) -> Built:
    """Build the workload of ``cfg`` on ``device`` with the trial's compile mode; ``distributed``: wrapped in
    DistributedDataParallel (before compiling, as torch.compile expects) in the process group already joined."""
    t0 = time.perf_counter()
    wl = cfg.workload
    dataset = resolve(wl.dataset)(**wl.dataset_args)
    model = resolve(wl.model)(**wl.model_args).to(device)
    if wl.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    optimizer = resolve(wl.optimizer)(model.parameters(), **wl.optimizer_args)
    loss_fn = resolve(wl.loss)(**wl.loss_args) if wl.loss else None
    ddp = None
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        ddp = model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if knobs.compile != "none":
        model = torch.compile(model, mode=None if knobs.compile == "default" else knobs.compile)
    scaler = torch.amp.GradScaler(device.type) if wl.precision == "fp16" else None
    ctx = StepContext(
        device=device,
        loss_fn=loss_fn,
        precision=wl.precision,
        channels_last=wl.channels_last,
        optimizer=optimizer,
        scaler=scaler,
        grad_accum=knobs.grad_accum,
    )
    step_fn = resolve(wl.step) if wl.step else _default_step
    return Built(model, dataset, optimizer, ctx, step_fn, scaler, knobs.compile, time.perf_counter() - t0, ddp)


def loader_kwargs(knobs: Knobs, device: torch.device) -> dict[str, Any]:
    """The knobs as DataLoader keyword arguments (what recommended.yaml's ``dataloader_kwargs()`` gives)."""
    kwargs: dict[str, Any] = {
        "batch_size": knobs.batch_size,
        "num_workers": knobs.num_workers,
        "pin_memory": knobs.pin_memory and device.type == "cuda",
    }
    if knobs.num_workers > 0:
        kwargs.update(prefetch_factor=knobs.prefetch_factor, persistent_workers=True)
    return kwargs


def make_loader(
    dataset: Dataset, knobs: Knobs, device: torch.device, cfg: Config, rank: tuple[int, int] | None = None
) -> DataLoader:
    """The DataLoader under test: the user's factory when there is one, else one built with the configured hooks.
    A map-style dataset without a sampler of its own gets fresh permutations that never end the epoch (with
    ``rank = (rank, world)``: this rank's share of them, a DistributedSampler advanced by set_epoch every pass); an
    IterableDataset gets none (sharding across workers and ranks is the dataset's job)."""
    wl = cfg.workload
    kwargs = loader_kwargs(knobs, device)
    if wl.loader:
        loader = resolve(wl.loader)(dataset, **kwargs)
        _check_factory(loader, kwargs)
        return loader
    if wl.sampler:
        sampler = resolve(wl.sampler)(dataset)
    elif isinstance(dataset, IterableDataset):
        sampler = None
    elif rank is not None:
        from tunekit.worker._dist import EndlessDistributedSampler

        sampler = EndlessDistributedSampler(dataset, num_replicas=rank[1], rank=rank[0])
    else:
        sampler = RandomSampler(dataset, num_samples=_SAMPLES_PER_EPOCH, generator=torch.Generator().manual_seed(0))
    kwargs.pop("persistent_workers", None)  # the trial's loader lives as long as the trial: one epoch
    init = worker_threads_init(knobs.worker_threads, resolve(wl.worker_init_fn) if wl.worker_init_fn else None)
    return DataLoader(
        dataset,
        sampler=sampler,
        drop_last=True,
        collate_fn=resolve(wl.collate_fn) if wl.collate_fn else getattr(dataset, "collate_fn", None),
        worker_init_fn=init,
        **kwargs,
    )


def _check_factory(loader: Any, kwargs: dict[str, Any]) -> None:
    """The factory's loader must run with the knobs under test, or the trial measures something else."""
    if not isinstance(loader, DataLoader):
        raise LoaderError(f"workload.loader returned a {type(loader).__name__}, not a torch DataLoader")
    for key in ("num_workers", "batch_size", "pin_memory", "prefetch_factor"):
        if key in kwargs and getattr(loader, key, None) != kwargs[key]:
            raise LoaderError(
                f"workload.loader built a DataLoader with {key}={getattr(loader, key, None)!r}, not "
                f"the trial's {kwargs[key]!r}: the factory must pass on the knobs it is given"
            )


def to_device(batch: Any, ctx: StepContext, non_blocking: bool) -> Any:
    """Move every tensor of a (nested) batch to the device; 4-D float inputs go channels-last if asked."""
    if isinstance(batch, torch.Tensor):
        out = batch.to(ctx.device, non_blocking=non_blocking)
        if ctx.channels_last and out.dim() == 4 and out.is_floating_point():
            out = out.contiguous(memory_format=torch.channels_last)
        return out
    if isinstance(batch, (list, tuple)):
        moved = [to_device(b, ctx, non_blocking) for b in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    if isinstance(batch, Mapping):
        moved = {k: to_device(v, ctx, non_blocking) for k, v in batch.items()}
        try:
            return type(batch)(moved)  # dict subclasses, UserDict, BatchEncoding-like mappings keep their type
        except Exception:  # noqa: BLE001 - a mapping type that cannot be rebuilt from a dict
            return moved
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(
            batch,
            **{
                f.name: to_device(getattr(batch, f.name), ctx, non_blocking)
                for f in dataclasses.fields(batch)
                if f.init
            },
        )
    return batch
