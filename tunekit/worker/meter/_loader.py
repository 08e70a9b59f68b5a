"""The loader adapter: a DataLoader's batches one epoch after another, the batches its queues hold ready, and a
shutdown that does not wait for the workers' batches in hand.

What it reads of a multi-process DataLoader iterator (its result queues, its out-of-order batches, its workers) is
private to torch; a loader of another kind is iterated as it is and shows no queues.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["LoaderBatches", "digest", "tensors", "epoch_batches", "JOIN_S"]

JOIN_S = 5.0
"""Longest wait for the pin-memory thread or a killed worker to end."""


class LoaderBatches:
    """The loader's batches, one epoch after another: an epoch that ends inside the trial is counted, never hidden.
    For an IterableDataset with several workers, the first batch of each worker is fingerprinted: identical ones
    mean every worker reads the whole stream (unsharded), which multiplies the throughput."""

    def __init__(self, loader: Any, check_shards: int = 0, check_ranks: bool = False):
        self.loader = loader
        self.iterator = iter(loader)
        self.epochs_ended = 0
        self.first: bytes | None = None
        """The first batch's fingerprint, when the ranks compare theirs (data they shard themselves)."""
        self._check_ranks = check_ranks
        self._check = check_shards
        self._prints: list[bytes] = []
        self.warnings: list[str] = []
        self.closed = False
        """Set by :meth:`close`: a thread still fetching (the one-batch-ahead move) must not start a new epoch."""

    def __iter__(self) -> LoaderBatches:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self.iterator)
        except StopIteration:
            if self.closed:
                raise
            self.epochs_ended += 1
            if not getattr(self.loader, "persistent_workers", False):
                self.shutdown()  # a persistent loader's next iter() resets this iterator, workers and all
            self.iterator = iter(self.loader)
            batch = next(self.iterator)
        if len(self._prints) < self._check:
            self._fingerprint(batch)
        if self._check_ranks and self.first is None:
            self.first = digest(batch)
        return batch

    def _fingerprint(self, batch: Any) -> None:
        self._prints.append(digest(batch))
        if len(self._prints) == self._check and len(set(self._prints)) < self._check:
            same = [i for i, p in enumerate(self._prints) if self._prints.count(p) > 1]
            self.warnings.append(
                f"IterableDataset: the first batches of workers {', '.join(map(str, same))} are identical: every "
                "worker yields the same samples (shard the stream with torch.utils.data.get_worker_info()), so "
                "the throughput counts each sample once per worker"
            )

    def ready(self) -> int | None:
        """How many batches the loader's workers have made that wait to be taken: in the result queues (the
        workers', and the pin-memory thread's) and those that arrived out of order; 0 without workers; None for a
        loader whose iterator is not one of this torch's. A batch in the pin-memory thread's hands is not seen; a
        finite stream's end markers are counted as batches (the set-aside stops at an epoch's end)."""
        it = self.iterator
        if getattr(it, "_num_workers", None) == 0:
            return 0  # torch's single-process iterator makes each batch when it is asked for it
        try:
            queues = {id(q): q for q in (it._worker_result_queue, it._data_queue)}.values()
            early = sum(1 for i, info in list(it._task_info.items()) if i >= it._rcvd_idx and len(info) == 2)
            return sum(q.qsize() for q in queues) + early
        except (AttributeError, NotImplementedError, TypeError):
            return None

    def close(self) -> None:
        """The trial is done with the loader: no new epoch starts, and the workers stop."""
        self.closed = True
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the loader's workers at once. A graceful shutdown waits for every worker to finish the batch in hand
        (seconds for a large batch of decoded images), and nothing they make is used any more. PyTorch's own order
        is kept: the pin-memory thread stops first (a killed worker can leave half a message in the result queue),
        the workers are told to stop while all of them live (a killed one could hold the event's lock), then they
        are killed, their pids first taken off PyTorch's SIGCHLD watch so their end is not reported as a crash."""
        it = self.iterator
        workers = getattr(it, "_workers", None)
        if not workers or getattr(it, "_shutdown", True):
            getattr(it, "_shutdown_workers", lambda: None)()
            return
        try:
            it._shutdown = True
            if hasattr(it, "_pin_memory_thread"):
                it._pin_memory_thread_done_event.set()
                it._worker_result_queue.put((None, None))
                it._pin_memory_thread.join(timeout=JOIN_S)
            it._workers_done_event.set()
            if it._worker_pids_set:
                from torch.utils.data._utils import signal_handling

                signal_handling._remove_worker_pids(id(it))
                it._worker_pids_set = False
            for w in workers:
                if w.is_alive():
                    w.kill()
            for w in workers:
                w.join(timeout=JOIN_S)
            for q in (*it._index_queues, it._worker_result_queue):
                q.cancel_join_thread()
                q.close()
        except AttributeError:  # another DataLoader iterator than this torch's: its own shutdown
            it._shutdown = False
            getattr(it, "_shutdown_workers", lambda: None)()


def epoch_batches(loader: Any) -> int | None:
    """Batches in one epoch of a DataLoader as the knobs left it (its batch sampler's length); None for an iterable
    dataset or a sampler without a length."""
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return None
    try:
        return len(loader) or None
    except TypeError:
        return None


def digest(batch: Any) -> bytes:
    """A fingerprint of a batch's tensors (their bytes), to tell identical batches apart from different ones."""
    h = hashlib.sha1()
    for t in tensors(batch):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.digest()


def tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch: a tensor, or tensors nested in lists, tuples and dicts."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, (list, tuple)):
        return [t for b in batch for t in tensors(b)]
    if isinstance(batch, Mapping):  # a dict, or a UserDict such as transformers' BatchEncoding
        return [t for b in batch.values() for t in tensors(b)]
    return []
