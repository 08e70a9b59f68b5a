"""NVML access shared by the driver's snapshot and the worker's sampler: one import, one initialisation, and
every single query guarded, so a field the driver does not support becomes None instead of failing the caller."""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psutil

# pynvml constant-name prefixes for the clock event ("throttle") reason bits, newest first.
_REASON_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")
# Suffixes that are not single reasons: masks, or deprecated aliases of another bit.
_REASON_SKIP = frozenset({"None", "All", "UserDefinedClocks"})
# Newer name first; the "Throttle" one is deprecated and goes away with CUDA 14.
_REASON_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_CAMEL_BOUNDARY = re.compile(r"(?<!^)(?=[A-Z])")


def _import_pynvml() -> tuple[ModuleType | None, str | None]:
    """Import pynvml, returning ``(module, None)`` or ``(None, error message)``."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"pynvml not importable: {exc}"
    return pynvml, None


def _nvml_errors(nv: ModuleType) -> tuple[type[BaseException], ...]:
    """Return the exception types an NVML query may raise for an unsupported or failing query."""
    errors: list[type[BaseException]] = [nv.NVMLError]
    mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type) and issubclass(mismatch, BaseException):
        errors.append(mismatch)
    return tuple(errors)


def _text(value: Any) -> str | None:
    """Decode a pynvml string result (some versions return bytes)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _call(nv: ModuleType, names: str | tuple[str, ...], *args: Any) -> Any:
    """Call the first pynvml function of ``names`` that exists and succeeds; None if none does.

    Args:
        nv: the pynvml module.
        names: one function name, or several to try in order (newest API first).
        *args: arguments passed to the function.

    Returns:
        The function's result, or None if every candidate is missing or raised an NVML error.
    """
    errors = _nvml_errors(nv)
    for name in (names,) if isinstance(names, str) else names:
        fn: Callable[..., Any] | None = getattr(nv, name, None)
        if fn is None:
            continue
        try:
            return fn(*args)
        except errors:
            continue
    return None


def _attr_int(obj: Any, attr: str) -> int | None:
    """Return ``int(obj.attr)``, or None when obj is None or lacks the attribute."""
    value = getattr(obj, attr, None) if obj is not None else None
    return int(value) if value is not None else None


def _milli_to_unit(value: Any) -> float | None:
    """Convert an NVML milli-unit value (mW) to units (W), keeping None."""
    return round(value / 1000.0, 1) if value is not None else None


def _format_cuda_driver(version: Any) -> str | None:
    """Format an NVML CUDA driver version integer (e.g. 13000 -> "13.0", 12080 -> "12.8")."""
    if version is None:
        return None
    major, rest = divmod(int(version), 1000)
    return f"{major}.{rest // 10}"


def _snake(name: str) -> str:
    """Convert a CamelCase suffix to snake_case (``HwPowerBrakeSlowdown`` -> ``hw_power_brake_slowdown``)."""
    return _CAMEL_BOUNDARY.sub("_", name).lower()


def _reason_table(nv: ModuleType) -> list[tuple[int, str]]:
    """Return ``(bit, name)`` pairs for every single-bit clock event reason constant pynvml defines.

    The newer ``nvmlClocksEventReason*`` names take precedence; bits only known under the older
    ``nvmlClocksThrottleReason*`` names (e.g. ``board_limit``) are added from those.
    """
    table: dict[int, str] = {}
    for prefix in _REASON_PREFIXES:
        for attr in dir(nv):
            suffix = attr[len(prefix) :] if attr.startswith(prefix) else ""
            if not suffix or suffix in _REASON_SKIP:
                continue
            bit = getattr(nv, attr)
            if isinstance(bit, int) and bit > 0 and bit & (bit - 1) == 0:
                table.setdefault(bit, _snake(suffix))
    return sorted(table.items())


def _decode_reasons(mask: int | None, nv: ModuleType | None = None) -> list[str] | None:
    """Decode a clock event reason bitmask into reason names.

    Args:
        mask: the bitmask from ``nvmlDeviceGetCurrentClocksEventReasons``; None passes through.
        nv: the pynvml module (imported here when omitted).

    Returns:
        Names such as ``["gpu_idle"]`` or ``["sw_power_cap", "hw_slowdown"]`` in bit order, with any bit
        pynvml has no name for reported as ``"unknown_0x..."``; None when ``mask`` is None.
    """
    if mask is None:
        return None
    if nv is None:
        nv, _ = _import_pynvml()
    table = _reason_table(nv) if nv is not None else []
    names = [name for bit, name in table if mask & bit]
    leftover = mask
    for bit, _name in table:
        leftover &= ~bit
    if leftover:
        names.append(f"unknown_{leftover:#x}")
    return names


def _clock_event_reasons(nv: ModuleType, handle: Any) -> list[str] | None:
    """Return the decoded current clock event reasons of a device, or None if unsupported."""
    mask = _call(nv, _REASON_FUNCTIONS, handle)
    return _decode_reasons(mask, nv)


def _temperature(nv: ModuleType, handle: Any) -> int | None:
    """Return the GPU core temperature in degrees C."""
    sensor = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
    value = _call(nv, ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"), handle, sensor)
    return int(value) if value is not None else None


def _memory(nv: ModuleType, handle: Any) -> dict[str, int | None]:
    """Return the device memory totals in bytes."""
    info = _call(nv, "nvmlDeviceGetMemoryInfo", handle)
    return {
        "total_bytes": _attr_int(info, "total"),
        "used_bytes": _attr_int(info, "used"),
        "free_bytes": _attr_int(info, "free"),
    }


def _clocks(nv: ModuleType, handle: Any) -> dict[str, int | None]:
    """Return current and maximum SM and memory clocks in MHz."""
    sm, mem = getattr(nv, "NVML_CLOCK_SM", 1), getattr(nv, "NVML_CLOCK_MEM", 2)
    return {
        "sm_mhz": _call(nv, "nvmlDeviceGetClockInfo", handle, sm),
        "mem_mhz": _call(nv, "nvmlDeviceGetClockInfo", handle, mem),
        "sm_max_mhz": _call(nv, "nvmlDeviceGetMaxClockInfo", handle, sm),
        "mem_max_mhz": _call(nv, "nvmlDeviceGetMaxClockInfo", handle, mem),
    }


def _power(nv: ModuleType, handle: Any) -> dict[str, float | None]:
    """Return current power draw and the enforced power limit in watts."""
    limit = _call(nv, ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"), handle)
    return {
        "draw_w": _milli_to_unit(_call(nv, "nvmlDeviceGetPowerUsage", handle)),
        "limit_w": _milli_to_unit(limit),
    }


def _utilization(nv: ModuleType, handle: Any) -> dict[str, int | None]:
    """Return GPU and memory-controller utilisation in percent over NVML's last sample period."""
    util = _call(nv, "nvmlDeviceGetUtilizationRates", handle)
    return {"gpu_pct": _attr_int(util, "gpu"), "mem_pct": _attr_int(util, "memory")}


def _pcie(nv: ModuleType, handle: Any) -> dict[str, int | None]:
    """Return current and maximum PCIe link generation and width."""
    return {
        "gen": _call(nv, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "gen_max": _call(nv, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "width": _call(nv, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        "width_max": _call(nv, "nvmlDeviceGetMaxPcieLinkWidth", handle),
    }


_TOPOLOGY = {
    0: "same board",
    10: "one PCIe switch",
    20: "several PCIe switches",
    30: "one PCIe host bridge",
    40: "one NUMA node (host bridges)",
    50: "across NUMA nodes (CPU interconnect)",
}
"""NVML's common-ancestor levels between two GPUs: how far a transfer between them travels without NVLink."""


def _nvlinks(nv: ModuleType, handle: Any) -> int | None:
    """Active NVLink links of a device (None when NVML cannot tell; 0 on a PCIe-only card)."""
    links = [
        _call(nv, "nvmlDeviceGetNvLinkState", handle, link)
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)))
    ]
    known = [state for state in links if state is not None]
    return sum(1 for state in known if state) if known else (None if not hasattr(nv, "nvmlDeviceGetNvLinkState") else 0)


def _interconnect(nv: ModuleType, handles: list[Any]) -> list[dict[str, Any]]:
    """How each pair of GPUs reaches the other: NVLink on both ends, and their common PCIe ancestor."""
    out = []
    links = [_nvlinks(nv, h) for h in handles]
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            level = _call(nv, "nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
            out.append(
                {
                    "gpus": [i, j],
                    "nvlink": bool(links[i]) and bool(links[j]),
                    "pcie_path": _TOPOLOGY.get(int(level)) if level is not None else None,
                }
            )
    return out


def _process_name(pid: int) -> str | None:
    """Return a process name, or None if it is gone or not visible (e.g. another PID namespace)."""
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return None


def _processes(nv: ModuleType, handle: Any) -> list[dict[str, Any]] | None:
    """Return compute and graphics processes on a device, deduplicated by PID; None if unsupported."""
    found: dict[int, dict[str, Any]] = {}
    supported = False
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        procs = _call(nv, name, handle)
        if procs is None:
            continue
        supported = True
        for proc in procs:
            pid = _attr_int(proc, "pid")
            if pid is None or pid in found:
                continue
            used = _attr_int(proc, "usedGpuMemory")
            found[pid] = {"pid": pid, "name": _process_name(pid), "used_bytes": used}
    return list(found.values()) if supported else None


def _device_info(nv: ModuleType, index: int, handle: Any) -> dict[str, Any]:
    """Return everything the snapshot records about one device."""
    return {
        "index": index,
        "name": _text(_call(nv, "nvmlDeviceGetName", handle)),
        "uuid": _text(_call(nv, "nvmlDeviceGetUUID", handle)),
        "memory": _memory(nv, handle),
        "clocks": _clocks(nv, handle),
        "temperature_c": _temperature(nv, handle),
        "power": _power(nv, handle),
        "utilization": _utilization(nv, handle),
        "throttle_reasons": _clock_event_reasons(nv, handle),
        "pcie": _pcie(nv, handle),
        "nvlinks": _nvlinks(nv, handle),
        "processes": _processes(nv, handle),
    }


def _gpus(nv: ModuleType) -> list[dict[str, Any]]:
    """Return one dict per device NVML can see (all of them: NVML ignores CUDA_VISIBLE_DEVICES)."""
    count = _call(nv, "nvmlDeviceGetCount") or 0
    devices = []
    for index in range(count):
        handle = _call(nv, "nvmlDeviceGetHandleByIndex", index)
        if handle is not None:
            devices.append(_device_info(nv, index, handle))
    return devices


def _nvml_system(nv: ModuleType) -> dict[str, Any]:
    """Return the driver-level facts of an initialised NVML."""
    cuda = _call(nv, ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"))
    return {
        "available": True,
        "error": None,
        "driver_version": _text(_call(nv, "nvmlSystemGetDriverVersion")),
        "cuda_driver_version": _format_cuda_driver(cuda),
    }


def _nvml_unavailable(error: str) -> dict[str, Any]:
    """Return the ``nvml`` section for a host where NVML could not be used."""
    return {"available": False, "error": error, "driver_version": None, "cuda_driver_version": None}


def open_nvml() -> ModuleType:
    """Import pynvml and initialise NVML (reference-counted: pair each call with ``nvmlShutdown``).

    Raises:
        RuntimeError: pynvml is missing or NVML cannot be initialised (no driver), with the cause.
    """
    nv, error = _import_pynvml()
    if nv is None:
        raise RuntimeError(f"NVML unavailable: {error}")
    try:
        nv.nvmlInit()
    except _nvml_errors(nv) as exc:
        raise RuntimeError(f"NVML unavailable: {str(exc) or type(exc).__name__}") from exc
    return nv


def nvml_snapshot() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The driver's facts and every device's, read with one NVML initialisation (an unavailable NVML is reported, not
    raised)."""
    try:
        nv = open_nvml()
    except RuntimeError as exc:
        return _nvml_unavailable(str(exc).removeprefix("NVML unavailable: ")), []
    try:
        system = _nvml_system(nv)
        count = _call(nv, "nvmlDeviceGetCount") or 0
        handles = [h for h in (_call(nv, "nvmlDeviceGetHandleByIndex", i) for i in range(count)) if h is not None]
        system["interconnect"] = _interconnect(nv, handles)
        return system, _gpus(nv)
    finally:
        _call(nv, "nvmlShutdown")
