"""The environment: a host other processes keep busy, disturbed figures, and the sweep's warnings' thresholds."""

from __future__ import annotations

from tunekit.records import TrialRow

BUSY_HOST = 0.5
"""Share of the usable CPUs that processes outside a trial may keep busy before its figures count as disturbed
(a warning on the trial, and its verdict ``shared-host``): half, so that a CI agent's or an editor's background
work does not trip it, while another job on the machine (1.7 of 2 CPUs) does."""


DISTURBED_BAND = 0.10
"""A run's noise band wider than this says first, in the console, report.md and recommended.yaml, that the figures
are disturbed and the pick uncertain (a quiet machine's windows spread 1-4 %)."""


def other_cpu_share(row: TrialRow) -> float | None:
    """The share of the trial's usable CPUs that other processes kept busy during its windows, or None."""
    m = row.measurement
    if m.other_cpu_cores is None or not m.cpu_count:
        return None
    return m.other_cpu_cores / m.cpu_count


def busy_host(row: TrialRow) -> bool:
    """Other processes kept more than BUSY_HOST of the trial's usable CPUs busy."""
    share = other_cpu_share(row)
    return share is not None and share > BUSY_HOST


HOST_MEMORY_WARN = 0.80
"""Share of the machine's RAM a trial's process tree may use before the sweep warns."""


SHM_WARN = 0.80
"""Share of /dev/shm the loader's in-flight batches may need before the sweep warns."""


HOT_GPU_C = 85
"""GPU temperature (C) at which the sweep warns."""


BENIGN_THROTTLE = frozenset({"gpu_idle", "sw_power_cap", "applications_clocks_setting"})
"""NVML clock-event reasons that do not disturb a measurement."""
