"""The one-batch-ahead stream: a dataset's own ``batch_to_device`` run in a thread, beside the step.

A dataset with ``batch_to_device_ahead`` (e.g. ``decode: gpu-overlap``) moves each batch onto the device itself,
decoding and augmenting there; this stream does it for the next batch while the step trains the one before.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tunekit.worker.meter import JOIN_S, tensors

__all__ = ["AheadStream"]


class AheadStream:
    """Batches moved one ahead: a thread takes the source's batches and moves them, on a CUDA stream of its own,
    while the step trains the batch before; the step waits only when the next batch is not ready (data wait). A
    moved batch reaches the training stream after the side stream's work on it (an event), and its tensors are
    marked in use there, so the side stream's allocations are not reused while the step still reads them.

    Args:
        source: the loader's batches (called, or iterated, once per batch).
        move: ``move(batch, ctx, non_blocking=...)``, the dataset's way onto the device.
        ctx: the step context (its ``device``).
        non_blocking: passed on to ``move``.
    """

    QUEUED = 2
    """Batches the stream can hold beyond the loader's: the moved one in its queue and the one in the thread's
    hands."""

    def __init__(
        self, source: Iterator[Any] | Callable[[], Any], move: Callable[..., Any], ctx: Any, non_blocking: bool
    ):
        self.source = source.__next__ if hasattr(source, "__next__") else source
        self.move, self.ctx, self.non_blocking = move, ctx, non_blocking
        self.device: torch.device = ctx.device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.moved: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._loader_s = 0.0  # the thread's finished waits on the loader
        self._loader_since: float | None = None  # when its current wait on the loader began
        self.device_wait_s = 0.0
        """Seconds the step's fetches waited while the thread was moving, not waiting on the loader."""
        self.thread = threading.Thread(target=self._run, name="tunekit-ahead", daemon=True)
        self.thread.start()

    def _loader_waited(self) -> float:
        """The thread's time waiting on the loader so far, the current wait included."""
        with self._lock:
            since = self._loader_since
            return self._loader_s + (time.perf_counter() - since if since is not None else 0.0)

    def _next_batch(self) -> Any:
        since = time.perf_counter()
        with self._lock:
            self._loader_since = since
        try:
            return self.source()
        finally:
            with self._lock:
                self._loader_s += time.perf_counter() - since
                self._loader_since = None

    def _run(self) -> None:
        try:
            with contextlib.ExitStack() as stack:
                if self.stream is not None:  # the current device and stream are the thread's own
                    stack.enter_context(torch.cuda.device(self.device))
                    stack.enter_context(torch.cuda.stream(self.stream))
                while not self.stopping.is_set():
                    moved = self.move(self._next_batch(), self.ctx, non_blocking=self.non_blocking)
                    done = None
                    if self.stream is not None:
                        done = torch.cuda.Event()
                        done.record(self.stream)
                    self._put((moved, done))
        except BaseException as exc:  # noqa: BLE001 - the step raises it
            self._put(exc)

    def _put(self, item: Any) -> None:
        while not self.stopping.is_set():
            try:
                self.moved.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> AheadStream:
        return self

    def __next__(self) -> Any:
        # what the step waits for is the loader only while the thread waits on it; the rest is the move (decoding
        # on the GPU), which must not read as a starved loader
        t0, loader0 = time.perf_counter(), self._loader_waited()
        item = self.moved.get()
        waited = time.perf_counter() - t0
        self.device_wait_s += max(0.0, waited - (self._loader_waited() - loader0))
        if isinstance(item, BaseException):
            raise item
        moved, done = item
        if done is not None:
            training = torch.cuda.current_stream(self.device)
            training.wait_event(done)
            for t in tensors(moved):
                if t.device.type == "cuda":
                    t.record_stream(training)
        return moved

    def ready(self, loader_ready: int | None) -> int | None:
        """Batches ready without a wait: the moved one in the queue, and the loader's (``loader_ready``)."""
        return None if loader_ready is None else loader_ready + self.moved.qsize()

    def close(self) -> None:
        """Stop taking batches; the thread ends once the batch in hand is moved (it is a daemon: a loader that
        never returns does not hold the trial)."""
        self.stopping.set()
        deadline = time.perf_counter() + JOIN_S
        while self.thread.is_alive() and time.perf_counter() < deadline:
            with contextlib.suppress(queue.Empty):  # a moved batch in the queue would hold its device memory
                self.moved.get(timeout=0.05)
        with contextlib.suppress(queue.Empty):
            self.moved.get_nowait()
