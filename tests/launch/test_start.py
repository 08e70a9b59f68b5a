"""How a trial starts (tunekit/launch/_start.py): the worker's and the script's command lines, and torchrun's when
the config launches several ranks."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import sleepy_config
from tests.worker.script.test_session import _no_process_runs, _script_config
from tests.worker.test_dist import DDP_SCRIPT
from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial, script_command, worker_command


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


def test_the_command_to_apply_leaves_out_the_trials_own_arguments_and_the_scripts_defaults(tmp_path: Path):
    """``script.trial_args`` (``--epochs 1000``, so the loop outlasts a trial) are the trials' alone, and a knob at
    the script's own default needs no flag: the "Apply it" command repeated both."""
    raw = _script_config(tmp_path, [sys.executable, "train.py", "-j", "{num_workers}", "-b", "{batch_size}"])
    raw["script"]["trial_args"] = ["--epochs", "1000"]
    spec = TrialSpec(
        number=3,
        stage="end_to_end",
        mode="train",
        knobs=Knobs(num_workers=4, batch_size=64),
        config=config.from_dict(raw).to_dict(),
    )
    assert script_command(spec)[-6:] == ["-j", "4", "-b", "64", "--epochs", "1000"]
    assert script_command(spec, trial=False)[-4:] == ["-j", "4", "-b", "64"]
    assert script_command(spec, trial=False, leave_out={"batch_size"})[-2:] == ["-j", "4"]


def test_a_rank_that_fails_is_named_and_the_launch_section_wraps_a_python_command(tmp_path: Path):
    """With launch.nproc_per_node and `python train.py`, trials run under torchrun; a rank whose script raises is
    the trial's reason, by rank."""
    script = tmp_path / "train.py"
    script.write_text(
        DDP_SCRIPT.replace(
            "    for x, y in train:",
            "    if dist.get_rank() == 1:\n"
            "        raise ValueError('rank one cannot read its shard')\n"
            "    for x, y in train:",
        )
    )
    raw = {
        **_script_config(tmp_path, [sys.executable, str(script), "-j", "{num_workers}"]),
        "launch": {"nproc_per_node": 2},
    }
    spec = TrialSpec(
        number=0,
        stage="single",
        mode="train",
        knobs=Knobs(num_workers=0, batch_size=8, ranks=2),
        config=config.from_dict(raw).to_dict(),
    )
    assert script_command(spec)[:3] == [sys.executable, "-m", "torch.distributed.run"]
    m = run_trial(spec, tmp_path / "failed", 120)
    assert m.status == "crashed" and "rank 1" in m.reason and "cannot read its shard" in m.reason, m.reason
    assert "\n" not in m.reason
    assert _no_process_runs(str(script))
