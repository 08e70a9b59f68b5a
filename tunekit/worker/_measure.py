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

import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psutil
import torch

from tunekit import __version__
from tunekit.config import Config, cpu_count, from_dict
from tunekit.contract import Knobs, TrialSpec
from tunekit.worker._build import Built, build, make_loader, pick_device, to_device
from tunekit.worker._monitor import CpuUse, Monitor, TreeCpu

__all__ = ["measure", "MIN_WINDOW_STEPS", "Diverged"]

MIN_WINDOW_STEPS = 5
"""A window lasts at least trial.window_s and at least this many optimizer steps: with second-long steps a
window of two or three steps quantises throughput too coarsely to be stable."""


@dataclass
class _Window:
    wall_s: float
    steps: int
    samples: int
    data_wait_s: float
    busy_s: float | None
    cpu: CpuUse

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s


@dataclass
class _Loop:
    """One step of the trial's mode: fetch a batch (timed as data wait), then do the work on it."""

    fetch: Callable[[], Any]
    work: Callable[[Any], None]
    micro: int = 0
    """Micro-batches trained so far; the optimizer steps every grad_accum of them."""
    loss: Any = None
    """The last micro-batch's loss, still on the device: checked at window edges only (no sync per step)."""


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


def _train_loop(built: Built, spec: TrialSpec, loader_iter: Any) -> _Loop:
    knobs, ctx = spec.knobs, built.ctx
    model, optimizer, scaler = built.model, built.optimizer, built.scaler
    staged: list[Any] = []

    if spec.mode == "compute":
        batch = next(loader_iter)
        staged.append(to_device(batch, ctx, non_blocking=False))
        _sync(ctx.device)

        def fetch() -> Any:
            return staged[0]
    else:

        def fetch() -> Any:
            return next(loader_iter)

    def train(batch: Any) -> None:
        if spec.mode != "compute":
            batch = to_device(batch, ctx, non_blocking=knobs.non_blocking)
        with built.autocast():
            loss = built.step_fn(model, batch, ctx)
        loss = loss / knobs.grad_accum
        loop.loss = loss.detach()
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        loop.micro += 1
        if loop.micro % knobs.grad_accum == 0:
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def copy_only(batch: Any) -> None:
        to_device(batch, ctx, non_blocking=knobs.non_blocking)

    loop = _Loop(fetch=fetch, work=copy_only if spec.mode == "loader" else train)
    return loop


def _run_window(loop: _Loop, device: torch.device, window_s: float, batch: int, accum: int, round_batches: int,
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
    steps = 0
    while True:
        for _ in range(accum):
            tw = time.perf_counter()
            item = loop.fetch()
            wait += time.perf_counter() - tw
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                loop.work(item)
                end.record()
                events.append((start, end))
            else:
                loop.work(item)
        steps += 1
        if (time.perf_counter() - t0 >= window_s and steps >= MIN_WINDOW_STEPS
                and (steps * accum) % round_batches == 0):
            break
    _sync(device)
    wall = time.perf_counter() - t0
    used = cpu.end()
    _check_loss(loop)
    busy = sum(s.elapsed_time(e) for s, e in events) / 1000.0 if cuda else None
    return _Window(wall, steps, steps * accum * batch, wait, busy, used)


def _check_loss(loop: _Loop) -> None:
    """Raise :class:`Diverged` when the last loss is not finite (after the window's sync: no extra sync)."""
    if loop.loss is not None and not bool(torch.isfinite(loop.loss).all()):
        raise Diverged(f"the loss is {loop.loss.float().item()} at micro-batch {loop.micro} "
                       "(a NaN or Inf loss: the steps do not train)")


def _warm_up(loop: _Loop, spec: TrialSpec, cfg: Config, device: torch.device) -> dict[str, Any]:
    """Consume the first batch, the pipeline fill and the warm-up steps; time the first step separately."""
    knobs = spec.knobs
    fill = knobs.num_workers * (knobs.prefetch_factor or 2) if spec.mode != "compute" else 0
    t0 = time.perf_counter()
    first = loop.fetch()
    first_wait = time.perf_counter() - t0
    loop.work(first)
    _sync(device)
    first_step_s = time.perf_counter() - t0
    consumed = 1
    # 1. The fill: batches the workers prepared while start-up and the first step ran.
    waits = []
    for _ in range(fill):
        tw = time.perf_counter()
        item = loop.fetch()
        waits.append(time.perf_counter() - tw)
        loop.work(item)
    consumed += fill
    # 2. What the workers made while the fill was eaten: drain until a fetch blocks on an empty queue (steady
    #    state when the loader is the bound), at most another fill's worth (a compute-bound queue stays full).
    blocked = max(0.002, 3 * statistics.median(waits)) if waits else 0.0
    for _ in range(fill):
        tw = time.perf_counter()
        item = loop.fetch()
        waited = time.perf_counter() - tw
        loop.work(item)
        consumed += 1
        if waited > blocked:
            break
    # 3. The configured warm-up steps (at least 3 when compiling: reduce-overhead records its CUDA graphs on the
    #    second and third calls), rounded up to whole optimizer steps.
    steps = max(cfg.trial.warmup_steps, 3) if knobs.compile != "none" else cfg.trial.warmup_steps
    total = consumed + steps * knobs.grad_accum
    total = math.ceil(total / knobs.grad_accum) * knobs.grad_accum
    for _ in range(total - consumed):
        loop.work(loop.fetch())
    _sync(device)
    return {
        "warmup_s": time.perf_counter() - t0,
        "warmup_batches": total,
        "first_batch_wait_s": first_wait,
        "first_step_s": first_step_s,
        "compile_s": (first_step_s - first_wait) if knobs.compile != "none" else 0.0,
    }


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


def _summarise(windows: list[_Window], cpus: int, workers: int) -> dict[str, Any]:
    rates = [w.samples_per_s for w in windows]
    median = statistics.median(rates)
    mean = statistics.fmean(rates)
    cv = statistics.stdev(rates) / mean if len(rates) > 1 and mean > 0 else 0.0
    wall = sum(w.wall_s for w in windows)
    steps = sum(w.steps for w in windows)
    samples = sum(w.samples for w in windows)
    cpu_s = sum(w.cpu.main_s + w.cpu.workers_s for w in windows)
    worker_cpu_s = sum(w.cpu.workers_s for w in windows)
    busy = None if windows[0].busy_s is None else sum(w.busy_s or 0.0 for w in windows) / wall
    return {
        "samples_per_s": median,
        "samples_per_s_windows": rates,
        "steps_windows": [w.steps for w in windows],
        "noise_cv": cv,
        "noise_range": (max(rates) - min(rates)) / median if median else 0.0,
        "step_time_s": wall / steps,
        "sample_time_s": wall / samples,
        "measured_s": wall,
        "measured_steps": steps,
        "measured_samples": samples,
        "data_wait_frac": sum(w.data_wait_s for w in windows) / wall,
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


def _set_up(spec: TrialSpec) -> _Setup:
    # Interpreter start plus imports (torch above all): part of every trial's cost, outside its measurement.
    startup_s = max(0.0, time.time() - psutil.Process().create_time())
    cfg = from_dict(spec.config, check_imports=False)
    torch.manual_seed(0)
    t_init = time.perf_counter()
    device = pick_device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # creates the context now, so build_s holds only the workload
    cuda_init_s = time.perf_counter() - t_init
    built = build(cfg, spec.knobs, device)
    # The compute ceiling stages one batch on the device: no loader workers may compete with the model.
    knobs = replace(spec.knobs, num_workers=0) if spec.mode == "compute" else spec.knobs
    return _Setup(cfg, device, built, knobs, make_loader(built.dataset, knobs, device), startup_s, cuda_init_s)


def _measure_windows(spec: TrialSpec, setup: _Setup, monitor: Monitor) -> tuple[dict[str, Any], list[_Window],
                                                                                 dict[str, Any], dict[str, Any]]:
    """Warm up, then the timed windows: (warm-up figures, windows, device memory at the end of warm-up and of
    the windows)."""
    cfg, device = setup.cfg, setup.device
    cpu = TreeCpu()
    loader_iter = iter(setup.loader)
    try:
        loop = _train_loop(setup.built, spec, loader_iter)
        warm = _warm_up(loop, spec, cfg, device)
        warmup_peak = _device_memory(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        monitor.measuring = True  # no work between warm-up and the first window: the loader would refill
        windows = [
            _run_window(loop, device, cfg.trial.window_s, spec.knobs.batch_size, spec.knobs.grad_accum,
                        max(1, setup.loader_knobs.num_workers), cpu)
            for _ in range(cfg.trial.measure_windows)
        ]
        monitor.sample_now()
        monitor.measuring = False
        return warm, windows, warmup_peak, _device_memory(device)
    finally:
        # Stop the loader workers now: the closures in `loop` (and a traceback) would keep them alive.
        getattr(loader_iter, "_shutdown_workers", lambda: None)()


def measure(spec: TrialSpec) -> dict[str, Any]:
    """Run one trial in this process and return its measurement (status ok). Errors propagate to the caller."""
    t_start = time.perf_counter()
    setup = _set_up(spec)
    device, built = setup.device, setup.built
    monitor = Monitor(_nvml_sampler(device)).start()
    try:
        warm, windows, warmup_peak, memory = _measure_windows(spec, setup, monitor)
    finally:
        monitor.stop()
    cpus = cpu_count()
    result = _summarise(windows, cpus, setup.loader_knobs.num_workers)
    consumed = warm["warmup_batches"] + result["measured_steps"] * spec.knobs.grad_accum
    out: dict[str, Any] = {
        "status": "ok",
        "reason": "",
        "number": spec.number,
        "stage": spec.stage,
        "mode": spec.mode,
        "params": {**spec.knobs.to_dict(), "non_blocking": spec.knobs.non_blocking},
        **result,
        **warm,
        "startup_s": setup.startup_s,
        "cuda_init_s": setup.cuda_init_s,
        "build_s": built.build_s,
        "trial_s": time.perf_counter() - t_start,
        "epoch_boundary_in_trial": False,
        "dataset_len": len(built.dataset),
        "dataset_passes": (consumed if spec.mode != "compute" else 1) * spec.knobs.batch_size
        / len(built.dataset),
        **_host_fields(monitor),
        "cpu_count": cpus,
        **_device_fields(device),
        "versions": _versions(),
    }
    out.update(_memory_fields(memory, warmup_peak, out))
    out.update(_nvml_fields(monitor))
    return out


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
