"""The CPUs a job really has: the smallest of what the scheduler and the kernel give it. A cluster hands a job
fewer CPUs than the machine shows in three ways, each read here: the CPUs it may run on (its affinity: a cpuset,
``taskset``, SLURM's binding), its CFS quota (cgroup v2's ``cpu.max``, v1's ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``: a container's ``--cpus``, Kubernetes' CPU limit), and what SLURM allotted
(``SLURM_CPUS_PER_TASK``, else ``SLURM_CPUS_ON_NODE``). Worker counts, the ``auto`` search and the busy-host
figures all divide by :func:`cpu_budget`'s ``usable``."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CpuBudget", "cpu_budget", "cpu_count"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
SLURM_KEYS = ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE")
"""SLURM's allotment, the first present: the task's CPUs, else the node's share of the job."""


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs a job has, and what limits it."""

    usable: int
    """The smallest of the limits found (at least 1)."""
    limits: dict[str, int] = field(default_factory=dict)
    """Each limit found, by source: ``affinity``, ``cgroup_quota``, ``SLURM_CPUS_PER_TASK`` or
    ``SLURM_CPUS_ON_NODE`` (a source absent here set no limit)."""

    @property
    def limited_by(self) -> str:
        """The source that set ``usable`` (the first of equals, affinity first)."""
        return min(self.limits, key=lambda k: self.limits[k]) if self.limits else "affinity"


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _cgroup_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """This process's cgroup path in the v2 hierarchy and in v1's ``cpu`` controller (None where absent)."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _candidates(root: Path, sub: str | None) -> list[Path]:
    """Where a controller's files may lie: under the process's own cgroup path, then at the root (inside a
    container's cgroup namespace the process's cgroup is the root)."""
    out = [root / sub.lstrip("/")] if sub and sub != "/" else []
    return [*out, root]


def cgroup_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The CFS quota in whole CPUs (at least 1), or None when there is none: cgroup v2's ``cpu.max`` (``QUOTA
    PERIOD``, or ``max``), else v1's ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    v2, v1 = _cgroup_paths(proc_cgroup)
    for folder in _candidates(root, v2):
        text = _read(folder / "cpu.max")
        if text is not None:
            quota, _, period = text.partition(" ")
            return None if quota == "max" else max(1, math.floor(int(quota) / int(period or 100000)))
    for base in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
        for folder in _candidates(base, v1):
            quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            if quota is not None and period is not None:
                return None if int(quota) < 0 else max(1, math.floor(int(quota) / int(period)))
    return None


def slurm_cpus(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """SLURM's allotment as (variable, CPUs), the first of ``SLURM_KEYS`` set to a number; None outside SLURM."""
    for key in SLURM_KEYS:
        value = environ.get(key, "").strip()
        if value.isdigit() and int(value) > 0:
            return key, int(value)
    return None


def cpu_budget(
    *,
    root: Path = CGROUP_ROOT,
    proc_cgroup: Path = PROC_CGROUP,
    environ: Mapping[str, str] | None = None,
    affinity: int | None = None,
) -> CpuBudget:
    """The CPUs this process's job has: the smallest of its affinity, its CFS quota and SLURM's allotment, each
    recorded in ``limits``. The arguments are for tests (another cgroup tree, environment or affinity)."""
    limits = {"affinity": affinity if affinity is not None else _affinity()}
    quota = cgroup_quota(root, proc_cgroup)
    if quota is not None:
        limits["cgroup_quota"] = quota
    slurm = slurm_cpus(os.environ if environ is None else environ)
    if slurm is not None:
        limits[slurm[0]] = slurm[1]
    return CpuBudget(max(1, min(limits.values())), limits)


def cpu_count() -> int:
    """CPUs this process's job may use (:func:`cpu_budget`'s ``usable``)."""
    return cpu_budget().usable
