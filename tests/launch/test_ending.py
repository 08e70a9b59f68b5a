"""How a trial that ended says why (tunekit/launch/_ending.py): a script's exit by where the script was, a killed
process by its signal, output that is no measurement, a rank's failure by its rank. The helpers of the trials of
tests/_faulty.py, a tiny CPU training script with a --fault switch, live here."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import REPO, sleepy_config
from tests.worker.test_meter import _spec
from tunekit import config, launch
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial

FAULTY = REPO / "tests" / "_faulty.py"
QUICK = {"window_s": 0.4, "measure_windows": 2, "precision": None, "warmup_steps": 1, "timeout_s": 60}


def _raw(tmp_path: Path, fault: str, python: str = sys.executable, **trial: Any) -> dict[str, Any]:
    """A script config of the faulty script; its lingering helpers write their pids to tmp_path/pids."""
    command = [python, str(FAULTY), "-j", "{num_workers}", "-b", "{batch_size}", "--fault", fault]
    return {
        "name": "faulty",
        "device": "cpu",
        "script": {"command": command, "cwd": str(tmp_path.parent), "env": {"FAULTY_PIDS": str(tmp_path / "pids")}},
        "search": {"num_workers": [0, 2], "batch_size": [8], "pin_memory": [False]},
        "trial": {**QUICK, **trial},
    }


def _faulty_trial(tmp_path: Path, fault: str, workers: int = 2, **trial: Any):
    cfg = config.from_dict(_raw(tmp_path, fault, **trial), source=str(tmp_path / "cfg.yaml")).to_dict()
    spec = TrialSpec(number=0, stage="single", mode="train", knobs=Knobs(num_workers=workers, batch_size=8), config=cfg)
    return launch.run_trial(spec, tmp_path / "t", 60)


def _pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "pids"
    return [int(line.split()[-1]) for line in path.read_text().split("\n") if line.strip()] if path.exists() else []


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    "fault, words",
    [
        ("exit5", "the script exited with code 5 after batch 2 of its training loader"),
        ("nobatch", "the script exited with code 0 before its training loader's first batch"),
    ],
)
def test_a_script_that_ends_says_where_it_was(tmp_path: Path, fault: str, words: str):
    """os._exit and an exit before the first batch leave no record: the script's marks say where it was (they read
    "exit code 5: the trial failed without a message" and "the worker exited 0 but wrote no measurement.json");
    argparse's rejection is tests/worker/script/test_session.py's."""
    m = _faulty_trial(tmp_path, fault, workers=0)
    assert m.status == "crashed" and m.reason.startswith(words), m.reason


# each rank: 8 samples per 50 ms step (160/s), two workers deliver 1000/s: the model is the bound, so two ranks
# should give twice one rank's throughput, less what the gradient all-reduce costs
SLEEPY = {
    "workload.model_args": {"step_wait_s": 0.05},
    "workload.dataset_args": {"sample_wait_s": 0.002},
    "launch.nproc_per_node": 2,
}


def _rank_spec(cfg: dict, **knobs) -> TrialSpec:
    return TrialSpec(
        number=0, stage="single", mode="train", knobs=Knobs(**knobs), config=config.from_dict(cfg).to_dict()
    )


def _trial_processes(trial_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(trial_dir) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_a_crashed_rank_is_crashed_with_its_message(tmp_path: Path):
    cfg = sleepy_config(**{**SLEEPY, "workload.step": "tests._workloads:rank1_raises_step"})
    m = run_trial(_rank_spec(cfg, num_workers=0, batch_size=4, ranks=2), tmp_path / "t", 120)
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

    spec = _rank_spec(sleepy_config(**SLEEPY), num_workers=0, batch_size=4, ranks=2)
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
    m = run_trial(_rank_spec(cfg, num_workers=0, batch_size=4, ranks=2), tmp_path / "t", 120)
    assert m.status == "crashed", m
    assert m.reason.startswith("rank 1 (local rank 1) was killed by SIGKILL"), m.reason
    assert "OOM killer" in m.reason and "\n" not in m.reason
    assert not _trial_processes(tmp_path / "t")


def test_killed_worker_process_is_crashed_with_signal(tmp_path: Path):
    cfg = sleepy_config(**{"workload.step": "tests._workloads:self_kill_step"})
    m = run_trial(_spec(cfg, num_workers=0, batch_size=4), tmp_path / "t", 60)
    assert m.status == "crashed" and "SIGKILL" in m.reason and m.returncode == -9


def test_bad_output_is_detected(tmp_path: Path):
    from tunekit.launch import classify as _outcome

    spec = _spec(sleepy_config(), num_workers=0)
    out = tmp_path / "measurement.json"
    out.write_text("{not json")
    assert _outcome(spec, 0, False, 60, out, tmp_path / "log").status == "bad_output"
    out.write_text(json.dumps({"status": "ok", "samples_per_s": float("nan")}))  # version 1, as the worker writes
    assert "rate = nan is not a finite" in _outcome(spec, 0, False, 60, out, tmp_path / "log").reason
    out.write_text(
        json.dumps(
            {
                "version": 2,
                "status": "ok",
                "rate": 0.0,
                "rate_windows": [0.0],
                "noise_cv": 0.0,
                "step_time_s": 1.0,
                "data_wait_frac": 0.0,
                "headroom": 0.5,
                "warmup_s": 1.0,
            }
        )
    )
    assert "rate = 0.0 is not positive" in _outcome(spec, 0, False, 60, out, tmp_path / "log").reason
    out.write_text(json.dumps({"version": 99, "status": "ok"}))
    assert _outcome(spec, 0, False, 60, out, tmp_path / "log").status == "bad_output"
    out.unlink()
    assert _outcome(spec, 0, False, 60, out, tmp_path / "log").status == "bad_output"
