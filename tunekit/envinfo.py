"""Environment snapshot: software versions, CPU, memory, /dev/shm and NVIDIA GPUs (through NVML).

This module must never import torch: it runs in the sweep driver, which must not create a CUDA context.
Package versions come from ``importlib.metadata`` and torch's CUDA build version is read from
``torch/version.py`` as text. GPU facts come from NVML (``pynvml``, shipped by ``nvidia-ml-py``), and
every single NVML query is guarded, so a field the driver does not support becomes ``None`` instead of
failing the whole snapshot.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import socket
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

__all__ = ["snapshot", "format_text", "NvmlSampler", "cpu_model"]

_GIB = 1024**3
_SHM_PATH = "/dev/shm"
_CPUINFO_PATH = "/proc/cpuinfo"

# Distribution names whose versions go into the snapshot, keyed by the name used in the snapshot.
_PACKAGES: dict[str, str] = {
    "torch": "torch",
    "torchvision": "torchvision",
    "optuna": "optuna",
    "numpy": "numpy",
    "pillow": "pillow",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "pynvml": "nvidia-ml-py",
}

# pynvml constant-name prefixes for the clock event (formerly "throttle") reason bits, newest first.
_REASON_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")
# Suffixes that are not single reasons: masks, or deprecated aliases of another bit.
_REASON_SKIP = frozenset({"None", "All", "UserDefinedClocks"})
# Newer name first; the "Throttle" one is deprecated and goes away with CUDA 14.
_REASON_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")

_CUDA_LINE = re.compile(r"^cuda\b.*=\s*(.+)$")
_CAMEL_BOUNDARY = re.compile(r"(?<!^)(?=[A-Z])")


# --------------------------------------------------------------------------------------------------
# Software
# --------------------------------------------------------------------------------------------------


def _dist_version(dist: str) -> str | None:
    """Return the installed version of a distribution, or None if it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_versions() -> dict[str, str | None]:
    """Return the versions of the packages tunekit's results depend on."""
    return {key: _dist_version(dist) for key, dist in _PACKAGES.items()}


def _parse_cuda_line(text: str) -> str | None:
    """Extract the ``cuda = ...`` value from the text of ``torch/version.py``.

    Args:
        text: contents of ``torch/version.py``.

    Returns:
        The CUDA version torch was built against (e.g. ``"13.0"``), or None for CPU/ROCm builds or when
        the line is absent or not a literal.
    """
    for line in text.splitlines():
        match = _CUDA_LINE.match(line.strip())
        if match is None:
            continue
        try:
            value = ast.literal_eval(match.group(1).strip())
        except (ValueError, SyntaxError):
            return None
        return str(value) if value is not None else None
    return None


def _torch_cuda_build() -> str | None:
    """Return ``torch.version.cuda`` without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        return _parse_cuda_line(version_file.read_text(encoding="utf-8"))
    except OSError:
        return None


def _tunekit_version() -> str | None:
    """Return the version of this package."""
    try:
        from tunekit import __version__
    except ImportError:
        return None
    return str(__version__)


# --------------------------------------------------------------------------------------------------
# Host
# --------------------------------------------------------------------------------------------------


def cpu_model() -> str | None:
    """Return the CPU model name from /proc/cpuinfo, or None (non-Linux, or no such line, e.g. on ARM)."""
    try:
        with open(_CPUINFO_PATH, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name":
                    return value.strip() or None
    except OSError:
        return None
    return None


def _cpu_info() -> dict[str, Any]:
    """Return logical, physical and usable (affinity) CPU counts and the model name."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "logical": os.cpu_count(),
        "physical": psutil.cpu_count(logical=False),
        "affinity": affinity,
        "model": cpu_model(),
    }


def _memory_info() -> dict[str, int]:
    """Return total and available system memory in bytes."""
    vm = psutil.virtual_memory()
    return {"total_bytes": int(vm.total), "available_bytes": int(vm.available)}


def _shm_info() -> dict[str, Any] | None:
    """Return the size of /dev/shm (DataLoader workers pass tensors through it), or None if missing."""
    try:
        usage = shutil.disk_usage(_SHM_PATH)
    except OSError:
        return None
    return {"path": _SHM_PATH, "total_bytes": int(usage.total), "free_bytes": int(usage.free)}


# --------------------------------------------------------------------------------------------------
# NVML helpers
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Clock event ("throttle") reasons
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Per-device queries
# --------------------------------------------------------------------------------------------------


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


def _nvml_snapshot() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Initialise NVML, read the driver and every device, and shut NVML down again."""
    nv, error = _import_pynvml()
    if nv is None:
        return _nvml_unavailable(error or "pynvml not importable"), []
    try:
        nv.nvmlInit()
    except _nvml_errors(nv) as exc:
        return _nvml_unavailable(str(exc) or type(exc).__name__), []
    try:
        return _nvml_system(nv), _gpus(nv)
    finally:
        _call(nv, "nvmlShutdown")


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------


def snapshot() -> dict[str, Any]:
    """Describe the software, host and GPUs this process runs on.

    Never imports torch and never raises for a missing driver or an unsupported NVML query: missing
    facts are None. Safe to call from a process that must not hold a CUDA context.

    Returns:
        A JSON-serialisable dict with keys ``python``, ``platform``, ``hostname``, ``tunekit``, ``date``
        (ISO-8601, UTC), ``packages``, ``torch_cuda_build``, ``cpu``, ``memory``, ``shm``, ``nvml`` and
        ``gpus`` (one dict per device NVML sees; ``[]`` without NVML).
    """
    nvml, gpus = _nvml_snapshot()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "tunekit": _tunekit_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "packages": _package_versions(),
        "torch_cuda_build": _torch_cuda_build(),
        "cpu": _cpu_info(),
        "memory": _memory_info(),
        "shm": _shm_info(),
        "nvml": nvml,
        "gpus": gpus,
    }


class NvmlSampler:
    """Cheap repeated samples of one GPU, for a background sampler thread in a trial worker.

    Owns one NVML initialisation (NVML reference-counts init/shutdown, so this coexists with other
    users in the process). Use as a context manager or call :meth:`close`.

    Args:
        index: NVML device index. NVML ignores ``CUDA_VISIBLE_DEVICES`` and enumerates in PCI bus order,
            so this is not necessarily the CUDA device ordinal.

    Raises:
        RuntimeError: if pynvml is missing, NVML cannot be initialised, or there is no such device.
    """

    def __init__(self, index: int) -> None:
        nv, error = _import_pynvml()
        if nv is None:
            raise RuntimeError(f"NVML unavailable: {error}")
        try:
            nv.nvmlInit()
        except _nvml_errors(nv) as exc:
            raise RuntimeError(f"NVML unavailable: {exc}") from exc
        try:
            self._handle = nv.nvmlDeviceGetHandleByIndex(index)
        except _nvml_errors(nv) as exc:
            _call(nv, "nvmlShutdown")
            raise RuntimeError(f"NVML has no GPU with index {index}: {exc}") from exc
        self._nv: ModuleType | None = nv
        self.index = index

    @classmethod
    def for_uuid(cls, uuid: str, fallback_index: int = 0) -> NvmlSampler:
        """The sampler of the GPU with this UUID (as torch reports it, with or without the ``GPU-`` prefix).

        CUDA ordinals and NVML indices differ under ``CUDA_VISIBLE_DEVICES``; the UUID names one card in both.
        Falls back to ``fallback_index`` when no device matches.
        """
        want = uuid.lower().removeprefix("gpu-")
        nv, error = _import_pynvml()
        if nv is None:
            raise RuntimeError(f"NVML unavailable: {error}")
        try:
            nv.nvmlInit()
        except _nvml_errors(nv) as exc:
            raise RuntimeError(f"NVML unavailable: {exc}") from exc
        try:
            for index in range(_call(nv, "nvmlDeviceGetCount") or 0):
                handle = _call(nv, "nvmlDeviceGetHandleByIndex", index)
                found = _text(_call(nv, "nvmlDeviceGetUUID", handle)) if handle is not None else None
                if found and found.lower().removeprefix("gpu-") == want:
                    return cls(index)
            return cls(fallback_index)
        finally:
            _call(nv, "nvmlShutdown")

    def sample(self) -> dict[str, Any]:
        """Take one sample; each field is None if its query fails.

        Returns:
            ``utilization_gpu_pct``, ``utilization_mem_pct``, ``memory_used_bytes``, ``sm_clock_mhz``,
            ``power_w``, ``temperature_c`` and ``throttle_reasons`` (list of names, or None).

        Raises:
            RuntimeError: if called after :meth:`close`.
        """
        nv = self._nv
        if nv is None:
            raise RuntimeError("NvmlSampler is closed")
        handle = self._handle
        util = _utilization(nv, handle)
        memory = _call(nv, "nvmlDeviceGetMemoryInfo", handle)
        return {
            "utilization_gpu_pct": util["gpu_pct"],
            "utilization_mem_pct": util["mem_pct"],
            "memory_used_bytes": _attr_int(memory, "used"),
            "sm_clock_mhz": _call(nv, "nvmlDeviceGetClockInfo", handle, getattr(nv, "NVML_CLOCK_SM", 1)),
            "power_w": _milli_to_unit(_call(nv, "nvmlDeviceGetPowerUsage", handle)),
            "temperature_c": _temperature(nv, handle),
            "throttle_reasons": _clock_event_reasons(nv, handle),
        }

    def close(self) -> None:
        """Release this sampler's NVML initialisation. Idempotent."""
        nv, self._nv = self._nv, None
        if nv is not None:
            _call(nv, "nvmlShutdown")

    def __enter__(self) -> NvmlSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# Text rendering
# --------------------------------------------------------------------------------------------------


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
        f"{_q(cpu.get('affinity'))} usable ({cpu.get('model') or 'unknown model'})"
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


if __name__ == "__main__":  # pragma: no cover - manual inspection aid
    sys.stdout.write(format_text(snapshot()) + "\n")
