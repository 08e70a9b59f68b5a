"""tunekit.config._cpus: the CPUs a job really has, from its affinity, a cgroup's CFS quota (v1 and v2, under the
process's own cgroup or at the root of a container's) and SLURM's allotment, on cgroup trees written here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunekit.config._cpus import cpu_budget, cpu_count


def _tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc_cgroup = tmp_path / "proc-self-cgroup"
    proc_cgroup.write_text(proc)
    return root, proc_cgroup


@pytest.mark.parametrize(
    ("proc", "files", "quota"),
    [
        # cgroup v2, the job's own cgroup: 2.5 CPUs of quota give 2 whole ones
        ("0::/job/step\n", {"job/step/cpu.max": "250000 100000\n", "cpu.max": "max 100000\n"}, 2),
        # cgroup v2 inside a container's namespace: the process's cgroup is the root
        ("0::/\n", {"cpu.max": "400000 100000\n"}, 4),
        # cgroup v2 without a limit
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),
        # cgroup v1, the cpu controller mounted with cpuacct
        (
            "12:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n",
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            },
            3,
        ),
        # cgroup v1 without a quota (-1); a quota under one CPU still leaves one
        ("4:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ("4:cpu:/\n", {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    ],
)
def test_a_cfs_quota_limits_the_usable_cpus(tmp_path: Path, proc: str, files: dict[str, str], quota: int | None):
    root, proc_cgroup = _tree(tmp_path, proc, files)
    budget = cpu_budget(root=root, proc_cgroup=proc_cgroup, environ={}, affinity=16)
    assert budget.limits.get("cgroup_quota") == quota
    assert budget.usable == (quota or 16)
    assert budget.limited_by == ("cgroup_quota" if quota else "affinity")


def test_the_smallest_of_affinity_quota_and_slurm_is_usable(tmp_path: Path):
    root, proc_cgroup = _tree(tmp_path, "0::/\n", {"cpu.max": "800000 100000\n"})
    slurm = {"SLURM_CPUS_PER_TASK": "6", "SLURM_CPUS_ON_NODE": "32"}
    budget = cpu_budget(root=root, proc_cgroup=proc_cgroup, environ=slurm, affinity=64)
    assert budget.limits == {"affinity": 64, "cgroup_quota": 8, "SLURM_CPUS_PER_TASK": 6}
    assert (budget.usable, budget.limited_by) == (6, "SLURM_CPUS_PER_TASK")
    node = cpu_budget(root=root, proc_cgroup=proc_cgroup, environ={"SLURM_CPUS_ON_NODE": "4"}, affinity=64)
    assert (node.usable, node.limited_by) == (4, "SLURM_CPUS_ON_NODE")
    bound = cpu_budget(root=root, proc_cgroup=proc_cgroup, environ=slurm, affinity=2)  # a cpuset of 2
    assert (bound.usable, bound.limited_by) == (2, "affinity")


def test_no_cgroup_files_and_no_slurm_leave_the_affinity(tmp_path: Path):
    budget = cpu_budget(
        root=tmp_path / "none", proc_cgroup=tmp_path / "none", environ={"SLURM_CPUS_PER_TASK": ""}, affinity=3
    )
    assert budget.limits == {"affinity": 3} and budget.usable == 3


def test_this_machine_counts_at_most_its_affinity():
    import os

    assert 1 <= cpu_count() <= len(os.sched_getaffinity(0))
