"""Cheap repeated NVML samples of one GPU, for the trial worker's background sampler thread."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tunekit.env._nvml import (
    _attr_int,
    _call,
    _clock_event_reasons,
    _milli_to_unit,
    _nvml_errors,
    _temperature,
    _text,
    _utilization,
    open_nvml,
)


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
        nv = open_nvml()
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
        nv = open_nvml()
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
