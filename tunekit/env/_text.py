"""The environment snapshot as aligned text (``tunekit env``)."""

from __future__ import annotations

from typing import Any

_GIB = 1024**3


def _gib(value: Any) -> str:
    """Format a byte count as GiB with one decimal, or ``?``."""
    return f"{value / _GIB:.1f} GiB" if value is not None else "?"


def _q(value: Any, unit: str = "") -> str:
    """Format a possibly missing value with an optional unit suffix."""
    return f"{value}{unit}" if value is not None else "?"


def _lines(pairs: list[tuple[str, str]], indent: str = "") -> list[str]:
    """Render ``(key, value)`` pairs as aligned ``key: value`` lines."""
    width = max((len(key) for key, _ in pairs), default=0)
    return [f"{indent}{key.ljust(width)} : {value}" for key, value in pairs]


def _packages_text(snap: dict[str, Any]) -> str:
    """Render the package versions as one line, with torch's CUDA build next to torch."""
    packages = snap.get("packages") or {}
    parts = []
    for name, version in packages.items():
        text = f"{name} {version or '-'}"
        if name == "torch" and version:
            text += f" (CUDA {snap.get('torch_cuda_build') or 'none'})"
        parts.append(text)
    return ", ".join(parts)


def _host_pairs(snap: dict[str, Any]) -> list[tuple[str, str]]:
    """Return the key/value pairs describing software and host."""
    cpu, mem, shm = snap.get("cpu") or {}, snap.get("memory") or {}, snap.get("shm")
    cpu_text = (
        f"{_q(cpu.get('logical'))} logical, {_q(cpu.get('physical'))} physical, "
        f"{_q(_usable(cpu))} usable{_limited(cpu)} ({cpu.get('model') or 'unknown model'})"
    )
    shm_text = f"{_gib(shm.get('free_bytes'))} free of {_gib(shm.get('total_bytes'))}" if shm else "missing"
    return [
        ("tunekit", f"{_q(snap.get('tunekit'))} ({_q(snap.get('date'))})"),
        ("host", f"{_q(snap.get('hostname'))} ({_q(snap.get('platform'))})"),
        ("python", _q(snap.get("python"))),
        ("packages", _packages_text(snap)),
        ("CPU", cpu_text),
        ("memory", f"{_gib(mem.get('available_bytes'))} available of {_gib(mem.get('total_bytes'))}"),
        ("/dev/shm", shm_text),
    ]


def _nvml_text(nvml: dict[str, Any]) -> str:
    """Render the NVML driver line."""
    if not nvml.get("available"):
        return f"not available ({nvml.get('error') or 'unknown error'})"
    return f"driver {_q(nvml.get('driver_version'))}, CUDA driver API {_q(nvml.get('cuda_driver_version'))}"


def _processes_text(procs: list[dict[str, Any]] | None) -> str:
    """Render a device's process list on one line."""
    if procs is None:
        return "?"
    if not procs:
        return "none"
    return ", ".join(f"{p['pid']} {p.get('name') or '?'} {_gib(p.get('used_bytes'))}" for p in procs)


def _gpu_lines(gpu: dict[str, Any]) -> list[str]:
    """Render one block of lines for one device."""
    mem, clk, pwr = gpu.get("memory") or {}, gpu.get("clocks") or {}, gpu.get("power") or {}
    util, pcie = gpu.get("utilization") or {}, gpu.get("pcie") or {}
    reasons = gpu.get("throttle_reasons")
    pairs = [
        ("memory", f"{_gib(mem.get('used_bytes'))} used of {_gib(mem.get('total_bytes'))}"),
        (
            "clocks",
            f"SM {_q(clk.get('sm_mhz'))}/{_q(clk.get('sm_max_mhz'))} MHz, "
            f"mem {_q(clk.get('mem_mhz'))}/{_q(clk.get('mem_max_mhz'))} MHz",
        ),
        (
            "temp/power",
            f"{_q(gpu.get('temperature_c'), ' C')}, {_q(pwr.get('draw_w'))}/{_q(pwr.get('limit_w'))} W",
        ),
        ("utilization", f"GPU {_q(util.get('gpu_pct'), '%')}, memory {_q(util.get('mem_pct'), '%')}"),
        ("clock events", "?" if reasons is None else (", ".join(reasons) or "none")),
        (
            "PCIe",
            f"gen {_q(pcie.get('gen'))}/{_q(pcie.get('gen_max'))}, "
            f"x{_q(pcie.get('width'))}/x{_q(pcie.get('width_max'))}",
        ),
        ("processes", _processes_text(gpu.get("processes"))),
    ]
    header = f"GPU {gpu.get('index')}: {gpu.get('name') or '?'} ({gpu.get('uuid') or '?'})"
    return [header, *_lines(pairs, indent="  ")]


def format_text(snap: dict[str, Any]) -> str:
    """Render a :func:`snapshot` dict as a compact human-readable summary.

    Args:
        snap: the dict returned by :func:`snapshot` (or loaded back from JSON).

    Returns:
        Aligned ``key: value`` lines, sizes in GiB, then one block per GPU; no trailing newline.
    """
    lines = _lines([*_host_pairs(snap), ("NVML", _nvml_text(snap.get("nvml") or {}))])
    for gpu in snap.get("gpus") or []:
        lines.extend(_gpu_lines(gpu))
    return "\n".join(lines)


def _usable(cpu: dict[str, Any]) -> Any:
    return cpu.get("usable", cpu.get("affinity"))


def _limited(cpu: dict[str, Any]) -> str:
    """ ", limited by its CFS quota (16 CPUs of affinity)" when something under the affinity set the usable count."""
    limits, by = cpu.get("limits") or {}, cpu.get("limited_by")
    if not by or by == "affinity" or by not in limits:
        return ""
    what = {"cgroup_quota": "its cgroup's CFS quota"}.get(by, by)
    return f", limited by {what} ({limits.get('affinity')} CPUs of affinity)"
