"""The environment snapshot the driver saves beside a run: software versions, CPU, memory, /dev/shm, GPUs.

Never imports torch (the driver must not create a CUDA context): package versions come from importlib.metadata
and torch's CUDA build is read from ``torch/version.py`` as text.
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from tunekit.config import cpu_budget
from tunekit.env._nvml import nvml_snapshot

_SHM_PATH = "/dev/shm"
_CPUINFO_PATH = "/proc/cpuinfo"
_CUDA_LINE = re.compile(r"^cuda\b.*=\s*(.+)$")

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
    """Return the logical and physical CPU counts, the usable ones (``config.cpu_budget``: the smallest of the
    affinity, a cgroup's CFS quota and SLURM's allotment) with each limit found and the one that set them, and the
    model name."""
    budget = cpu_budget()
    return {
        "logical": os.cpu_count(),
        "physical": psutil.cpu_count(logical=False),
        "affinity": budget.limits["affinity"],
        "usable": budget.usable,
        "limits": budget.limits,
        "limited_by": budget.limited_by,
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


def snapshot() -> dict[str, Any]:
    """Describe the software, host and GPUs this process runs on.

    Never imports torch and never raises for a missing driver or an unsupported NVML query: missing
    facts are None. Safe to call from a process that must not hold a CUDA context.

    Returns:
        A JSON-serialisable dict with keys ``python``, ``platform``, ``hostname``, ``tunekit``, ``date``
        (ISO-8601, UTC), ``packages``, ``torch_cuda_build``, ``cpu``, ``memory``, ``shm``, ``nvml`` and
        ``gpus`` (one dict per device NVML sees; ``[]`` without NVML).
    """
    nvml, gpus = nvml_snapshot()
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
