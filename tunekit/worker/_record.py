"""This process's measurement.json: the meter's figures with the trial's identity, set-up, host, device and NVML
figures (docs/measurement.md)."""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from tunekit import __version__, rules
from tunekit.config import cpu_count, extra_knobs
from tunekit.contract import Measurement, TrialSpec
from tunekit.worker._modes import TrialMode
from tunekit.worker.factory._setup import Setup
from tunekit.worker.factory._step import moves_ahead
from tunekit.worker.meter import Reading
from tunekit.worker.meter._monitor import Monitor

__all__ = ["Observed", "measurement", "assemble", "device_memory", "reset_peaks"]


@dataclass
class Observed:
    """What a trial's loop saw, in either mode: the meter's reading and what was read beside it."""

    reading: Reading
    warmup_memory: dict[str, Any] = field(default_factory=dict)
    """The device's memory peaks at the warm-up's end (``reset_peaks``)."""
    memory: dict[str, Any] = field(default_factory=dict)
    """The device's memory peaks over the windows (``device_memory``); {} off CUDA."""
    epochs_ended: int = 0
    warnings: list[str] = field(default_factory=list)
    """The loader's warnings."""
    sync_share: float | None = None
    """A multi-rank trial's share of the step spent on gradient sync (factory mode only)."""


def measurement(
    spec: TrialSpec, setup: Setup, seen: Observed, monitor: Monitor, times: dict[str, float]
) -> Measurement:
    """The measurement of an ok trial of the built-in step. ``times`` holds ``loop_setup_s``, ``teardown_s`` and
    ``trial_s``."""
    built = setup.built
    on_device = setup.mode.end_to_end and hasattr(built.dataset, "batch_to_device")
    out = assemble(
        spec,
        setup.mode,
        seen,
        monitor,
        device=setup.device,
        dataset=built.dataset,
        workers=setup.loader_knobs.num_workers,
        unit=setup.cfg.workload.unit,
        times={"startup_s": setup.startup_s, "cuda_init_s": setup.cuda_init_s, "build_s": built.build_s, **times},
    )
    # a dataset that moves its batches itself (decode: gpu) does input work on the device inside each step, or one
    # batch ahead beside it (decode: gpu-overlap)
    return dataclasses.replace(
        out,
        input_on_device=on_device,
        input_ahead=on_device and moves_ahead(built, setup.mode),
        # the user-defined knobs set away from their baseline that may change what training learns
        changes_result=sorted(
            k.key for k in extra_knobs(setup.cfg) if k.changes_result and k.key in dict(spec.knobs.extra)
        ),
    )


def assemble(
    spec: TrialSpec,
    mode: TrialMode,
    seen: Observed,
    monitor: Monitor,
    *,
    device: torch.device,
    dataset: Any,
    workers: int,
    unit: str,
    times: dict[str, float],
    params: dict[str, Any] | None = None,
) -> Measurement:
    """The measurement of an ok trial around any step: the meter's reading with the trial's identity, the host,
    device, memory and NVML figures, as the typed record (a field it does not define fails here, in every trial).
    ``params`` are the knobs as run (default: the spec's)."""
    cpus = cpu_count()
    metered = seen.reading.fields(cpus, workers, spec.knobs.compile != "none")
    consumed = metered["warmup_batches"] + metered["measured_steps"] * spec.knobs.grad_accum
    out: dict[str, Any] = {
        **_identity(spec, params),
        **metered,
        **times,
        "unit": unit,
        "epoch_boundary_in_trial": seen.epochs_ended > 0,
        "epochs_ended": seen.epochs_ended,
        **_dataset_fields(dataset, spec, mode, consumed),
        "input_on_device": False,
        "input_ahead": False,
        **_host_fields(monitor),
        "cpu_count": cpus,
        "torch_threads": torch.get_num_threads(),
        **_device_fields(device),
        "versions": _versions(),
    }
    out["warnings"] = [*seen.warnings, *_disturbed(out.get("other_cpu_cores"), cpus)]
    out.update(_memory_fields(seen.memory, seen.warmup_memory, out))
    out.update(_nvml_fields(monitor))
    out.update(sync_share=seen.sync_share, pinned_peak_bytes=_pinned_peak(device))
    return Measurement(**out)


def _identity(spec: TrialSpec, params: dict[str, Any] | None) -> dict[str, Any]:
    """An ok trial's identity: its number, stage, mode and run, and the knobs it ran with."""
    return {
        "status": "ok",
        "reason": "",
        "number": spec.number,
        "stage": spec.stage,
        "mode": spec.mode,
        "run": spec.run,
        "params": params or {**spec.knobs.to_dict(), "non_blocking": spec.knobs.non_blocking},
        "changes_result": [],
    }


def _disturbed(other: float | None, cpus: int) -> list[str]:
    """The warning of a trial whose windows other processes kept the CPUs busy in (named per trial, not hidden
    in the noise)."""
    if other is None or other <= rules.BUSY_HOST * cpus:
        return []
    return [
        f"other processes kept {other:.1f} of the {cpus} usable CPUs busy during the windows: this trial's "
        "figures are disturbed"
    ]


def reset_peaks(device: torch.device) -> dict[str, Any]:
    """At the warm-up's end (both modes): its device memory peaks, then the device's and the pinned host memory's
    peak counters afresh, so the measurement's peaks are the windows'."""
    warmup = device_memory(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        getattr(torch.cuda, "reset_peak_host_memory_stats", lambda: None)()
    return warmup


def device_memory(device: torch.device) -> dict[str, Any]:
    """The caching allocator's peaks and the device's total memory; {} off CUDA."""
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


def _pinned_peak(device: torch.device) -> int | None:
    """Peak bytes held by the pinned-memory host allocator since warm-up (the pin-memory thread's buffers)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if device.type != "cuda" or stats is None:
        return None
    try:
        return int(stats().get("allocated_bytes.peak", 0)) or None
    except RuntimeError:
        return None


def _dataset_fields(dataset: Any, spec: TrialSpec, mode: TrialMode, consumed: int) -> dict[str, Any]:
    """The dataset's length and the passes over it the trial made (None for a dataset without a length)."""
    try:
        length = len(dataset)
    except TypeError:
        return {"dataset_len": None, "dataset_passes": None}
    passes = mode.batches_read(consumed) * spec.knobs.batch_size / length if length else None
    return {"dataset_len": length, "dataset_passes": passes}


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
