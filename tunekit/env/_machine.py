"""The machine a recommendation was tuned on, as recommended.yaml records it and ``tunekit check`` compares it:
its hardware (the device a trial ran on, the GPUs, the CPU model and usable count, the host memory) and its
software (torch, its CUDA build, the driver, Python). ``rules.machine_changes`` says which differences make another
machine.

Built from the environment snapshot (``snapshot()``: no torch) and, where a trial ran, the facts its measurement
recorded; the two sides of a comparison take each fact from the same source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["machine_fingerprint", "describe_machine"]


def machine_fingerprint(
    snapshot: Mapping[str, Any] | None,
    *,
    device: str | None = None,
    cpus: int | None = None,
    memory_bytes: int | None = None,
    versions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The machine's fingerprint: ``device`` (the trial's, e.g. ``NVIDIA H200`` or ``CPU: AMD EPYC``), ``gpu``
    (the GPU model, several joined), ``gpus`` (how many NVML sees; 0 without NVML), ``cpu`` (the CPU model),
    ``cpus`` (usable), ``memory_bytes`` (host RAM), ``torch``, ``cuda`` (torch's CUDA build), ``driver``,
    ``python``. A fact not known is None (never compared).

    Args:
        snapshot: an environment snapshot (``env.snapshot()``, a run's env.json), or None.
        device, cpus, memory_bytes, versions: a trial's ``device_name``, ``cpu_count``, ``host_mem_total_bytes``
            and ``versions``; the snapshot's own figures stand in for the CPUs and the memory. The versions come
            only from a trial (the snapshot names torch without its build suffix).
    """
    snap = snapshot or {}
    nvml = snap.get("nvml") or {}
    names = [str(g.get("name")) for g in snap.get("gpus") or [] if g.get("name")]
    cpu = snap.get("cpu") or {}
    versions = versions or {}
    return {
        "device": device,
        "gpu": ", ".join(sorted(set(names))) or None,
        "gpus": len(names) if snap else None,
        "cpu": cpu.get("model"),
        "cpus": cpus if cpus is not None else cpu.get("usable", cpu.get("affinity")),
        "memory_bytes": memory_bytes if memory_bytes is not None else (snap.get("memory") or {}).get("total_bytes"),
        "torch": versions.get("torch"),
        "cuda": versions.get("cuda"),
        "driver": nvml.get("driver_version"),
        "python": versions.get("python"),
    }


def describe_machine(fp: Mapping[str, Any]) -> str:
    """A fingerprint in a few words: ``1x NVIDIA H200, 16 CPUs (Intel Xeon), 125.9 GiB``."""
    parts = []
    if fp.get("gpus"):
        parts.append(f"{fp['gpus']}x {fp.get('gpu') or 'GPU'}")
    elif fp.get("gpus") == 0:
        parts.append("no GPU")
    elif fp.get("device"):
        parts.append(str(fp["device"]))
    if fp.get("cpus") is not None:
        parts.append(f"{fp['cpus']} CPUs" + (f" ({fp['cpu']})" if fp.get("cpu") else ""))
    elif fp.get("cpu"):
        parts.append(str(fp["cpu"]))
    if fp.get("memory_bytes"):
        parts.append(f"{fp['memory_bytes'] / 2**30:.1f} GiB")
    return ", ".join(parts) or "an unrecorded machine"
