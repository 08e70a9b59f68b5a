"""Script mode, whole: the examples swept unedited (images, text in tokens), a sweep of a command without a
config, and scripts under torchrun. Split from test_script.py so the two run side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.test_script import QUICK, SLEEPY_SCRIPT, _no_process_runs, _script_config, _trial
from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial, script_command
from tunekit.workloads.synthetic import expected_samples_per_s


def _example_sweep(
    tmp_path: Path,
    folder: str,
    command: list[str],
    workers: list[int],
    trial: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[Any, Path]:
    """A grid sweep of an example script, run unedited, through the Python API (``tunekit sweep`` of the same
    config: test_sweep_script_without_a_config_keeps_the_scripts_own_batch runs the command line)."""
    import tunekit

    raw = {
        "name": folder,
        "device": "cpu",
        "strategy": "grid",
        "script": {"command": command, "cwd": str(REPO / "examples" / folder), **extra},
        "search": {"num_workers": workers, "batch_size": [8], "pin_memory": [False]},
        "trial": {**QUICK, **(trial or {})},
        "selection": {"repeats": 0},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    return tunekit.sweep(path, out=out), out


def test_the_image_example_is_swept_unedited(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    run, out = _example_sweep(
        tmp_path,
        "image_classifier",
        [
            sys.executable,
            "train.py",
            "--data",
            str(tmp_path / "data"),
            "--make-data",
            "64",
            "--crop",
            "32",
            "--out",
            str(ckpt),
            "--arch",
            "squeezenet1_1",
            "-j",
            "{num_workers}",
            "-b",
            "{batch_size}",
        ],
        [1],
        trial_args=["--epochs", "1000"],
    )
    assert run.recommendation is not None, run.reason
    measured = {m["stage"]: m for m in (json.loads(p.read_text()) for p in (out / "trials").glob("*/measurement.json"))}
    assert len(list((out / "trials").glob("*/measurement.json"))) == 2  # the script's own settings, 1 config
    assert all(m["status"] == "ok" for m in measured.values()), {k: m.get("reason") for k, m in measured.items()}
    assert {m["loader_measured"]["dataset"] for m in measured.values()} == {"ImageFolder"}
    own = measured["baseline"]["loader_measured"]
    assert (own["num_workers"], own["batch_size"]) == (2, 64)  # train.py's own -j and -b defaults
    rec = yaml.safe_load((out / "recommended.yaml").read_text())
    workers = rec["dataloader"]["num_workers"]
    if rec["evidence"]["keep_own_settings"]:  # batch 8 on 1 worker did not beat its own 2 workers, batch 64
        assert (workers, rec["dataloader"]["batch_size"]) == (2, 64)
        assert rec["script"]["command"][-2:] == ["--arch", "squeezenet1_1"]  # its own -j and -b: no flag needed
        assert rec["script"]["set_on_dataloader"] == {}  # the loader stays as the script builds it
    else:
        assert workers == 1 and rec["script"]["command"][-4:] == ["-j", "1", "-b", "8"]
        # what the knee's trial ran with: pinning set on the loader, and its workers kept across epochs
        assert "persistent_workers" in rec["script"]["set_on_dataloader"]
    assert "--epochs" not in rec["script"]["command"]  # script.trial_args: the trials' alone
    report = (out / "report.md").read_text()
    assert "The script's own settings (2 workers, batch 64" in report and "Apply it: run `" in report
    # what has no flag is set where the script builds its training loader: that line, relative to its folder
    source = (REPO / "examples" / "image_classifier" / "train.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.lstrip().startswith("loader = DataLoader("))
    assert rec["script"]["dataloader_built_at"] == f"train.py:{line}", rec["script"]
    kept = rec["evidence"]["keep_own_settings"]
    assert (f"(the script builds it at train.py:{line})" in report) == (not kept)  # nothing to set when kept
    # an epoch that ended inside a trial ran the script's own checkpoint (its work between epochs is measured);
    # none beyond: the trial ended the script at its last window, its remaining epochs never ran
    written = sorted(int(p.stem.removeprefix("epoch")) for p in ckpt.glob("epoch*.pt"))
    assert len(written) <= max(m["epochs_ended"] for m in measured.values()) < 1000
    assert _no_process_runs(str(ckpt))


def test_the_text_example_is_swept_in_tokens(tmp_path: Path):
    run, out = _example_sweep(
        tmp_path,
        "text_lm",
        [
            sys.executable,
            "train.py",
            "--steps",
            "100000",
            "--dim",
            "32",
            "--max-len",
            "64",
            "-j",
            "{num_workers}",
            "-b",
            "{batch_size}",
        ],
        [1],
        count="data:count_tokens",
        unit="tokens",
        # epochs of 1,250 batches (20,000 documents at its own -b 16): the script's own settings would wait up to a
        # third of the timeout to see two of their ends; they are not what this test is about
        trial={"timeout_s": 45},
    )
    assert run.recommendation is not None, run.reason
    measured = [json.loads(p.read_text()) for p in (out / "trials").glob("*/measurement.json")]
    assert all(m["status"] == "ok" and m["unit"] == "tokens" for m in measured), measured
    # documents of 16 to 64 tokens: a batch of b holds 16 b to 64 b real ones (the script's own baseline runs its
    # own -b 16, the other the searched 8)
    assert all(
        16 * m["params"]["batch_size"] <= m["items_per_batch_mean"] <= 64 * m["params"]["batch_size"] for m in measured
    ), [(m["params"]["batch_size"], m["items_per_batch_mean"]) for m in measured]
    assert sorted(m["params"]["batch_size"] for m in measured) == [8, 16]
    assert "tokens/s" in (out / "report.md").read_text()
    assert not (REPO / "examples" / "text_lm" / "lm.pt").exists()


def test_sweep_script_without_a_config_keeps_the_scripts_own_batch(tmp_path: Path):
    """tunekit sweep --script: no YAML; the command fills only the workers, so the batch is the script's own (its
    baseline's loader had 8), and a --set list of workers narrows the machine's search."""
    sleepy_script = tmp_path / "train.py"
    sleepy_script.write_text(SLEEPY_SCRIPT)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunekit",
            "sweep",
            "--script",
            f"{sys.executable} {sleepy_script} -j {{num_workers}}",
            "--name",
            "own",
            "--strategy",
            "grid",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--set",
            "device=cpu",
            "--set",
            "search.num_workers=[0, 2]",
            "--set",
            "search.pin_memory=[false]",
            "--set",
            "search.prefetch_factor=[2]",
            "--set",
            "trial.window_s=0.5",
            "--set",
            "trial.precision=null",
            "--set",
            "trial.measure_windows=2",
            "--set",
            "selection.repeats=0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr + run.stdout
    measured = [json.loads(p.read_text()) for p in (tmp_path / "run" / "trials").glob("*/measurement.json")]
    assert sorted(m["stage"] for m in measured) == ["baseline", "grid", "grid"]
    assert {m["params"]["batch_size"] for m in measured} == {8}  # SLEEPY_SCRIPT's own -b default
    rec = yaml.safe_load((tmp_path / "run" / "recommended.yaml").read_text())
    assert rec["script"]["set_on_dataloader"]["batch_size"] == 8
    both = subprocess.run(
        [sys.executable, "-m", "tunekit", "sweep", "some.yaml", "--script", "python t.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert both.returncode == 2 and "exactly one" in both.stderr


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


def test_script_mode_refuses_several_nodes_and_a_non_python_command_under_launch(write_config):
    bad = write_config(
        {"name": "s", "script": {"command": "./train.sh -j {num_workers}"}, "launch": {"nproc_per_node": 2}}
    )
    with pytest.raises(config.ConfigError, match="not a Python interpreter"):
        config.load(bad)
    nodes = write_config(
        {
            "name": "s",
            "script": {"command": "python t.py"},
            "launch": {"nproc_per_node": 2, "nnodes": 2, "rdzv_endpoint": "h:1"},
        },
        "n.yaml",
    )
    with pytest.raises(config.ConfigError, match="launch.nnodes: script mode runs a trial's ranks on one node"):
        config.load(nodes)
    clash = write_config(
        {"name": "s", "script": {"command": "torchrun --nproc-per-node 4 t.py"}, "launch": {"nproc_per_node": 2}},
        "c.yaml",
    )
    with pytest.raises(config.ConfigError, match="differs from the command's --nproc-per-node 4"):
        config.load(clash)
