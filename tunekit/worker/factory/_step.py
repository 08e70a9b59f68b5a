"""The built-in step of each trial mode, and the batches it is fed (their fetch is data wait).

* ``train``: the loader's batches, moved onto the device in the step (or one batch ahead, beside it); forward and
  backward under autocast, the optimizer step every ``grad_accum`` batches.
* ``compute``: one batch staged on the device before warm-up, again and again; the same step without the move.
* ``loader``: the loader's batches; the step is the host-to-device copy only.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tunekit.config import Config
from tunekit.contract import TrialSpec
from tunekit.worker._modes import TrialMode
from tunekit.worker.factory._ahead import AheadStream
from tunekit.worker.factory._build import Built, to_device
from tunekit.worker.meter import LoaderBatches, checked_count
from tunekit.workloads import resolve

__all__ = ["TrialStep", "trial_step", "check_loss", "checked_count", "moves_ahead", "Diverged"]


class Diverged(RuntimeError):
    """The loss went NaN or Inf: the trial's steps are not training steps, however fast they are."""


@dataclass
class TrialStep:
    """A trial's batches and the step that consumes them (``for batch in meter: step.run(batch)``)."""

    batches: Iterator[Any]
    run: Callable[[Any], None]
    count: Callable[[Any], float]
    """Items a batch holds, in the workload's unit."""
    ready: Callable[[], int | None]
    """Batches ready without a wait (the loader's queues, and a stream ahead's)."""
    queued: int = 0
    """Batches the batches hold beyond the loader's fill (a stream ahead's)."""
    device_wait: Callable[[], float] = lambda: 0.0
    """Seconds the fetches so far waited on a stream ahead's device work rather than on the loader."""
    close: Callable[[], None] = lambda: None
    """Stops what runs beside the step (a stream ahead), before the loader stops."""
    micro: int = 0
    """Batches trained so far; the optimizer steps every grad_accum of them."""
    loss: Any = None
    """The last batch's loss, still on the device: checked at window edges only (no sync per step)."""
    on_device: Callable[[], tuple[Any, float]] | None = None
    """One more batch on the device as the step gets it, and the items it holds (the FLOP count's, after the
    windows); None in loader mode."""


def moves_ahead(built: Built, mode: TrialMode) -> bool:
    """Whether a training trial runs the dataset's ``batch_to_device`` one batch ahead (``batch_to_device_ahead``)."""
    return mode.end_to_end and bool(getattr(built.dataset, "batch_to_device_ahead", False))


def _counter(cfg: Config, batch_size: int) -> Callable[[Any], float]:
    if cfg.workload.count is None:
        return lambda batch: batch_size
    return checked_count(resolve(cfg.workload.count), "workload.count")


def _fed(
    built: Built, spec: TrialSpec, mode: TrialMode, cfg: Config, loader: LoaderBatches, move: Callable[..., Any]
) -> TrialStep:
    """The batches the step of ``mode`` is fed, and how they are counted (its ``run`` still to be set)."""
    ctx, count = built.ctx, _counter(cfg, spec.knobs.batch_size)
    if mode.staged:  # one batch staged on the device: counted once, on the host
        first = next(loader)
        items = count(first)
        staged = move(first, ctx, non_blocking=False)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        return TrialStep(batches=itertools.repeat(staged), run=lambda b: None, count=lambda b: items, ready=lambda: 0)
    if moves_ahead(built, mode):
        # the dataset's count reads the batch as the loader made it: count it before the move, in the thread
        stream = AheadStream(
            loader,
            lambda b, c, non_blocking: (move(b, c, non_blocking=non_blocking), count(b)),
            ctx,
            spec.knobs.non_blocking,
        )
        return TrialStep(
            batches=stream,
            run=lambda b: None,
            count=lambda b: b[1],
            ready=lambda: stream.ready(loader.ready()),
            queued=AheadStream.QUEUED,
            device_wait=lambda: stream.device_wait_s,
            close=stream.close,
        )
    return TrialStep(batches=loader, run=lambda b: None, count=count, ready=loader.ready)


def trial_step(built: Built, spec: TrialSpec, mode: TrialMode, cfg: Config, loader: LoaderBatches) -> TrialStep:
    """The step of ``mode`` on ``loader``'s batches."""
    knobs, ctx = spec.knobs, built.ctx
    # a dataset may bring its own way onto the device (a built-in image pipeline with decode: gpu decodes and
    # augments there): part of the training step, and done once for the staged batch of the compute ceiling
    move = getattr(built.dataset, "batch_to_device", None) or to_device
    ahead = moves_ahead(built, mode)
    step = _fed(built, spec, mode, cfg, loader, move)

    def train(batch: Any) -> None:
        if ahead:
            batch = batch[0]
        elif not mode.staged:
            batch = move(batch, ctx, non_blocking=knobs.non_blocking)
        ctx.micro_step = step.micro
        # DDP: a batch that does not end the accumulation skips the gradient all-reduce (forward included, as
        # no_sync requires), so accumulation really syncs once per optimizer step
        accumulating = built.ddp is not None and (step.micro + 1) % knobs.grad_accum != 0
        with built.ddp.no_sync() if accumulating else contextlib.nullcontext():
            with built.autocast():
                loss = built.step_fn(built.model, batch, ctx)
            step.micro += 1
            if cfg.workload.step_updates:  # the step did backward and the optimizer step itself
                step.loss = loss.detach() if isinstance(loss, torch.Tensor) else None
                return
            if not isinstance(loss, torch.Tensor):
                key = "workload.step" if cfg.workload.step else "the model (workload.loss: null)"
                raise TypeError(
                    f"{key} returned {type(loss).__name__}, not the loss: it must return a tensor to "
                    "call backward on (or, with workload.step_updates: true, do the update itself)"
                )
            _update(built, step, loss / knobs.grad_accum, knobs.grad_accum)

    def copy_only(batch: Any) -> None:
        to_device(batch, ctx, non_blocking=knobs.non_blocking)

    def on_device() -> tuple[Any, float]:
        batch = next(step.batches)
        if ahead:  # moved by the stream, counted before the move
            return batch[0], batch[1]
        items = step.count(batch)
        return (batch if mode.staged else move(batch, ctx, non_blocking=False)), items

    step.run = train if mode.trains else copy_only
    step.on_device = on_device if mode.trains else None
    return step


def _update(built: Built, step: TrialStep, loss: torch.Tensor, grad_accum: int) -> None:
    """Backward, and the optimizer step when the accumulation completes (through the fp16 scaler if any)."""
    step.loss = loss.detach()
    scaler, optimizer = built.scaler, built.optimizer
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if step.micro % grad_accum == 0:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def check_loss(step: TrialStep, any_rank: Callable[[bool], bool] = bool) -> None:
    """Raise :class:`Diverged` when the last loss is not finite (after a window's sync: no extra sync); on every
    rank when it is so on any (``any_rank``)."""
    bad = step.loss is not None and not bool(torch.isfinite(step.loss).all())
    if any_rank(bad):
        where = f"the loss is {step.loss.float().item()}" if bad else "another rank's loss is not finite"
        raise Diverged(f"{where} at micro-batch {step.micro} (a NaN or Inf loss: the steps do not train)")
