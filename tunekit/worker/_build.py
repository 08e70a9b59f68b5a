"""Assemble a trial's workload from the config: model, data, loss, optimizer and the step that trains them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from tunekit.config import Config
from tunekit.contract import Knobs
from tunekit.workloads import resolve

__all__ = ["Built", "StepContext", "build", "make_loader", "pick_device", "to_device"]

# Large enough that no trial reaches the end: the sampler never crosses an epoch boundary mid-trial.
_SAMPLES_PER_EPOCH = 1 << 40
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepContext:
    """What a custom ``step(model, batch, ctx)`` may use. The batch is already on ``device``."""

    device: torch.device
    loss_fn: Callable[..., torch.Tensor] | None
    precision: str
    channels_last: bool


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
    inputs, targets = batch[0], batch[1]
    out = model(inputs)
    if ctx.loss_fn is None:
        return out if out.dim() == 0 else out.float().mean()
    return ctx.loss_fn(out, targets)


def build(cfg: Config, knobs: Knobs, device: torch.device) -> Built:
    """Build the workload of ``cfg`` on ``device`` with the trial's compile mode."""
    t0 = time.perf_counter()
    wl = cfg.workload
    dataset = resolve(wl.dataset)(**wl.dataset_args)
    model = resolve(wl.model)(**wl.model_args).to(device)
    if wl.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    optimizer = resolve(wl.optimizer)(model.parameters(), **wl.optimizer_args)
    loss_fn = resolve(wl.loss)(**wl.loss_args) if wl.loss else None
    if knobs.compile != "none":
        model = torch.compile(model, mode=None if knobs.compile == "default" else knobs.compile)
    scaler = torch.amp.GradScaler(device.type) if wl.precision == "fp16" else None
    ctx = StepContext(device=device, loss_fn=loss_fn, precision=wl.precision, channels_last=wl.channels_last)
    step_fn = resolve(wl.step) if wl.step else _default_step
    return Built(model, dataset, optimizer, ctx, step_fn, scaler, knobs.compile, time.perf_counter() - t0)


def make_loader(dataset: Dataset, knobs: Knobs, device: torch.device) -> DataLoader:
    """The DataLoader under test. Its sampler draws fresh permutations without ever ending the epoch."""
    sampler = RandomSampler(dataset, num_samples=_SAMPLES_PER_EPOCH, generator=torch.Generator().manual_seed(0))
    return DataLoader(
        dataset,
        batch_size=knobs.batch_size,
        sampler=sampler,
        num_workers=knobs.num_workers,
        prefetch_factor=knobs.prefetch_factor if knobs.num_workers > 0 else None,
        pin_memory=knobs.pin_memory and device.type == "cuda",
        drop_last=True,
    )


def to_device(batch: Any, ctx: StepContext, non_blocking: bool) -> Any:
    """Move every tensor of a (nested) batch to the device; 4-D float inputs go channels-last if asked."""
    if isinstance(batch, torch.Tensor):
        out = batch.to(ctx.device, non_blocking=non_blocking)
        if ctx.channels_last and out.dim() == 4 and out.is_floating_point():
            out = out.contiguous(memory_format=torch.channels_last)
        return out
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, ctx, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, ctx, non_blocking) for k, v in batch.items()}
    return batch
