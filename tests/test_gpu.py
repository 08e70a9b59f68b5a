"""GPU-only checks of the measurement contract; skipped without CUDA (run them on a GPU machine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import sleepy_config
from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial

pytestmark = pytest.mark.gpu


def _cnn_config() -> dict:
    return sleepy_config(
        **{
            "device": "cuda",
            "workload.model": "tunekit.workloads.synthetic:small_cnn",
            "workload.model_args": {"num_classes": 10, "width": 32},
            "workload.dataset": "tunekit.workloads.synthetic:tensor_dataset",
            "workload.dataset_args": {"shape": [3, 64, 64]},
            "workload.precision": "bf16",
            "workload.channels_last": True,
        }
    )


def test_cuda_trial_fills_gpu_fields(tmp_path: Path):
    cfg = config.from_dict(_cnn_config()).to_dict()
    spec = TrialSpec(
        number=0,
        stage="single",
        mode="train",
        config=cfg,
        knobs=Knobs(num_workers=2, prefetch_factor=2, pin_memory=True, batch_size=64),
    )
    m = run_trial(spec, tmp_path / "t", 120)
    assert m.status == "ok", m
    assert 0 < m.gpu_busy_frac <= 1
    assert m.nvml["samples"] > 0 and m.nvml_util_gpu_pct is not None
    assert 0 < m.device_mem_peak_allocated_bytes <= m.device_mem_peak_reserved_bytes
    assert m.device_mem_peak_reserved_bytes < m.device_mem_total_bytes
    assert m.headroom_basis == "device" and 0 < m.headroom < 1
    assert m.device.startswith("cuda")


def test_cuda_flops_per_item_and_the_matmul_peak_in_bf16(tmp_path: Path):
    """The Linear stack's FLOPs on CUDA under bf16 autocast are its CPU count (they depend on neither); the probe
    gives a bf16 figure."""
    from tests.worker.test_factory import LINEAR_FLOPS, _linear_config

    cfg = config.from_dict(_linear_config(**{"device": "cuda", "workload.precision": "bf16"})).to_dict()
    spec = TrialSpec(number=0, stage="single", mode="compute", config=cfg, knobs=Knobs(batch_size=256), probe_peak=True)
    m = run_trial(spec, tmp_path / "t", 120)
    assert m.status == "ok", m
    assert m.flops_per_item == pytest.approx(LINEAR_FLOPS, rel=0.01)
    assert m.matmul_peak_flops > 0 and m.matmul_peak_precision == "bf16" and m.matmul_peak_reason is None


def test_cuda_oom_is_classified(tmp_path: Path):
    cfg = _cnn_config()
    cfg["workload"]["model_args"] = {"num_classes": 10, "width": 512}
    cfg["workload"]["dataset_args"] = {"shape": [3, 512, 512], "num_samples": 4096}
    spec = TrialSpec(
        number=0, stage="single", mode="compute", config=config.from_dict(cfg).to_dict(), knobs=Knobs(batch_size=2048)
    )
    m = run_trial(spec, tmp_path / "t", 300)
    assert m.status == "oom", m


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA devices")
def test_two_ranks_over_nccl_one_gpu_each(tmp_path: Path):
    cfg = config.from_dict({**_cnn_config(), "launch": {"nproc_per_node": 2}}).to_dict()
    knobs = dict(num_workers=2, prefetch_factor=2, pin_memory=True, batch_size=64)
    two = run_trial(
        TrialSpec(number=0, stage="single", mode="train", config=cfg, knobs=Knobs(ranks=2, **knobs)),
        tmp_path / "two",
        180,
    )
    assert two.status == "ok", two
    assert two.backend == "nccl" and two.ranks == 2
    assert sorted(p["device"] for p in two.per_rank) == ["cuda:0", "cuda:1"]
    assert 0.0 <= two.sync_share < 1.0
    assert all(p["pinned_peak_bytes"] for p in two.per_rank)  # the pin-memory thread's buffers, per rank
    assert 0 < two.headroom < 1 and two.gpu_busy_frac > 0
    # accumulation syncs once per two micro-batches: the share of a micro-step spent in sync cannot grow
    accum = run_trial(
        TrialSpec(number=1, stage="single", mode="train", config=cfg, knobs=Knobs(ranks=2, grad_accum=2, **knobs)),
        tmp_path / "accum",
        180,
    )
    assert accum.status == "ok", accum
    # docs/distributed.md: with grad_accum 2 one all-reduce serves two micro-batches' compute, so a share s of a
    # step at accumulation 1 becomes s / (2 - s) of an optimizer step (0.23 -> 0.13; measured on two H200: 0.14).
    # Syncing on every micro-batch would leave it at s. 0.05 of slack for the probe's noise.
    s = two.sync_share
    assert 0.0 <= accum.sync_share <= s / (2 - s) + 0.05, (s, accum.sync_share)
    assert accum.sync_share <= s + 0.02  # never more of a step than without accumulation


def test_cuda_trials_forked_by_the_fork_server_and_its_refusal(tmp_path: Path):
    """A CUDA trial forked by the fork server initialises CUDA after the fork; a workload module that initialises
    CUDA when imported makes the server refuse (a child forked after that could not use the GPU), and the trial runs
    in a fresh interpreter instead."""
    cfg = config.from_dict(_cnn_config()).to_dict()
    spec = TrialSpec(
        number=0,
        stage="single",
        mode="train",
        config=cfg,
        knobs=Knobs(num_workers=2, prefetch_factor=2, pin_memory=True, batch_size=64),
    )
    forked = run_trial(spec, tmp_path / "forked", 120)
    assert forked.status == "ok" and forked.started_by == "fork server", forked
    cuda_at_import = _cnn_config()
    cuda_at_import["workload"]["loss"] = "tests._cuda_at_import:loss"
    spec = TrialSpec(
        number=1,
        stage="single",
        mode="train",
        config=config.from_dict(cuda_at_import, check_imports=False).to_dict(),
        knobs=Knobs(num_workers=2, prefetch_factor=2, pin_memory=True, batch_size=64),
    )
    fresh = run_trial(spec, tmp_path / "fresh", 120)
    assert fresh.status == "ok" and fresh.started_by == "interpreter", fresh
    assert "initialised CUDA" in fresh.fork_server_refused


@pytest.mark.parametrize("decode", ["gpu", "gpu-overlap"])
def test_jpegs_decoded_and_augmented_on_the_gpu(tmp_path: Path, decode: str):
    """decode: gpu: the workers read bytes, the step decodes and augments the batch on the device (gpu-overlap:
    one batch ahead, on a stream of its own); the trial measures end to end and trains (a finite loss), and the
    compute ceiling stages an already decoded batch."""
    cfg = _cnn_config()
    cfg["workload"]["dataset"] = "tunekit.workloads.images:synthetic_jpeg"
    cfg["workload"]["dataset_args"] = {
        "num_images": 256,
        "crop": 64,
        "width": 160,
        "height": 120,
        "decode": decode,
        "num_classes": 10,
        "cache_dir": str(tmp_path / "cache"),
    }
    resolved = config.from_dict(cfg).to_dict()
    for number, (mode, workers) in enumerate([("train", 2), ("compute", 0)]):
        knobs = Knobs(num_workers=workers, prefetch_factor=2 if workers else None, pin_memory=True, batch_size=64)
        m = run_trial(
            TrialSpec(number=number, stage="single", mode=mode, config=resolved, knobs=knobs), tmp_path / mode, 300
        )
        assert m.status == "ok", m
        assert m.rate > 0 and 0 < m.gpu_busy_frac <= 1
        assert m.input_on_device is (mode == "train")  # what the gpu-preprocessing verdict reads
        assert m.input_ahead is (mode == "train" and decode == "gpu-overlap")
        assert 0 <= m.device_input_wait_frac <= 1


PINNED_SCRIPT = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,)))
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
seen = set()
for epoch in range(1000):
    for x, y in DataLoader(data, batch_size=32, shuffle=True):
        seen.add(x.is_pinned())
        with open(sys.argv[1], "w") as fh:
            fh.write(repr(sorted(seen)))
        loss = torch.nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_scripts_compute_ceiling_copies_a_pinned_batch(tmp_path: Path):
    """Script mode's compute trial feeds the script's loop one ready batch; on a GPU it is pinned (the fastest copy a
    loader can give, so the ceiling bounds the pinned end-to-end trials), though the loader and the knobs are not."""
    import sys

    script, seen = tmp_path / "train.py", tmp_path / "pinned.txt"
    script.write_text(PINNED_SCRIPT)
    raw = {
        "name": "pinned",
        "device": "cuda",
        "script": {"command": [sys.executable, str(script), str(seen)], "cwd": str(tmp_path)},
        "search": {"num_workers": [0], "batch_size": [32], "pin_memory": [False]},
        "trial": {"window_s": 0.3, "measure_windows": 2, "precision": None, "warmup_steps": 1},
    }
    cfg = config.from_dict(raw, source=str(tmp_path / "cfg.yaml")).to_dict()
    spec = TrialSpec(number=0, stage="compute", mode="compute", knobs=Knobs(batch_size=32), config=cfg)
    m = run_trial(spec, tmp_path / "t", 120)
    assert m.status == "ok", m.reason
    assert seen.read_text() == "[True]"
    assert m.loader_measured["pin_memory"] is False


def test_a_cuda_script_trial_ends_whole_and_runs_what_it_asked(tmp_path: Path):
    """On the GPU: a script that evaluates with a spawn-context loader and leaves a helper in its own session, its
    pinned knobs filled into its flags: measured, nothing asked that it did not run, the helper ended with it."""
    import psutil

    from tests.launch.test_ending import FAULTY, QUICK, _gone, _pids

    command = [
        sys.executable,
        str(FAULTY),
        "-j",
        "{num_workers}",
        "-b",
        "{batch_size}",
        "--pin",
        "{pin_memory}",
        "--cuda",
        "--fault",
        "setsid",
    ]
    raw = {
        "name": "faulty",
        "device": "cuda",
        "script": {"command": command, "cwd": str(tmp_path), "env": {"FAULTY_PIDS": str(tmp_path / "pids")}},
        "search": {"num_workers": [2], "batch_size": [64], "pin_memory": [True]},
        "trial": dict(QUICK),
    }
    spec = TrialSpec(
        number=0,
        stage="single",
        mode="train",
        config=config.from_dict(raw).to_dict(),
        knobs=Knobs(num_workers=2, prefetch_factor=2, batch_size=64, pin_memory=True),
    )
    m = run_trial(spec, tmp_path / "t", 120)
    assert m.status == "ok", m.reason
    assert m.asked is None and m.params["pin_memory"] is True, (m.asked, m.params)
    assert _pids(tmp_path) and all(_gone(pid) for pid in _pids(tmp_path)), [
        p for p in _pids(tmp_path) if psutil.pid_exists(p)
    ]
