"""Multi-rank trials on the CPU: real torchrun, real DDP over gloo, real loader workers in every rank."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import measurement, sleepy_config
from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.errors import ConfigError
from tunekit.launch import run_trial, worker_command
from tunekit.plan import estimate_total, next_requests
from tunekit.records import rows_from_measurements

# each rank: 8 samples per 50 ms step (160/s), two workers deliver 1000/s: the model is the bound, so two ranks
# should give twice one rank's throughput, less what the gradient all-reduce costs
SLEEPY = {
    "workload.model_args": {"step_wait_s": 0.05},
    "workload.dataset_args": {"sample_wait_s": 0.002},
    "launch.nproc_per_node": 2,
}


def _spec(cfg: dict, **knobs) -> TrialSpec:
    return TrialSpec(
        number=0, stage="single", mode="train", knobs=Knobs(**knobs), config=config.from_dict(cfg).to_dict()
    )


def test_two_ranks_give_twice_one_rank(tmp_path: Path):
    cfg = sleepy_config(**SLEEPY, **{"trial.window_s": 0.5})  # windows of 10 steps or more
    one = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "one", 120)
    two = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=8, ranks=2), tmp_path / "two", 120)
    assert one.status == "ok" and two.status == "ok", (one.reason, two.reason)
    assert one.ranks is None and two.ranks == 2 and two.nodes == 1
    ratio = two.rate / one.rate
    # the ranks' steps sleep side by side (about 2x); a 2-core host running another test file beside this one
    # gave 1.69, and ranks that took turns would give 1x
    assert 1.5 <= ratio <= 2.2, ratio
    per_rank = two.per_rank or []
    assert [p["rank"] for p in per_rank] == [0, 1]
    # worked out from the workload: a rank trains 8 samples per step of at least 50 ms, at most 160/s, so two
    # ranks at most 320/s; a loaded box only slows them, and the ratio above bounds them from below
    assert 0.55 * 320 <= two.rate <= 320 * 1.03, two.rate
    assert all(0.55 * 160 <= p["rate"] <= 160 * 1.03 for p in per_rank), per_rank
    # a step takes its 50-ms sleep at least; the ranks step together, so the pace is 2 x 8 samples per step time
    assert 0.05 <= two.step_time_s <= 0.05 / 0.55
    assert two.rate == pytest.approx(2 * 8 / two.step_time_s, rel=0.1)
    assert 0.0 <= two.sync_share < 1.0 and two.workers_total == 4
    # host memory: the node's whole tree (torchrun, both ranks, their four workers), more than one rank's own
    assert two.host_processes >= 7
    assert two.host_mem_peak_bytes > max(p["host_mem_peak_bytes"] for p in per_rank)


def _trial_processes(trial_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(trial_dir) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_timeout_kills_torchrun_every_rank_and_their_workers(tmp_path: Path):
    pids = tmp_path / "pids"
    pids.mkdir()
    cfg = sleepy_config(
        **{
            **SLEEPY,
            "workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "hang_at": 3, "pid_dir": str(pids)},
        }
    )
    # 20 s: torchrun and two fresh interpreters importing torch serve samples within 3 s on a quick 2-core box (a
    # crashing rank's whole trial takes 3.3 s), and took over 12 s on a slow one (import torch 4 s, three
    # processes on 2 cores); then one hangs, and the timeout must end torchrun, both ranks and their workers
    t0 = time.monotonic()
    m = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=4, ranks=2), tmp_path / "t", 20)
    assert m.status == "timeout", m
    assert time.monotonic() - t0 < 20 + 30
    # named from where each rank was: the one whose loader never delivered, the other waiting in the collective
    assert "hung waiting for its DataLoader's batch" in m.reason and "others waited for it" in m.reason, m.reason
    loader_pids = [int(p.name) for p in pids.iterdir()]
    assert len(loader_pids) >= 2  # workers of the ranks served samples before one hung

    def alive() -> list[int]:
        found = []
        for pid in loader_pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    found.append(pid)
            except psutil.NoSuchProcess:
                pass
        return found

    deadline = time.monotonic() + 10  # the launcher waited for the group; give the kernel a moment to reap
    while alive():
        assert time.monotonic() < deadline, alive()
        time.sleep(0.05)
    assert not _trial_processes(tmp_path / "t")  # no torchrun, no rank, no worker left


def test_a_crashed_rank_is_crashed_with_its_message(tmp_path: Path):
    cfg = sleepy_config(**{**SLEEPY, "workload.step": "tests._workloads:rank1_raises_step"})
    m = run_trial(_spec(cfg, num_workers=0, batch_size=4, ranks=2), tmp_path / "t", 120)
    assert m.status == "crashed", m
    assert m.reason.startswith("rank 1: ") and "rank one's step broke" in m.reason
    assert not _trial_processes(tmp_path / "t")


def test_a_rank_torchrun_stopped_with_sigterm_is_not_blamed_for_the_one_that_reported(tmp_path: Path):
    """Rank 1 raises and writes its failure; torchrun then stops rank 0 with SIGTERM before it writes anything (the
    order a loaded box gave): the reason is rank 1's, not "rank 0 was killed by SIGTERM". Without its report, rank
    1's exit code comes before the SIGTERM torchrun sent rank 0 because of it."""
    from tunekit._files import write_json_atomic
    from tunekit.contract import failed_measurement
    from tunekit.launch._ending import rank_failure

    spec = _spec(sleepy_config(**SLEEPY), num_workers=0, batch_size=4, ranks=2)
    write_json_atomic(tmp_path / "spec.json", spec.to_dict())
    log = (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\nFailures:\n[1]:\n  time      : x\n"
        "  host      : h\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 7)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 8)\n"
    )
    alone = rank_failure(tmp_path / "measurement.json", log)
    assert alone is not None and alone.reason.startswith("rank 1 (local rank 1) exited with code 1"), alone
    reported = failed_measurement(spec, "crashed", "rank 1: RuntimeError: rank one's step broke", failed_at=1.0)
    write_json_atomic(tmp_path / "measurement.rank1.json", reported.to_dict())
    m = rank_failure(tmp_path / "measurement.json", log)
    assert m is not None and m.reason == "rank 1: RuntimeError: rank one's step broke", m


def test_a_rank_killed_outright_is_named_not_the_peer_that_lost_it(tmp_path: Path):
    """Rank 1 killed by SIGKILL writes nothing; rank 0 then fails with "Connection closed by peer" and torchrun's
    "Root Cause" names rank 0, the first exit it saw. The reason names rank 1 and its signal, read from torchrun's
    summary in the log."""
    cfg = sleepy_config(**{**SLEEPY, "workload.step": "tests._workloads:rank1_killed_step"})
    m = run_trial(_spec(cfg, num_workers=0, batch_size=4, ranks=2), tmp_path / "t", 120)
    assert m.status == "crashed", m
    assert m.reason.startswith("rank 1 (local rank 1) was killed by SIGKILL"), m.reason
    assert "OOM killer" in m.reason and "\n" not in m.reason
    assert not _trial_processes(tmp_path / "t")


def test_launch_config_is_checked():
    with pytest.raises(ConfigError, match="launch.rdzv_endpoint: launch.nnodes = 2 needs the host:port"):
        config.from_dict(sleepy_config(**{"launch.nnodes": 2}))
    with pytest.raises(ConfigError, match="device: cuda:1 names one GPU"):
        config.from_dict(sleepy_config(**{"launch.nproc_per_node": 2, "device": "cuda:1"}))
    with pytest.raises(ConfigError, match="nccl needs CUDA"):
        config.from_dict(sleepy_config(**{"launch.backend": "nccl"}))
    per_rank = config.from_dict(sleepy_config(**{"launch.nproc_per_node": 2, "search.num_workers": "auto"}))
    alone = config.from_dict(sleepy_config(**{"search.num_workers": "auto"}))
    assert max(per_rank.search.num_workers) < max(alone.search.num_workers) or config.cpu_count() < 2


def test_torchrun_command_per_launch():
    one = config.from_dict(sleepy_config()).to_dict()
    assert worker_command(TrialSpec(number=0, stage="single", mode="train", knobs=Knobs(), config=one))[-2:] == [
        "-m",
        "tunekit.worker",
    ]
    nodes = config.from_dict(
        sleepy_config(**{"launch.nnodes": 2, "launch.nproc_per_node": 2, "launch.rdzv_endpoint": "node0:29400"})
    ).to_dict()
    cmd = worker_command(TrialSpec(number=0, stage="single", mode="train", knobs=Knobs(ranks=4), config=nodes))
    assert "torch.distributed.run" in cmd and "--nproc-per-node=2" in cmd and "--nnodes=2" in cmd
    assert "--master-addr=node0" in cmd and "--master-port=29400" in cmd and "--node-rank=0" in cmd


def test_plan_runs_the_job_on_every_rank_then_the_knee_on_one_gpu():
    cfg = config.from_dict(sleepy_config(**{"launch.nproc_per_node": 2, "search.batch_size": [8]}))
    rows = rows_from_measurements(
        [
            measurement(0, "compute", "compute", 400, batch_size=8),
            measurement(1, "loader", "loader", 200, batch_size=8),
            measurement(2, "loader", "loader", 400, batch_size=8, num_workers=2),
        ]
    )
    first = next_requests(cfg, rows, strategy="staged", cuda=False)
    assert first[0].stage == "end_to_end" and first[0].knobs.ranks == 2 and first[0].knobs.num_workers == 2
    rows += rows_from_measurements([measurement(3, "end_to_end", "train", 700, batch_size=8, num_workers=2, ranks=2)])
    second = next_requests(cfg, rows, strategy="staged", cuda=False)  # the defaults, on every rank too
    assert second[0].knobs.ranks == 2 and second[0].knobs.loader_defaults
    rows += rows_from_measurements(
        [measurement(4, "end_to_end", "train", 300, batch_size=8, ranks=2, data_wait_frac=0.6)]
    )
    scaling = next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.ranks, r.knobs.num_workers) for r in scaling] == [("scaling", 1, 2)]
    rows += rows_from_measurements([measurement(5, "scaling", "train", 380, batch_size=8, num_workers=2)])
    assert next_requests(cfg, rows, strategy="staged", cuda=False) == []


def test_a_grid_under_launch_ends_with_its_knee_on_one_gpu():
    cfg = config.from_dict(
        sleepy_config(**{"launch.nproc_per_node": 2, "search.batch_size": [8], "search.num_workers": [0, 2]})
    )
    grid = next_requests(cfg, [], strategy="grid", cuda=False)
    assert {r.knobs.ranks for r in grid} == {2} and estimate_total(cfg, [], strategy="grid", cuda=False) == 3
    rows = rows_from_measurements(
        [
            measurement(
                i,
                "grid",
                "train",
                rate,
                batch_size=8,
                ranks=2,
                num_workers=r.knobs.num_workers,
                prefetch_factor=r.knobs.prefetch_factor,
            )
            for i, (r, rate) in enumerate(zip(grid, (300, 700), strict=True))
        ]
    )
    scaling = next_requests(cfg, rows, strategy="grid", cuda=False)
    assert [(r.stage, r.knobs.ranks, r.knobs.num_workers) for r in scaling] == [("scaling", 1, 2)]
    rows += rows_from_measurements([measurement(2, "scaling", "train", 380, batch_size=8, num_workers=2)])
    assert next_requests(cfg, rows, strategy="grid", cuda=False) == []


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_nodes_of_one_rank_on_localhost(tmp_path: Path):
    """Node 0 runs the trial (as a sweep does); node 1 is `tunekit node`, served through the rendezvous."""
    import subprocess
    import sys

    import yaml

    from tunekit.launch import release_nodes

    raw = sleepy_config(
        **{
            **SLEEPY,
            "launch.nproc_per_node": 1,
            "launch.nnodes": 2,
            "trial.window_s": 0.5,
            "launch.rdzv_endpoint": f"127.0.0.1:{_free_port()}",
        }
    )
    path = tmp_path / "two-nodes.yaml"
    path.write_text(yaml.safe_dump(raw))
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunekit",
            "node",
            str(path),
            "--node-rank",
            "1",
            "--out",
            str(tmp_path / "node1"),
            "--idle-timeout",
            "120",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        m = run_trial(_spec(raw, num_workers=2, prefetch_factor=2, batch_size=8, ranks=2), tmp_path / "t", 120)
        assert m.status == "ok", m
        assert m.ranks == 2 and m.nodes == 2 and [p["rank"] for p in m.per_rank] == [0, 1]
        assert len({p["host"] for p in m.per_rank}) == 2  # one node each (the same machine here)
        assert release_nodes(config.from_dict(raw))
        out, _ = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, out
    assert "trial 0 done" in out and "released this node after 1 trial(s)" in out


def test_a_node_that_never_joins_fails_the_trial_at_the_join_timeout_saying_so(tmp_path: Path):
    """Two nodes configured, no `tunekit node` started: the trial fails after launch.join_timeout_s (3 s here), not
    the trial's timeout (120 s), and says how many nodes joined."""
    raw = sleepy_config(
        **{
            **SLEEPY,
            "launch.nproc_per_node": 1,
            "launch.nnodes": 2,
            "launch.join_timeout_s": 3,
            "launch.rdzv_endpoint": f"127.0.0.1:{_free_port()}",
        }
    )
    t0 = time.monotonic()
    m = run_trial(_spec(raw, num_workers=0, batch_size=8, ranks=2), tmp_path / "t", 120)
    assert m.status == "crashed" and "1 of 2 nodes had joined" in m.reason and "tunekit node" in m.reason, m.reason
    assert time.monotonic() - t0 < 60


def _rank_result(rank: int, node: int, rate: float, node_peak: int) -> dict:
    return {
        "rate_windows": [rate, rate],
        "seconds_windows": [1.0, 1.0],
        "rate": rate,
        "measured_items": rate * 2,
        "params": {"num_workers": 2},
        "host": f"h/{node}",
        "local_rank": 0,
        "cpu_count": 4,
        "cpu_util_cores": 1.0,
        "worker_cpu_s": 1.0,
        "measured_s": 2.0,
        "step_time_s": 0.1 + rank / 100,
        "data_wait_frac": 0.1 * rank,
        "gpu_busy_frac": None,
        "system_cpu_pct": 50.0,
        "items_per_batch_mean": 8,
        "items_per_batch_cv": 0.0,
        "headroom": 0.5,
        "headroom_basis": "host",
        "device_mem_peak_allocated_bytes": None,
        "device_mem_peak_reserved_bytes": None,
        "node_mem_peak_bytes": node_peak,
        "host_mem_total_bytes": 100,
        "node_processes": 3,
        "nvml_util_gpu_pct": None,
        "epochs_ended": 0,
        "epoch_boundary_in_trial": False,
        "warnings": [],
        "host_mem_peak_bytes": node_peak,
    }


def test_merge_sums_throughput_and_takes_the_fullest_node():
    from tunekit.worker._dist import merge

    m = merge([_rank_result(0, 0, 100.0, 90), _rank_result(1, 1, 80.0, 10)])
    assert m["rate"] == 180.0 and m["slowest_rank"] == 1 and m["nodes"] == 2
    assert m["step_time_s"] == 0.11 and m["data_wait_frac_max"] == 0.1
    assert m["host_mem_peak_bytes"] == 100 and m["headroom"] == pytest.approx(0.1)  # node 0 is 90 % full


def test_merge_keeps_the_rate_over_whole_epochs_at_the_slowest_ranks_boundary():
    """Epoch-aware ranks: the global steady rate is the windows' (180/s), an epoch boundary holds every rank as long
    as the slowest rank's (2 s), a global epoch is every rank's share (640 items): the trial's rate is 640 / (640 /
    180 + 2) = 115/s, not the steady 180/s (rank 0's own parts were kept and the rate rebuilt from the windows)."""
    from tunekit.worker._dist import merge

    ranks = [
        {
            **_rank_result(rank, 0, rate, 10),
            "rate_in_epoch": rate,
            "boundary_s": cost,
            "epoch_items": 320.0,
            "boundaries_s": [cost + 1, cost],
            "epoch_boundaries": 2,
            "rate_whole_epoch": 1.0,
        }
        for rank, rate, cost in ((0, 100.0, 1.0), (1, 80.0, 2.0))
    ]
    m = merge(ranks)
    assert m["rate_in_epoch"] == 180.0 and m["boundary_s"] == 2.0 and m["epoch_items"] == 640.0
    assert m["rate"] == m["rate_whole_epoch"] == pytest.approx(640 / (640 / 180 + 2.0))
    assert m["boundaries_s"] == [3.0, 2.0]
    steady = merge([{**r, "boundary_s": None} if i else r for i, r in enumerate(ranks)])  # one rank saw none
    assert steady["rate"] == 180.0 and steady["rate_whole_epoch"] is None


def test_gradient_sync_alone_is_not_an_input_bound():
    from tunekit import rules

    ceiling, *_ = rows_from_measurements([measurement(0, "compute", "compute", 400)])
    synced, waiting = rows_from_measurements(
        [
            measurement(1, "end_to_end", "train", 560, ranks=2, data_wait_frac=0.0, sync_share=0.3),
            measurement(2, "end_to_end", "train", 560, ranks=2, data_wait_frac=0.3),
        ]
    )
    assert not rules.input_bound(synced, ceiling) and rules.input_bound(waiting, ceiling)
