"""Multi-rank trials on the CPU (tunekit/worker/_dist.py): real torchrun, real DDP over gloo, real loader workers
in every rank, and the ranks' measurements merged."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import sleepy_config
from tests.launch.test_ending import SLEEPY, _rank_spec
from tests.worker.script.test_session import _no_process_runs, _script_config, _trial
from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial, script_command
from tunekit.workloads.synthetic import expected_samples_per_s


def test_two_ranks_give_twice_one_rank(tmp_path: Path):
    cfg = sleepy_config(**SLEEPY, **{"trial.window_s": 0.5})  # windows of 10 steps or more
    one = run_trial(_rank_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "one", 120)
    two = run_trial(_rank_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=8, ranks=2), tmp_path / "two", 120)
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


DDP_SCRIPT = """
import argparse, torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from tunekit.workloads.synthetic import sleepy_dataset, sleepy_model

parser = argparse.ArgumentParser()
parser.add_argument("-j", type=int, default=0)
parser.add_argument("-b", type=int, default=8)
args = parser.parse_args()
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(sleepy_model(step_wait_s=0.02))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = sleepy_dataset(sample_wait_s=0.005)
train = DataLoader(data, batch_size=args.b, num_workers=args.j, sampler=DistributedSampler(data))
for epoch in range(1000):
    train.sampler.set_epoch(epoch)
    for x, y in train:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_torchrun_command_measures_every_ranks_training_loader_merged(tmp_path: Path):
    """`torchrun --nproc-per-node 2 train.py`, gloo on the CPU: the command sets the end-to-end trials' ranks, each
    rank's training loader is metered (the ranks agreeing on the windows) and rank 0 writes the merged measurement:
    two ranks of 2 workers x 5 ms per sample each deliver about twice one rank's known answer."""
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        str(script),
        "-j",
        "{num_workers}",
        "-b",
        "{batch_size}",
    ]
    raw = _script_config(tmp_path, command)
    assert config.from_dict(raw).launch.nproc_per_node == 2
    m = _trial(tmp_path, raw, num_workers=2, prefetch_factor=2, batch_size=8, ranks=2)
    assert m.status == "ok", m.reason
    assert m.started_by == "torchrun"  # torchrun runs itself, never forked
    assert m.ranks == 2 and len(m.per_rank) == 2 and m.loader_measured["dataset"] == "_SleepyDataset"
    analytic = 2 * expected_samples_per_s(2, 8, 0.005, 0.02)
    assert 0.5 * analytic < m.rate < 1.15 * analytic
    single = script_command(
        TrialSpec(
            number=1, stage="compute", mode="compute", knobs=Knobs(batch_size=8), config=config.from_dict(raw).to_dict()
        )
    )
    assert single[:4] == [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1"]  # a ceiling: 1 rank
    assert single[-5:] == [str(script), "-j", "0", "-b", "8"] and "--standalone" in single
    assert _no_process_runs(str(script))
