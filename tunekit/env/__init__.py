"""The machine a sweep runs on: the snapshot the driver saves (never importing torch), the NVML sampler a trial
worker runs, the text ``tunekit env`` prints, and the warnings a sweep shows before and after it runs."""

from __future__ import annotations

from tunekit.env._sampler import NvmlSampler
from tunekit.env._snapshot import cpu_model, snapshot
from tunekit.env._text import format_text
from tunekit.env._warnings import environment_warnings, sweep_warnings

__all__ = ["snapshot", "format_text", "NvmlSampler", "cpu_model", "environment_warnings", "sweep_warnings"]
