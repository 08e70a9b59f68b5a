"""The machine a sweep runs on: the snapshot the driver saves (never importing torch), the NVML sampler a trial
worker runs, the text ``tunekit env`` prints, the warnings a sweep shows before and after it runs, and the device's
matmul peak its trials measured, with the datasheet figure beside it; whether its trials will run on CUDA."""

from __future__ import annotations

from tunekit.env._cuda import probe_cuda
from tunekit.env._machine import describe_machine, machine_fingerprint
from tunekit.env._peak import datasheet_flops, matmul_peaks
from tunekit.env._sampler import NvmlSampler
from tunekit.env._snapshot import cpu_model, snapshot
from tunekit.env._text import format_text
from tunekit.env._warnings import environment_warnings, sweep_warnings

__all__ = [
    "snapshot",
    "format_text",
    "NvmlSampler",
    "cpu_model",
    "environment_warnings",
    "sweep_warnings",
    "datasheet_flops",
    "matmul_peaks",
    "machine_fingerprint",
    "describe_machine",
    "probe_cuda",
]
