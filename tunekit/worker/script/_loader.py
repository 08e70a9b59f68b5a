"""The script's training loader as a trial sees it: the knobs set on it before its workers start
(:func:`apply_knobs`), its length, the items a batch holds, read from the batches themselves (:class:`Items`), and
a batch's copy to the device for the loader-alone trial."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from tunekit.command import LOADER_KNOBS
from tunekit.contract import TrialSpec
from tunekit.worker.meter import checked_count, tensors
from tunekit.workloads import resolve

__all__ = ["apply_knobs", "loader_length", "Items", "copy_to_device"]


def loader_length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


class Items:
    """The items a batch holds (``script.count``'s hook, else the batch's leading dimension), and the batch size the
    loop first received: read from the batches, never from ``DataLoader.batch_size`` (None for a loader built with a
    batch sampler, as HF Trainer's and Lightning's are)."""

    def __init__(self, path: str | None, fallback: int):
        self.hook = checked_count(resolve(path), "script.count") if path is not None else None
        self.fallback = fallback
        self.first: int | None = None

    def __call__(self, batch: Any) -> float:
        if self.hook is not None and self.first is not None:  # the batch size is known: the hook alone counts
            return self.hook(batch)
        size = _leading(batch)
        if self.first is None and size is not None:
            self.first = size
        return self.hook(batch) if self.hook is not None else float(size or self.fallback)


def _leading(batch: Any) -> int | None:
    """The leading dimension of a batch's first tensor that has one: its batch size."""
    return next((t.shape[0] for t in tensors(batch) if t.dim() > 0), None)


def copy_to_device(batch: Any, device: torch.device, pinned: bool) -> None:
    if device.type == "cuda":
        for t in tensors(batch):
            t.to(device, non_blocking=pinned)


def apply_knobs(loader: DataLoader, spec: TrialSpec, inject: set[str]) -> dict[str, Any]:
    """Set the knobs in ``inject`` on the loader (before its iterator starts its workers); what it runs with."""
    knobs = spec.knobs
    if "num_workers" in inject:
        object.__setattr__(loader, "num_workers", knobs.num_workers)
    workers = loader.num_workers
    if "prefetch_factor" in inject and workers > 0:
        object.__setattr__(loader, "prefetch_factor", knobs.prefetch_factor or 2)
    if workers > 0 and loader.prefetch_factor is None:
        object.__setattr__(loader, "prefetch_factor", 2)
    if "pin_memory" in inject:
        object.__setattr__(loader, "pin_memory", knobs.pin_memory and torch.cuda.is_available())
    if inject & set(LOADER_KNOBS) and workers > 0:  # the workers live as long as the trial, as recommended
        object.__setattr__(loader, "persistent_workers", True)
    if "batch_size" in inject and loader.batch_size is not None and loader.batch_size != knobs.batch_size:
        sampler = BatchSampler(loader.sampler, knobs.batch_size, loader.drop_last)
        object.__setattr__(loader, "batch_sampler", sampler)
        object.__setattr__(loader, "batch_size", knobs.batch_size)
    return {
        "num_workers": workers,
        "batch_size": loader.batch_size or knobs.batch_size,
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": loader.prefetch_factor if workers else None,
        "persistent_workers": bool(loader.persistent_workers),
    }
