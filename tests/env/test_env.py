"""Tests for tunekit.env that run without a GPU."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import pynvml
import pytest

from tests.conftest import measurement
from tunekit import env
from tunekit.env import _nvml, _snapshot, datasheet_flops, environment_warnings
from tunekit.records import rows_from_measurements

HAS_NVIDIA_SMI = shutil.which("nvidia-smi") is not None


def _run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter and return its stripped stdout."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def snap() -> dict:
    return env.snapshot()


def test_snapshot_is_json_serialisable(snap: dict) -> None:
    assert json.loads(json.dumps(snap)) == snap


def test_snapshot_has_expected_keys(snap: dict) -> None:
    assert {
        "python",
        "platform",
        "hostname",
        "tunekit",
        "date",
        "packages",
        "torch_cuda_build",
        "cpu",
        "memory",
        "shm",
        "nvml",
        "gpus",
    } <= snap.keys()
    assert set(snap["packages"]) == {
        "torch",
        "torchvision",
        "optuna",
        "numpy",
        "pillow",
        "pandas",
        "matplotlib",
        "pynvml",
    }
    assert set(snap["cpu"]) == {"logical", "physical", "affinity", "usable", "limits", "limited_by", "model"}
    assert set(snap["nvml"]) == {"available", "error", "driver_version", "cuda_driver_version"}
    assert snap["date"].endswith("+00:00")


def test_cpu_and_memory(snap: dict) -> None:
    assert snap["cpu"]["logical"] == os.cpu_count()
    if hasattr(os, "sched_getaffinity"):
        assert snap["cpu"]["affinity"] == len(os.sched_getaffinity(0))
    mem = snap["memory"]
    assert 0 < mem["available_bytes"] <= mem["total_bytes"]
    if os.path.exists("/dev/shm"):
        assert snap["shm"]["path"] == "/dev/shm"
        assert 0 <= snap["shm"]["free_bytes"] <= snap["shm"]["total_bytes"]


def test_package_versions_match_metadata(snap: dict) -> None:
    assert snap["packages"]["torch"] == importlib.metadata.version("torch")
    assert snap["packages"]["pynvml"] == importlib.metadata.version("nvidia-ml-py")
    from tunekit import __version__

    assert snap["tunekit"] == __version__


def test_torch_cuda_build_matches_torch(snap: dict) -> None:
    expected = _run_python("import torch; print(torch.version.cuda)")
    assert str(snap["torch_cuda_build"]) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("from typing import Optional\ncuda: Optional[str] = '13.0'\n", "13.0"),
        ("cuda = '12.8'\ncudnn = '9'\n", "12.8"),
        ("cuda: Optional[str] = None\n", None),
        ("hip = '6.2'\n", None),
    ],
)
def test_parse_cuda_line(text: str, expected: str | None) -> None:
    assert _snapshot._parse_cuda_line(text) == expected


@pytest.mark.skipif(HAS_NVIDIA_SMI, reason="an NVIDIA driver is present on this host")
def test_no_nvml_without_driver(snap: dict) -> None:
    assert snap["nvml"]["available"] is False
    assert snap["nvml"]["error"]
    assert snap["gpus"] == []


@pytest.mark.skipif(HAS_NVIDIA_SMI, reason="an NVIDIA driver is present on this host")
def test_sampler_raises_clear_error_without_driver() -> None:
    with pytest.raises(RuntimeError, match="NVML unavailable"):
        env.NvmlSampler(0)


def test_snapshot_does_not_import_torch() -> None:
    code = "import tunekit.env, sys; tunekit.env.snapshot(); print('torch' in sys.modules)"
    assert _run_python(code) == "False"


def test_format_text(snap: dict) -> None:
    text = env.format_text(snap)
    assert isinstance(text, str)
    assert f"{os.cpu_count()} logical" in text
    assert "NVML" in text
    if not snap["nvml"]["available"]:
        assert f"NVML     : not available ({snap['nvml']['error']})" in text
    assert 5 <= len(text.splitlines()) <= 25 + 10 * len(snap["gpus"])
    json_round_trip = env.format_text(json.loads(json.dumps(snap)))
    assert json_round_trip == text


def _fake_gpu() -> dict:
    return {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-1234",
        "memory": {"total_bytes": 150 * 1024**3, "used_bytes": 3 * 1024**3 // 2, "free_bytes": None},
        "clocks": {"sm_mhz": 1980, "mem_mhz": 3201, "sm_max_mhz": 1980, "mem_max_mhz": 3201},
        "temperature_c": 41,
        "power": {"draw_w": 312.5, "limit_w": 700.0},
        "utilization": {"gpu_pct": 97, "mem_pct": 40},
        "throttle_reasons": ["sw_power_cap"],
        "pcie": {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16},
        "processes": [{"pid": 4321, "name": "python", "used_bytes": 1024**3}],
    }


def test_format_text_gpu_block(snap: dict) -> None:
    fake = dict(
        snap,
        nvml={"available": True, "error": None, "driver_version": "580.1", "cuda_driver_version": "13.0"},
        gpus=[_fake_gpu()],
    )
    text = env.format_text(fake)
    assert "driver 580.1" in text
    assert "GPU 0: NVIDIA H200 (GPU-1234)" in text
    assert "1.5 GiB used of 150.0 GiB" in text
    assert "sw_power_cap" in text
    assert "4321 python 1.0 GiB" in text
    assert len(text.splitlines()) <= 25


def test_decode_reasons_synthetic_mask() -> None:
    mask = (
        pynvml.nvmlClocksEventReasonGpuIdle
        | pynvml.nvmlClocksEventReasonSwPowerCap
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    )
    assert _nvml._decode_reasons(mask, pynvml) == [
        "gpu_idle",
        "sw_power_cap",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    ]


def test_decode_reasons_all_named_bits() -> None:
    mask = pynvml.nvmlClocksEventReasonAll
    names = _nvml._decode_reasons(mask, pynvml)
    assert names is not None
    assert {
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clock_setting",
    } == set(names)
    assert "user_defined_clocks" not in names  # deprecated alias of applications_clocks_setting


def test_decode_reasons_edge_cases() -> None:
    assert _nvml._decode_reasons(0, pynvml) == []
    assert _nvml._decode_reasons(None, pynvml) is None
    unknown = 1 << 40
    assert _nvml._decode_reasons(unknown | pynvml.nvmlClocksEventReasonSyncBoost, pynvml) == [
        "sync_boost",
        f"unknown_{unknown:#x}",
    ]


def test_decode_reasons_throttle_only_bits() -> None:
    board_limit = getattr(pynvml, "nvmlClocksThrottleReasonBoardLimit", None)
    if board_limit is None:
        pytest.skip("this pynvml has no nvmlClocksThrottleReasonBoardLimit")
    assert _nvml._decode_reasons(board_limit, pynvml) == ["board_limit"]


def test_format_cuda_driver() -> None:
    assert _nvml._format_cuda_driver(13000) == "13.0"
    assert _nvml._format_cuda_driver(12080) == "12.8"
    assert _nvml._format_cuda_driver(None) is None


class _FakeNvmlError(Exception):
    pass


class _FakeNvml:
    """Stands in for pynvml: one query fails, one is missing, the rest answer."""

    NVMLError = _FakeNvmlError

    @staticmethod
    def nvmlDeviceGetName(handle: object) -> bytes:
        return b"Fake GPU"

    @staticmethod
    def nvmlDeviceGetPowerUsage(handle: object) -> int:
        raise _FakeNvmlError("Not Supported")

    @staticmethod
    def nvmlDeviceGetCurrentClocksThrottleReasons(handle: object) -> int:
        return 0x4


def test_guarded_calls_with_fake_nvml() -> None:
    nv = _FakeNvml()
    assert _nvml._text(_nvml._call(nv, "nvmlDeviceGetName", None)) == "Fake GPU"
    assert _nvml._call(nv, "nvmlDeviceGetPowerUsage", None) is None
    assert _nvml._call(nv, "nvmlDeviceGetUUID", None) is None
    assert _nvml._power(nv, None) == {"draw_w": None, "limit_w": None}
    # Falls back to the older function name when the newer one is missing.
    mask = _nvml._call(
        nv, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), None
    )
    assert mask == 0x4


def test_multi_rank_sweep_warns_of_gpus_without_nvlink():
    from tests.conftest import sleepy_config
    from tunekit import config
    from tunekit.env import sweep_warnings

    env = {
        "nvml": {
            "interconnect": [
                {"gpus": [0, 1], "nvlink": False, "pcie_path": "one PCIe switch"},
                {"gpus": [0, 2], "nvlink": False, "pcie_path": "one PCIe switch"},
                {"gpus": [1, 2], "nvlink": True, "pcie_path": "one PCIe switch"},
            ]
        }
    }
    two = config.from_dict(sleepy_config(**{"launch.nproc_per_node": 2}))
    warnings = [w for w in sweep_warnings(two, env) if "NVLink" in w]
    assert len(warnings) == 1 and "GPUs 0 and 1" in warnings[0] and "one PCIe switch" in warnings[0]
    assert not [w for w in sweep_warnings(config.from_dict(sleepy_config()), env) if "NVLink" in w]


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


def test_environment_warnings():
    env = {
        "cpu": {"affinity": 8},
        "shm": {"total_bytes": 64 * 2**20},
        "torch_cuda_build": "13.0",
        "nvml": {"cuda_driver_version": "12.8"},
        "gpus": [
            {
                "index": 0,
                "name": "H200",
                "processes": [{"pid": 9, "name": "train.py"}],
                "throttle_reasons": ["gpu_idle", "hw_thermal_slowdown"],
                "temperature_c": 90,
                "pcie": {"width": 8, "width_max": 16},
            }
        ],
    }
    text = "\n".join(environment_warnings(env, max_workers=16, batch_bytes=2**20 * 8, prefetch=2))
    for fragment in (
        "above the 8 usable CPUs",
        "/dev/shm holds 64 MiB but 16 workers x prefetch 2 x 8 MiB batches need about 256 MiB",
        "built for CUDA 13.0",
        "1 other process(es): train.py (pid 9)",
        "hw_thermal_slowdown",
        "at 90 C",
        "x8 of x16",
    ):
        assert fragment in text
    assert "gpu_idle" not in text
    assert environment_warnings({"cpu": {"affinity": 8}, "gpus": []}, max_workers=4) == []


def test_the_shm_warning_is_sized_from_the_measured_batch_for_any_workload():
    """A text workload has no crop: before a trial there is nothing to size /dev/shm against; once a trial has
    measured its batch (2 MiB at batch 64), the warning scales it to the largest workers x prefetch x batch searched
    (8 x 4 x batch 128: 128 MiB) against an 8 MiB /dev/shm."""
    from tunekit import config
    from tunekit.env import sweep_warnings

    cfg = config.from_dict(
        {
            "name": "t",
            "device": "cpu",
            "workload": {
                "model": "tunekit.workloads.synthetic:sleepy_model",
                "dataset": "tunekit.workloads.synthetic:sleepy_dataset",
            },
            "search": {"num_workers": [0, 8], "prefetch_factor": [2, 4], "batch_size": [64, 128]},
        }
    )
    env = {"cpu": {"affinity": 16}, "shm": {"total_bytes": 8 * 2**20}}
    assert not any("/dev/shm" in w for w in sweep_warnings(cfg, env))
    rows = rows_from_measurements([measurement(0, "compute", "compute", 100.0, batch_bytes=2 * 2**20)])
    text = "\n".join(sweep_warnings(cfg, env, rows))
    assert "/dev/shm holds 8 MiB but 8 workers x prefetch 4 x 4 MiB batches need about 128 MiB" in text


def test_datasheet_figures_for_known_names_only():
    assert datasheet_flops("NVIDIA H200", "bf16") == 989e12
    assert datasheet_flops("NVIDIA H100 80GB HBM3", "tf32") == 494e12
    assert datasheet_flops("NVIDIA H100 PCIe", "fp16") == 756e12
    assert datasheet_flops("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert datasheet_flops("NVIDIA H100 NVL", "bf16") is None
    assert datasheet_flops("CPU: Intel Xeon", "fp32") is None
