"""What a multi-rank trial checks beyond its windows: whether the ranks read the same data, and the share of a
step that gradient synchronisation adds."""

from __future__ import annotations

import contextlib
import time

import torch

from tunekit.worker import _dist
from tunekit.worker.factory._build import Built, to_device
from tunekit.worker.factory._step import TrialStep
from tunekit.worker.meter import LoaderBatches

__all__ = ["warn_if_ranks_read_the_same", "sync_share"]


def warn_if_ranks_read_the_same(ranks: _dist.Ranks, batches: LoaderBatches) -> None:
    """Compare the ranks' first batches; identical ones mean every rank reads the same samples (a warning)."""
    prints = ranks.gather(batches.first)
    if len(set(prints)) < len(prints):
        batches.warnings.append(
            "the ranks' first batches are identical: every rank reads the same samples (shard the data by "
            "torch.distributed.get_rank(), e.g. with a DistributedSampler), so the global throughput counts each "
            "sample once per rank"
        )


def sync_share(step: TrialStep, built: Built, device: torch.device, ranks: _dist.Ranks) -> float:
    """The share of a training step spent on gradient synchronisation that computation does not hide: the same
    optimizer steps on one batch already on the device, timed with DDP's all-reduce and under ``no_sync``."""
    staged = to_device(next(step.batches), built.ctx, non_blocking=False)
    micro = _dist.SYNC_PROBE_STEPS * built.ctx.grad_accum

    def timed(sync: bool) -> float:
        ranks.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with contextlib.nullcontext() if sync else built.ddp.no_sync():
            for _ in range(micro):
                step.run(staged)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    timed(sync=False)  # the first steps on a staged batch (no copies in flight) settle the allocator
    with_sync, without = timed(sync=True), timed(sync=False)
    return max(0.0, 1.0 - without / with_sync) if with_sync > 0 else 0.0
