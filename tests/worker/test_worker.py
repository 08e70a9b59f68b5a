"""A trial's worker process (tunekit/worker/): the measurement.json it writes, and its end with the launcher that
started it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import sleepy_config
from tests.launch.test_procs import _alive
from tests.worker.test_meter import _spec
from tunekit.launch import run_trial


def test_tiny_trial_reports_the_contract(tmp_path: Path):
    cfg = sleepy_config(**{"trial.window_s": 0.5})
    m = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "t", 60)
    assert m.status == "ok", m
    on_disk = json.loads((tmp_path / "t" / "measurement.json").read_text())
    assert on_disk["version"] == 2 and on_disk["rate"] == m.rate and on_disk["unit"] == "samples"
    assert on_disk["started_by"] and on_disk["launcher_wall_s"] > 0  # the launcher's fields, added
    for key in (
        "rate",
        "rate_windows",
        "noise_cv",
        "step_time_s",
        "data_wait_frac",
        "gpu_busy_frac",
        "nvml",
        "device_mem_peak_reserved_bytes",
        "headroom",
        "host_mem_peak_bytes",
        "cpu_util_cores",
        "warmup_s",
        "compile_s",
        "device_name",
        "versions",
        "params",
    ):
        assert key in on_disk, key
    assert len(m.rate_windows) == 2
    assert m.gpu_busy_frac is None and m.nvml is None  # CPU: no GPU figures, not zeros
    assert m.params["num_workers"] == 2 and m.params["prefetch_factor"] == 2
    assert m.host_processes >= 3  # the main process and two loader workers were measured
    # the first batch, what the 2 workers x prefetch 2 had ready (set aside, at most the fill), a warm-up step
    assert 0 <= m.warmup_set_aside <= 2 * 2 and m.warmup_batches >= 1 + m.warmup_set_aside + 1
    assert 0 < m.headroom < 1 and m.headroom_basis == "host"
    assert m.epoch_boundary_in_trial is False
    # the parts the worker times lie within its trial time, the loader's start and the teardown among them
    parts = ("cuda_init_s", "build_s", "loop_setup_s", "warmup_s", "measured_s", "teardown_s")
    assert all(getattr(m, p) >= 0 for p in parts) and m.teardown_s > 0
    assert sum(getattr(m, p) for p in parts) <= m.trial_s
    assert (tmp_path / "t" / "spec.json").exists() and (tmp_path / "t" / "worker.log").exists()


def test_trial_dies_with_its_launcher(tmp_path: Path):
    """A sweep killed with SIGKILL cannot clean up: the trial's own watchdog kills its process group."""
    pids = tmp_path / "pids"
    pids.mkdir()
    cfg = sleepy_config(
        **{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "hang_at": 3, "pid_dir": str(pids)}}
    )
    spec = _spec(cfg, num_workers=2, prefetch_factor=2, batch_size=4)
    code = (
        "import json, sys; from tunekit.contract import TrialSpec; from tunekit.launch import run_trial; "
        f"run_trial(TrialSpec.from_dict(json.loads(sys.argv[1])), {str(tmp_path / 't')!r}, 300)"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec.to_dict())])
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2:  # both loader workers are serving (one of them hangs)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    worker = int((tmp_path / "t" / "worker.pid").read_text())
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    victims = [worker, *(int(p.name) for p in pids.iterdir())]
    while any(_alive(pid) for pid in victims):
        assert time.monotonic() < deadline, [pid for pid in victims if _alive(pid)]
        time.sleep(0.2)
