"""The measured loop of one trial, following the fidelity rules of docs/measurement.md.

* Warm-up consumes the first batch, then the pipeline fill (num_workers x prefetch_factor batches), then the
  configured warm-up steps, so batches prepared during start-up or compilation are never counted as throughput.
* The first step's time is reported as compile_s when torch.compile is on, never mixed into samples/s.
* Windows are timed on the host clock with the device synchronised at their edges only; GPU busy time comes
  from CUDA events around each step.
* Device peak memory counters are reset after warm-up; peaks, not means, are reported.
* The sampler draws from one endless epoch, so no epoch boundary (worker restart) falls inside the trial.
"""

from __future__ import annotations

import contextlib
import copy
import os
import platform
import queue
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psutil
import torch
from torch.utils.data import IterableDataset

from tunekit import __version__, rules
from tunekit.config import Config, cpu_count, extra_knobs, from_dict, set_dotted
from tunekit.contract import Knobs, TrialSpec
from tunekit.worker import _dist
from tunekit.worker._build import Built, build, make_loader, pick_device, to_device
from tunekit.worker._monitor import CpuUse, Monitor, TreeCpu
from tunekit.workloads import resolve

__all__ = ["measure", "MIN_WINDOW_STEPS", "Diverged"]

MIN_WINDOW_STEPS = 3
"""A window lasts at least trial.window_s and at least this many optimizer steps: with second-long steps a
window of two or three steps quantises throughput too coarsely to be stable."""

_JOIN_S = 5.0
"""Longest wait for the pin-memory thread or a killed worker to end."""

READY_FETCH_S = 0.005
"""For a loader whose queues cannot be read: a fetch shorter than this (and than 3x the median of the fetches that
took a waiting batch) took a batch that was already waiting in the loader's queue; warm-up sets such batches aside
until two fetches in a row wait."""


@dataclass
class _Window:
    wall_s: float
    steps: int
    samples: float
    """Items (in the workload's unit) the window's micro-batches held."""
    micro_batches: int
    data_wait_s: float
    busy_s: float | None
    cpu: CpuUse
    device_wait_s: float = 0.0
    """Time the step waited for the next batch's move on the device (one batch ahead), not for the loader."""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s


@dataclass
class _Loop:
    """One step of the trial's mode: fetch a batch (timed as data wait), then do the work on it."""

    fetch: Callable[[], Any]
    work: Callable[[Any], None]
    count: Callable[[Any], float]
    """Items a fetched batch holds, in the workload's unit."""
    micro: int = 0
    """Micro-batches trained so far; the optimizer steps every grad_accum of them."""
    close: Callable[[], None] = lambda: None
    """Stops what the fetch runs beside the step (the one-batch-ahead move), before the loader stops."""
    device_wait: Callable[[], float] = lambda: 0.0
    """Seconds the fetches so far waited on the one-batch-ahead move rather than on the loader."""
    loss: Any = None
    """The last micro-batch's loss, still on the device: checked at window edges only (no sync per step)."""
    agree: Callable[[bool], bool] = bool
    """True on every rank when ``flag`` is True on any (a multi-rank trial); the flag itself in one process."""
    agree_max: Callable[[int], int] = int
    """The largest of the ranks' values (the value itself in one process)."""
    ready: Callable[[], int | None] = lambda: None
    """Batches ready to be fetched without a wait, when the loader shows them (:meth:`_Batches.ready`)."""
    epochs: Callable[[], int] = lambda: 0
    """Epochs the loader has ended so far (:attr:`_Batches.epochs_ended`)."""
    held: int = 0
    """Batches the fetch can hold beyond the loader's fill: the one-batch-ahead thread's queued and in-hand ones."""


class Diverged(RuntimeError):
    """The loss went NaN or Inf: the trial's steps are not training steps, however fast they are."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nvml_sampler(device: torch.device) -> Any | None:
    if device.type != "cuda":
        return None
    try:
        from tunekit.env import NvmlSampler

        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return NvmlSampler.for_uuid(uuid, fallback_index=device.index or 0)
    except Exception:  # noqa: BLE001 - NVML missing means no NVML figures, not a failed trial
        return None


class _Batches:
    """The loader's batches, one epoch after another: an epoch that ends inside the trial is counted, never hidden.
    For an IterableDataset with several workers, the first batch of each worker is fingerprinted: identical ones
    mean every worker reads the whole stream (unsharded), which multiplies the throughput."""

    def __init__(self, loader: Any, check_shards: int, check_ranks: bool = False):
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

    def __call__(self) -> Any:
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
            self.first = _digest(batch)
        return batch

    def _fingerprint(self, batch: Any) -> None:
        self._prints.append(_digest(batch))
        if len(self._prints) == self._check and len(set(self._prints)) < self._check:
            same = [i for i, p in enumerate(self._prints) if self._prints.count(p) > 1]
            self.warnings.append(
                f"IterableDataset: the first batches of workers {', '.join(map(str, same))} are identical: every "
                "worker yields the same samples (shard the stream with torch.utils.data.get_worker_info()), so "
                "the throughput counts each sample once per worker")

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
                it._pin_memory_thread.join(timeout=_JOIN_S)
            it._workers_done_event.set()
            if it._worker_pids_set:
                from torch.utils.data._utils import signal_handling

                signal_handling._remove_worker_pids(id(it))
                it._worker_pids_set = False
            for w in workers:
                if w.is_alive():
                    w.kill()
            for w in workers:
                w.join(timeout=_JOIN_S)
            for q in (*it._index_queues, it._worker_result_queue):
                q.cancel_join_thread()
                q.close()
        except AttributeError:  # another DataLoader iterator than this torch's: its own shutdown
            it._shutdown = False
            getattr(it, "_shutdown_workers", lambda: None)()


def _digest(batch: Any) -> bytes:
    import hashlib

    h = hashlib.sha1()
    for t in _tensors(batch):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.digest()


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, (list, tuple)):
        return [t for b in batch for t in _tensors(b)]
    if isinstance(batch, dict):
        return [t for b in batch.values() for t in _tensors(b)]
    return []


class _Ahead:
    """A dataset's own ``batch_to_device`` run one batch ahead (a dataset with ``batch_to_device_ahead``, e.g.
    ``decode: gpu-overlap``): a thread takes the loader's batches and moves them, on a CUDA stream of its own, while
    the step trains the batch before; the step waits only when the next batch is not ready (data wait). A moved
    batch reaches the training stream after the side stream's work on it (an event), and its tensors are marked in
    use there, so the side stream's allocations are not reused while the step still reads them."""

    def __init__(self, batches: _Batches, move: Callable[..., Any], ctx: Any, non_blocking: bool):
        self.batches, self.move, self.ctx, self.non_blocking = batches, move, ctx, non_blocking
        self.device: torch.device = ctx.device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.ready: queue.Queue[Any] = queue.Queue(maxsize=1)
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
            return self.batches()
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
                self.ready.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __call__(self) -> Any:
        # what the step waits for is the loader only while the thread waits on it; the rest is the move (decoding
        # on the GPU), which must not read as a starved loader
        t0, loader0 = time.perf_counter(), self._loader_waited()
        item = self.ready.get()
        waited = time.perf_counter() - t0
        self.device_wait_s += max(0.0, waited - (self._loader_waited() - loader0))
        if isinstance(item, BaseException):
            raise item
        moved, done = item
        if done is not None:
            training = torch.cuda.current_stream(self.device)
            training.wait_event(done)
            for t in _tensors(moved):
                if t.device.type == "cuda":
                    t.record_stream(training)
        return moved

    def waiting(self) -> int | None:
        """Batches ready without a wait: the moved one in the queue, and the loader's (:meth:`_Batches.ready`)."""
        loader = self.batches.ready()
        return None if loader is None else loader + self.ready.qsize()

    def close(self) -> None:
        """Stop taking batches; the thread ends once the batch in hand is moved (it is a daemon: a loader that
        never returns does not hold the trial)."""
        self.stopping.set()
        deadline = time.perf_counter() + _JOIN_S
        while self.thread.is_alive() and time.perf_counter() < deadline:
            with contextlib.suppress(queue.Empty):  # a moved batch in the queue would hold its device memory
                self.ready.get(timeout=0.05)
        with contextlib.suppress(queue.Empty):
            self.ready.get_nowait()


def _moves_ahead(built: Built, spec: TrialSpec) -> bool:
    """Whether a training trial runs the dataset's ``batch_to_device`` one batch ahead (``batch_to_device_ahead``)."""
    return spec.mode == "train" and bool(getattr(built.dataset, "batch_to_device_ahead", False))


def _counter(cfg: Config, batch_size: int) -> Callable[[Any], float]:
    if cfg.workload.count is None:
        return lambda batch: batch_size
    count = resolve(cfg.workload.count)
    return lambda batch: float(count(batch))


def _train_loop(built: Built, spec: TrialSpec, cfg: Config, batches: _Batches) -> _Loop:
    knobs, ctx = spec.knobs, built.ctx
    count = _counter(cfg, knobs.batch_size)
    # a dataset may bring its own way onto the device (a built-in image pipeline with decode: gpu decodes and
    # augments there): part of the training step, and done once for the staged batch of the compute ceiling
    move = getattr(built.dataset, "batch_to_device", None) or to_device
    # ... or one batch ahead, beside the step (rather than inside it)
    ahead = _moves_ahead(built, spec)
    if spec.mode == "compute":  # one batch staged on the device: counted once, on the host
        first = batches()
        items = count(first)
        staged = move(first, ctx, non_blocking=False)
        _sync(ctx.device)
        loop = _Loop(fetch=lambda: staged, work=lambda b: None, count=lambda b: items)
    elif ahead:
        # the dataset's count reads the batch as the loader made it: count it before the move, in the thread
        prefetch = _Ahead(batches, lambda b, c, non_blocking: (move(b, c, non_blocking=non_blocking), count(b)),
                          ctx, knobs.non_blocking)
        loop = _Loop(fetch=prefetch, work=lambda b: None, count=lambda b: b[1], close=prefetch.close,
                     device_wait=lambda: prefetch.device_wait_s, ready=prefetch.waiting, held=2)
    else:
        loop = _Loop(fetch=batches, work=lambda b: None, count=count, ready=batches.ready)
    loop.epochs = lambda: batches.epochs_ended

    def train(batch: Any) -> None:
        if ahead:
            batch = batch[0]
        elif spec.mode != "compute":
            batch = move(batch, ctx, non_blocking=knobs.non_blocking)
        ctx.micro_step = loop.micro
        # DDP: a micro-batch that does not end the accumulation skips the gradient all-reduce (forward included,
        # as no_sync requires), so accumulation really syncs once per optimizer step
        accumulating = built.ddp is not None and (loop.micro + 1) % knobs.grad_accum != 0
        with built.ddp.no_sync() if accumulating else contextlib.nullcontext():
            with built.autocast():
                loss = built.step_fn(built.model, batch, ctx)
            loop.micro += 1
            if cfg.workload.step_updates:  # the step did backward and the optimizer step itself
                loop.loss = loss.detach() if isinstance(loss, torch.Tensor) else None
                return
            _update(built, loop, loss / knobs.grad_accum, knobs.grad_accum)

    def copy_only(batch: Any) -> None:
        to_device(batch, ctx, non_blocking=knobs.non_blocking)

    loop.work = copy_only if spec.mode == "loader" else train
    return loop


def _update(built: Built, loop: _Loop, loss: torch.Tensor, grad_accum: int) -> None:
    """Backward, and the optimizer step when the accumulation completes (through the fp16 scaler if any)."""
    loop.loss = loss.detach()
    scaler, optimizer = built.scaler, built.optimizer
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if loop.micro % grad_accum == 0:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _run_window(loop: _Loop, device: torch.device, window_s: float, accum: int, round_batches: int,
                cpu: TreeCpu) -> _Window:
    """Time one window. It ends on a whole round of the loader's workers (``round_batches`` batches): batch j
    and batch j + num_workers come from the same worker, so a window of whole rounds spans whole production
    periods of one worker, and lockstep workers delivering in bursts cannot alias with the window edges."""
    cuda = device.type == "cuda"
    events: list[tuple[Any, Any]] = []
    cpu.begin()
    _sync(device)
    t0 = time.perf_counter()
    wait = 0.0
    device0 = loop.device_wait()
    steps = 0
    items = 0.0
    while True:
        for _ in range(accum):
            tw = time.perf_counter()
            item = loop.fetch()
            wait += time.perf_counter() - tw
            items += loop.count(item)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                loop.work(item)
                end.record()
                events.append((start, end))
            else:
                loop.work(item)
        steps += 1
        # every rank reaches the same checkpoints (same step counts): there the ranks agree to end the window
        if (steps >= MIN_WINDOW_STEPS and (steps * accum) % round_batches == 0
                and loop.agree(time.perf_counter() - t0 >= window_s)):
            break
    _sync(device)
    wall = time.perf_counter() - t0
    used = cpu.end()
    _check_loss(loop)
    busy = sum(s.elapsed_time(e) for s, e in events) / 1000.0 if cuda else None
    device_wait = loop.device_wait() - device0
    return _Window(wall, steps, items, steps * accum, wait - device_wait, busy, used, device_wait)


def _check_loss(loop: _Loop) -> None:
    """Raise :class:`Diverged` when the last loss is not finite (after the window's sync: no extra sync); on every
    rank when it is so on any."""
    bad = loop.loss is not None and not bool(torch.isfinite(loop.loss).all())
    if loop.agree(bad):
        where = f"the loss is {loop.loss.float().item()}" if bad else "another rank's loss is not finite"
        raise Diverged(f"{where} at micro-batch {loop.micro} (a NaN or Inf loss: the steps do not train)")


def _warm_up(loop: _Loop, spec: TrialSpec, cfg: Config, device: torch.device) -> dict[str, Any]:
    """Consume the first batch (its step timed apart: worker start-up, compilation), set aside the batches the
    workers prepared meanwhile, then train the warm-up steps."""
    knobs = spec.knobs
    t0 = time.perf_counter()
    first = loop.fetch()
    first_wait = time.perf_counter() - t0
    loop.work(first)
    _sync(device)
    first_step_s = time.perf_counter() - t0
    fill = knobs.num_workers * (knobs.prefetch_factor or 2) + loop.held
    set_aside = _set_aside(loop, fill if spec.mode != "compute" else 0)
    trained = _warm_up_steps(loop, knobs, cfg)
    _sync(device)
    return {
        "warmup_s": time.perf_counter() - t0,
        "warmup_batches": set_aside + trained,
        "warmup_set_aside": set_aside,
        "first_batch_wait_s": first_wait,
        "first_step_s": first_step_s,
        "compile_s": (first_step_s - first_wait) if knobs.compile != "none" else 0.0,
    }


def _set_aside(loop: _Loop, fill: int) -> int:
    """Take the batches made during start-up and the first step, which wait ready in the loader's queue (at most a
    fill), without a step; return how many. From there batches arrive at the pipeline's own rate: a step on a ready
    batch would count throughput the pipeline cannot sustain, and training on the fill (seconds of steps on big
    batches) is what warm-up time used to go to. The loader's queues say how many are ready (:meth:`_Loop.ready`);
    a loader that does not show them is read by the fetches' times: until two in a row wait for a worker. An epoch
    that ends ends it too (a finite stream's end markers sit in the queues like batches)."""
    set_aside = 0
    ready: list[float] = []  # fetches that took a waiting batch
    waited = 0  # fetches in a row that had to wait
    epoch = loop.epochs()
    for _ in range(fill):
        if loop.epochs() != epoch:
            break
        known = loop.ready()
        if known is not None:
            if known == 0:
                break
            loop.fetch()
            set_aside += 1
            continue
        tw, device0 = time.perf_counter(), loop.device_wait()
        loop.fetch()
        took = time.perf_counter() - tw - (loop.device_wait() - device0)  # the loader's share of the wait
        set_aside += 1
        if took > max(READY_FETCH_S, 3 * (statistics.median(ready) if ready else 0.0)):
            waited += 1
            if waited == 2:  # two in a row: the queue is empty (one alone may be the process losing its core)
                break
        else:
            ready.append(took)
            waited = 0
    return set_aside


def _warm_up_steps(loop: _Loop, knobs: Knobs, cfg: Config) -> int:
    """The warm-up steps, for at most trial.window_s once the fewest are done (a step of seconds, e.g. PyTorch's
    defaults decoding a large batch in the main process, has nothing left to warm; what still settles shows in the
    first windows): at least 3 when compiling (reduce-overhead records its CUDA graphs on the second and third
    calls), else at least one. The trained micro-batches, the first included, make whole optimizer steps; returns
    their count."""
    steps = max(cfg.trial.warmup_steps, 3) if knobs.compile != "none" else cfg.trial.warmup_steps
    fewest = min(steps, 3 if knobs.compile != "none" else 1)
    accum = knobs.grad_accum
    for _ in range(accum - 1):  # the rest of the first micro-batch's optimizer step
        loop.work(loop.fetch())
    trained, t_steps = accum, time.perf_counter()
    for done in range(steps):
        # every rank trains the same steps: they agree when to stop
        if done >= fewest and loop.agree(time.perf_counter() - t_steps >= cfg.trial.window_s):
            break
        for _ in range(accum):
            loop.work(loop.fetch())
        trained += accum
    return trained


def _device_memory(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {
        "device_mem_total_bytes": total,
        "device_mem_peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "device_mem_peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
    }


def _cpu_name() -> str:
    from tunekit.env import cpu_model

    return f"CPU: {cpu_model() or platform.machine()}"


def _versions() -> dict[str, Any]:
    import torchvision

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tunekit": __version__,
    }


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0


def _summarise(windows: list[_Window], cpus: int, workers: int) -> dict[str, Any]:
    rates = [w.samples_per_s for w in windows]
    rate = rules.window_rate([w.samples for w in windows], [w.wall_s for w in windows])
    cv = _cv(rates)
    wall = sum(w.wall_s for w in windows)
    steps = sum(w.steps for w in windows)
    samples = sum(w.samples for w in windows)
    cpu_s = sum(w.cpu.main_s + w.cpu.workers_s for w in windows)
    worker_cpu_s = sum(w.cpu.workers_s for w in windows)
    busy = None if windows[0].busy_s is None else sum(w.busy_s or 0.0 for w in windows) / wall
    return {
        "samples_per_s": rate,
        "samples_per_s_windows": rates,
        "seconds_windows": [w.wall_s for w in windows],
        "steps_windows": [w.steps for w in windows],
        "noise_cv": cv,
        "noise_range": (max(rates) - min(rates)) / rate if rate else 0.0,
        "step_time_s": wall / steps,
        "sample_time_s": wall / samples,
        "measured_s": wall,
        "measured_steps": steps,
        "measured_samples": samples,
        "items_per_batch_mean": samples / sum(w.micro_batches for w in windows),
        # how much the batches' content varied from window to window (0 when every batch counts the same): with
        # variable-length batches part of the window noise is the data's, not the machine's
        "items_per_batch_cv": _cv([w.samples / w.micro_batches for w in windows]),
        "data_wait_frac": sum(w.data_wait_s for w in windows) / wall,
        "device_input_wait_frac": sum(w.device_wait_s for w in windows) / wall,
        "gpu_busy_frac": None if busy is None else min(1.0, busy),
        "cpu_util_cores": cpu_s / wall,
        "cpu_util_frac": cpu_s / wall / cpus,
        "system_cpu_pct": statistics.fmean(w.cpu.system_pct for w in windows),
        # What the loader workers did per sample: CPU time against the wall time a worker spends per sample it
        # delivers. Decoding workers use most of that time; workers that wait on storage use little of it.
        "worker_cpu_s": worker_cpu_s if workers else None,
        "worker_cpu_per_sample_s": worker_cpu_s / samples if workers else None,
        "worker_wall_per_sample_s": workers * wall / samples if workers else None,
    }


@dataclass
class _Setup:
    """A trial's workload, ready to measure, and what building it cost."""

    cfg: Config
    device: torch.device
    built: Built
    loader_knobs: Knobs
    loader: Any
    startup_s: float
    cuda_init_s: float
    ranks: _dist.Ranks | None
    loader_s: float = 0.0
    """Making the DataLoader (its workers start with its iterator, in the loop's set-up)."""


def _set_up(spec: TrialSpec) -> _Setup:
    # Interpreter start plus imports (torch above all), or the fork from the fork server: part of every trial's
    # cost, outside its measurement; counted from the launcher's clock (a process's create time can be off by a
    # second in containers).
    started = os.environ.get("TUNEKIT_STARTED_AT")
    startup_s = max(0.0, time.time() - (float(started) if started else psutil.Process().create_time()))
    cfg = _trial_config(spec)
    torch.manual_seed(0)
    t_init = time.perf_counter()
    ranks, device_name = None, cfg.device
    if _dist.launched():  # one rank of several: its own GPU, in the trial's process group
        ranks, device_name = _dist.init(cfg.device, cfg.launch.backend, cfg.trial.timeout_s)
    device = pick_device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # creates the context now, so build_s holds only the workload
    cuda_init_s = time.perf_counter() - t_init
    built = build(cfg, spec.knobs, device, distributed=ranks is not None and spec.mode == "train")
    if spec.knobs.threads is not None:  # after the build: the knob has the last word over the workload's own
        torch.set_num_threads(spec.knobs.threads)
    # The compute ceiling stages one batch on the device: no loader workers may compete with the model.
    knobs = replace(spec.knobs, num_workers=0) if spec.mode == "compute" else spec.knobs
    t_loader = time.perf_counter()
    loader = make_loader(built.dataset, knobs, device, cfg, None if ranks is None else (ranks.rank, ranks.world))
    return _Setup(cfg, device, built, knobs, loader, startup_s, cuda_init_s, ranks, time.perf_counter() - t_loader)


def _trial_config(spec: TrialSpec) -> Config:
    """The config this trial runs: every user-defined knob (search.extra) set, at the trial's value or its
    baseline."""
    cfg = from_dict(spec.config, check_imports=False)
    knobs = extra_knobs(cfg)
    if not knobs:
        return cfg
    raw = copy.deepcopy(spec.config)
    chosen = dict(spec.knobs.extra)
    for knob in knobs:
        set_dotted(raw, knob.key, chosen.get(knob.key, knob.baseline))
    return from_dict(raw, check_imports=False)


@dataclass
class _Measured:
    warm: dict[str, Any]
    windows: list[_Window]
    warmup_memory: dict[str, Any]
    memory: dict[str, Any]
    epochs_ended: int
    warnings: list[str]
    sync_share: float | None = None
    stop: dict[str, Any] | None = None
    """Why measuring stopped, and the leading windows left out as still settling."""
    loop_s: float = 0.0
    """From here to the warm-up: the loader's iterator started (its workers forked) and the loop set up (a compute
    trial stages its batch on the device)."""
    windows_end: float = 0.0
    """time.perf_counter() when the last window ended; the rest of the trial is teardown (with a multi-rank DDP
    trial's gradient-sync probe, :func:`_sync_share`)."""


def _measure_windows(spec: TrialSpec, setup: _Setup, monitor: Monitor) -> _Measured:
    """Warm up, then the timed windows."""
    t_loop = time.perf_counter()
    cfg, device = setup.cfg, setup.device
    cpu = TreeCpu()
    workers = setup.loader_knobs.num_workers
    iterable = isinstance(setup.built.dataset, IterableDataset)
    ranks = setup.ranks
    # ranks that shard their data themselves (a stream, their own sampler or loader) must not all read the same
    self_sharded = ranks is not None and (iterable or bool(cfg.workload.sampler or cfg.workload.loader))
    batches = _Batches(setup.loader, workers if iterable and workers >= 2 and spec.mode != "compute" else 0,
                       check_ranks=self_sharded)
    loop: _Loop | None = None
    try:
        loop = _train_loop(setup.built, spec, cfg, batches)
        if ranks is not None:
            loop.agree, loop.agree_max = ranks.any, ranks.max
        loop_s = time.perf_counter() - t_loop
        warm = _warm_up(loop, spec, cfg, device)
        if self_sharded:
            _check_rank_shards(ranks, batches)
        warmup_peak = _device_memory(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            getattr(torch.cuda, "reset_peak_host_memory_stats", lambda: None)()
        monitor.measuring = True  # no work between warm-up and the first window: the loader would refill
        needed = spec.needed / spec.knobs.ranks if spec.needed is not None else None  # each rank's share
        windows, stop = _windows(loop, cfg, device, spec.knobs.grad_accum, max(1, workers), cpu, needed)
        windows_end = time.perf_counter()
        warm["warmup_s"] += stop["settling_s"]  # windows left out as still settling were warm-up after all
        monitor.sample_now()
        monitor.measuring = False
        memory = _device_memory(device)
        share = _sync_share(loop, setup, ranks) if ranks is not None and setup.built.ddp is not None else None
        return _Measured(warm, windows, warmup_peak, memory, batches.epochs_ended, batches.warnings, share, stop,
                         loop_s, windows_end)
    finally:
        # Stop the loader workers now: the closures in `loop` (and a traceback) would keep them alive.
        if loop is not None:
            loop.close()
        batches.close()


def _windows(loop: _Loop, cfg: Config, device: torch.device, accum: int, round_batches: int, cpu: TreeCpu,
             needed: float | None) -> tuple[list[_Window], dict[str, Any]]:
    """The measured windows: trial.measure_windows of them, or, with trial.precision, until the settled windows'
    confidence interval is that tight or lies wholly below ``needed`` (this rank's share of the rate the trial needs
    to matter; rules.window_stop). Leading windows still settling are left out; the ranks of a multi-rank trial
    agree on both (their windows are summed one by one)."""
    t = cfg.trial
    windows: list[_Window] = []
    while True:
        windows.append(_run_window(loop, device, t.window_s, accum, round_batches, cpu))
        reason = rules.window_stop([w.samples for w in windows], [w.wall_s for w in windows], t.measure_windows,
                                   t.max_windows, t.precision, needed)
        if not loop.agree(reason is None):
            break
    rates = [w.samples_per_s for w in windows]
    drop = loop.agree_max(rules.settling(rates, t.measure_windows, t.precision) if t.precision is not None else 0)
    kept = windows[drop:]
    return kept, {"stop_reason": reason, "windows_measured": len(windows),
                  "settling_windows": rates[:drop], "settling_s": sum(w.wall_s for w in windows[:drop]),
                  "rate_interval": rules.rate_interval([w.samples for w in kept], [w.wall_s for w in kept])}


def _check_rank_shards(ranks: _dist.Ranks, batches: _Batches) -> None:
    prints = ranks.gather(batches.first)
    if len(set(prints)) < len(prints):
        batches.warnings.append(
            "the ranks' first batches are identical: every rank reads the same samples (shard the data by "
            "torch.distributed.get_rank(), e.g. with a DistributedSampler), so the global throughput counts each "
            "sample once per rank")


def _sync_share(loop: _Loop, setup: _Setup, ranks: _dist.Ranks) -> float:
    """The share of a training step spent on gradient synchronisation that computation does not hide: the same
    optimizer steps on one batch already on the device, timed with DDP's all-reduce and under ``no_sync``."""
    staged = to_device(loop.fetch(), setup.built.ctx, non_blocking=False)
    micro = _dist.SYNC_PROBE_STEPS * setup.built.ctx.grad_accum

    def timed(sync: bool) -> float:
        ranks.barrier()
        _sync(setup.device)
        t0 = time.perf_counter()
        with contextlib.nullcontext() if sync else setup.built.ddp.no_sync():
            for _ in range(micro):
                loop.work(staged)
        _sync(setup.device)
        return time.perf_counter() - t0

    timed(sync=False)  # the first steps on a staged batch (no copies in flight) settle the allocator
    with_sync, without = timed(sync=True), timed(sync=False)
    return max(0.0, 1.0 - without / with_sync) if with_sync > 0 else 0.0


def measure(spec: TrialSpec) -> dict[str, Any] | None:
    """Run one trial in this process and return its measurement (status ok). Errors propagate to the caller.
    A rank of a multi-rank trial returns the merged measurement of every rank on rank 0, and None elsewhere."""
    t_start = time.perf_counter()
    setup = _set_up(spec)
    device, ranks = setup.device, setup.ranks
    node_root = os.getppid() if ranks is not None and ranks.local_rank == 0 else None  # torchrun: the node's tree
    forked_from = int(os.environ.get("TUNEKIT_FORKED_FROM") or 0) or None  # the fork server, when it forked us
    monitor = Monitor(_nvml_sampler(device), node_root=node_root, forked_from=forked_from).start()
    try:
        got = _measure_windows(spec, setup, monitor)
    finally:
        monitor.stop()
    out = _result(spec, setup, got, monitor, t_start, time.perf_counter())
    if ranks is None:
        return out
    out.update(host=_dist.host(), rank=ranks.rank, local_rank=ranks.local_rank, world=ranks.world,
               backend=ranks.backend, node_mem_peak_bytes=monitor.node_pss_peak or None,
               node_processes=monitor.node_processes or None)
    results = ranks.gather(out)
    ranks.close()
    return _dist.merge(results) if ranks.rank == 0 else None


def _result(spec: TrialSpec, setup: _Setup, got: _Measured, monitor: Monitor, t_start: float,
            t_done: float) -> dict[str, Any]:
    """This process's measurement.json: the windows' figures, warm-up and start-up apart, host, device, NVML; the
    trial's parts from ``t_start`` (set-up) to ``t_done`` (the teardown's end)."""
    cpus, built, device = cpu_count(), setup.built, setup.device
    warm = got.warm
    result = _summarise(got.windows, cpus, setup.loader_knobs.num_workers)
    out: dict[str, Any] = {
        "status": "ok",
        "reason": "",
        "number": spec.number,
        "stage": spec.stage,
        "mode": spec.mode,
        "params": {**spec.knobs.to_dict(), "non_blocking": spec.knobs.non_blocking},
        # the user-defined knobs set away from their baseline that may change what training learns
        "changes_result": sorted(k.key for k in extra_knobs(setup.cfg)
                                 if k.changes_result and k.key in dict(spec.knobs.extra)),
        **result,
        **warm,
        "startup_s": setup.startup_s,
        "cuda_init_s": setup.cuda_init_s,
        "build_s": built.build_s,
        "loop_setup_s": setup.loader_s + got.loop_s,
        "teardown_s": t_done - got.windows_end,
        "trial_s": t_done - t_start,
        "unit": setup.cfg.workload.unit,
        "epoch_boundary_in_trial": got.epochs_ended > 0,
        "epochs_ended": got.epochs_ended,
        "warnings": got.warnings,
        **_dataset_fields(built, spec, warm["warmup_batches"] + result["measured_steps"] * spec.knobs.grad_accum),
        **_host_fields(monitor),
        "cpu_count": cpus,
        "torch_threads": torch.get_num_threads(),
        **_device_fields(device),
        "versions": _versions(),
    }
    out.update(_memory_fields(got.memory, got.warmup_memory, out))
    out.update(_nvml_fields(monitor))
    out.update(sync_share=got.sync_share, pinned_peak_bytes=_pinned_peak(device), **(got.stop or {}))
    return out


def _pinned_peak(device: torch.device) -> int | None:
    """Peak bytes held by the pinned-memory host allocator since warm-up (the pin-memory thread's buffers)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if device.type != "cuda" or stats is None:
        return None
    try:
        return int(stats().get("allocated_bytes.peak", 0)) or None
    except RuntimeError:
        return None


def _dataset_fields(built: Built, spec: TrialSpec, consumed: int) -> dict[str, Any]:
    """The dataset's length and the passes over it the trial made (None for a dataset without a length), and
    whether each measured step moved its batch with the dataset's own ``batch_to_device``."""
    # a dataset that moves its batches itself (decode: gpu) does input work on the device inside each step, or one
    # batch ahead beside it (decode: gpu-overlap)
    on_device = spec.mode == "train" and hasattr(built.dataset, "batch_to_device")
    ahead = on_device and _moves_ahead(built, spec)
    try:
        length = len(built.dataset)  # type: ignore[arg-type]
    except TypeError:
        return {"dataset_len": None, "dataset_passes": None, "input_on_device": on_device, "input_ahead": ahead}
    batches = consumed if spec.mode != "compute" else 1
    return {"dataset_len": length, "dataset_passes": batches * spec.knobs.batch_size / length if length else None,
            "input_on_device": on_device, "input_ahead": ahead}


def _host_fields(monitor: Monitor) -> dict[str, Any]:
    return {
        "host_mem_peak_bytes": monitor.host_pss_peak_measured or monitor.host_pss_peak,
        "host_mem_peak_trial_bytes": monitor.host_pss_peak,
        "host_mem_rss_sum_peak_bytes": monitor.host_rss_peak,
        "host_mem_total_bytes": psutil.virtual_memory().total,
        "host_processes": monitor.max_processes,
    }


def _device_fields(device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    return {
        "device": str(device),
        "device_uuid": str(torch.cuda.get_device_properties(device).uuid) if cuda else None,
        "device_name": torch.cuda.get_device_name(device) if cuda else _cpu_name(),
    }


def _nvml_fields(monitor: Monitor) -> dict[str, Any]:
    nvml = monitor.nvml_summary()
    return {
        "nvml": nvml,
        "nvml_util_gpu_pct": nvml.get("utilization_gpu_pct", {}).get("mean") if nvml else None,
        "nvml_mem_used_peak_bytes": nvml.get("memory_used_bytes", {}).get("max") if nvml else None,
    }


def _memory_fields(memory: dict[str, Any], warmup: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    if not memory:  # CPU: the memory that can run out is the host's
        return {
            "device_mem_total_bytes": None,
            "device_mem_peak_allocated_bytes": None,
            "device_mem_peak_reserved_bytes": None,
            "device_mem_warmup_peak_reserved_bytes": None,
            "headroom": 1.0 - out["host_mem_peak_bytes"] / out["host_mem_total_bytes"],
            "headroom_basis": "host",
        }
    return {
        **memory,
        "device_mem_warmup_peak_reserved_bytes": warmup["device_mem_peak_reserved_bytes"],
        "headroom": 1.0 - memory["device_mem_peak_reserved_bytes"] / memory["device_mem_total_bytes"],
        "headroom_basis": "device",
    }
