"""Plain-language warnings about the machine a sweep runs on, before it starts and after it ends."""

from __future__ import annotations

import os
from typing import Any

from tunekit import rules
from tunekit.config import Config
from tunekit.records import TrialRow


def environment_warnings(
    env: dict[str, Any], *, max_workers: int = 0, batch_bytes: int | None = None, prefetch: int = 2, ranks: int = 1
) -> list[str]:
    """Warnings from an env snapshot: CPUs, /dev/shm, driver, and each GPU's processes, clocks, heat and link.
    ``ranks``: the ranks on this node, each with its own loader's workers (they share the node's CPUs and shm)."""
    out: list[str] = []
    cpu = env.get("cpu") or {}
    cpus = cpu.get("usable") or cpu.get("affinity") or cpu.get("logical") or 0
    workers = max_workers * max(1, ranks)
    if max_workers and cpus and workers > cpus:
        across = f" per rank, {workers} across this node's {ranks} ranks," if ranks > 1 else ","
        out.append(
            f"search.num_workers goes up to {max_workers}{across} above the {cpus} usable CPUs: workers "
            "beyond the core count compete for them when they compute (decoding, augmenting); workers that "
            "wait on storage do not, and the diagnosis tells which"
        )
    shm = env.get("shm") or {}
    if batch_bytes and max_workers and shm.get("total_bytes"):
        need = workers * prefetch * batch_bytes
        if need > rules.SHM_WARN * shm["total_bytes"]:
            out.append(
                f"/dev/shm holds {_size(shm['total_bytes'])} but {workers} workers x prefetch {prefetch} x "
                f"{_size(batch_bytes)} batches need about {_size(need)}: enlarge it (docker run --shm-size) "
                "or lower num_workers x prefetch_factor x batch"
            )
    build, driver = env.get("torch_cuda_build"), (env.get("nvml") or {}).get("cuda_driver_version")
    if build and driver and _version(build) > _version(driver):
        out.append(f"torch is built for CUDA {build} but the driver supports CUDA {driver}: update the driver")
    for gpu in env.get("gpus") or []:
        out.extend(_gpu_warnings(gpu))
    return out


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _gpu_warnings(gpu: dict[str, Any]) -> list[str]:
    out = []
    name = f"GPU {gpu.get('index')} ({gpu.get('name')})"
    procs = gpu.get("processes") or []
    if procs:
        listed = ", ".join(f"{p.get('name') or '?'} (pid {p.get('pid')})" for p in procs[:3])
        out.append(f"{name} has {len(procs)} other process(es): {listed}; they share its time and memory")
    reasons = sorted(set(gpu.get("throttle_reasons") or []) - rules.BENIGN_THROTTLE)
    if reasons:
        out.append(f"{name} clocks are throttled: {', '.join(reasons)}")
    temp = gpu.get("temperature_c")
    if temp is not None and temp >= rules.HOT_GPU_C:
        out.append(f"{name} is at {temp} C")
    pcie = gpu.get("pcie") or {}
    if pcie.get("width") and pcie.get("width_max") and pcie["width"] < pcie["width_max"]:
        out.append(f"{name} PCIe link runs x{pcie['width']} of x{pcie['width_max']}: host-to-device copies are slower")
    return out


def _busy_before(env: dict[str, Any]) -> list[str]:
    """The machine's load over the last minute, against its usable CPUs (each trial then measures its own)."""
    cpu = env.get("cpu") or {}
    cpus = cpu.get("usable") or cpu.get("affinity") or cpu.get("logical") or 0
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return []
    if cpus and load > max(0.5, rules.BUSY_HOST * cpus):
        return [
            f"the machine is busy before the sweep: a load of {load:.1f} over the last minute on {cpus} usable "
            "CPUs; other processes' work disturbs every figure (each trial says how many cores they took)"
        ]
    return []


def _batch_bytes(cfg: Config, rows: list[TrialRow]) -> int | None:
    """Bytes of the largest searched batch: from the trials' measured batches (bytes per item, at the largest
    batch), else, before any trial, from an image workload's crop (3 x crop² float32 per sample)."""
    largest = max(cfg.search.batch_size)
    measured = [
        r.measurement.batch_bytes / r.knobs.batch_size for r in rows if r.measurement.batch_bytes and r.knobs.batch_size
    ]
    if measured:
        return int(max(measured) * largest)
    crop = cfg.workload.dataset_args.get("crop") if cfg.workload is not None else None
    return 3 * int(crop) ** 2 * 4 * largest if isinstance(crop, int) else None


def sweep_warnings(cfg: Config, env: dict[str, Any], rows: list[TrialRow] | None = None) -> list[str]:
    """The warnings for a sweep of ``cfg`` on this machine; with finished trials, also the host memory they used."""
    s = cfg.search
    batch_bytes = _batch_bytes(cfg, rows or [])
    out = environment_warnings(
        env,
        max_workers=max(s.num_workers),
        batch_bytes=batch_bytes,
        prefetch=max(s.prefetch_factor),
        ranks=cfg.launch.nproc_per_node,
    )
    out += _link_warnings(env, cfg.launch.nproc_per_node)
    if rows is None:  # at the start: a machine already busy says so before the first trial
        out += _busy_before(env)
    for row in rows or []:
        peak, total = row.measurement.host_mem_peak_bytes, row.measurement.host_mem_total_bytes
        if row.ok and peak and total and peak > rules.HOST_MEMORY_WARN * total:
            out.append(
                f"trial {row.number} used {peak / 2**30:.1f} of {total / 2**30:.1f} GiB of host memory "
                f"({row.knobs.num_workers} workers): close to the machine's RAM"
            )
    return out


def _link_warnings(env: dict[str, Any], ranks: int) -> list[str]:
    """Pairs of the GPUs a multi-rank trial uses (the first ``ranks``) whose gradient all-reduce goes over PCIe:
    through a shared switch (the pair shares its bandwidth) or across CPU sockets."""
    out = []
    for pair in ((env.get("nvml") or {}).get("interconnect") or []) if ranks > 1 else []:
        i, j = pair.get("gpus") or (0, 0)
        if i >= ranks or j >= ranks or pair.get("nvlink") or not pair.get("pcie_path"):
            continue
        out.append(
            f"GPUs {i} and {j} have no NVLink between them: their gradient all-reduce goes over PCIe "
            f"({pair['pcie_path']}); expect communication to cost more (nvidia-smi topo -m shows the paths)"
        )
    return out


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(text).split(".")[:2])
    except ValueError:
        return (0,)
