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


def test_the_workers_of_every_rank_on_the_node_count_against_its_cpus():
    """Four ranks of 4 workers on 8 usable CPUs: 16 workers compete for them, which one rank's 4 do not show."""
    from tunekit.env import environment_warnings

    env = {"cpu": {"usable": 8, "affinity": 64, "limits": {"affinity": 64, "cgroup_quota": 8}}}
    assert environment_warnings(env, max_workers=4) == []
    (line,) = environment_warnings(env, max_workers=4, ranks=4)
    assert "up to 4 per rank, 16 across this node's 4 ranks, above the 8 usable CPUs" in line


def test_the_snapshot_reports_each_limit_and_the_text_names_the_one_that_set_it():
    from tunekit.env import snapshot
    from tunekit.env._text import _host_pairs

    cpu = snapshot()["cpu"]
    assert cpu["usable"] == min(cpu["limits"].values()) and cpu["limits"]["affinity"] == cpu["affinity"]
    assert cpu["limited_by"] in cpu["limits"]
    quota = {
        "logical": 64,
        "physical": 32,
        "affinity": 64,
        "usable": 8,
        "limits": {"affinity": 64, "cgroup_quota": 8},
        "limited_by": "cgroup_quota",
        "model": "X",
    }
    text = dict(_host_pairs({"cpu": quota}))["CPU"]
    assert "8 usable, limited by its cgroup's CFS quota (64 CPUs of affinity)" in text
