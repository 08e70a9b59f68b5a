"""Script mode on the loops scripts really run: epochs with an evaluation between them, a loader's restart, a loader
built anew each epoch, trainers that build the loader themselves (Hugging Face, Lightning), a stream without a length,
threads, and the command that applies the result. Split from test_script.py so the two run side by side."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_script import QUICK, SLEEPY_SCRIPT, _script_config, _trial
from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial, script_command
from tunekit.workloads.synthetic import expected_samples_per_s


def test_a_loop_without_autograd_gets_the_loader_that_gives_the_most_batches(tmp_path: Path):
    """A loop that trains under no_grad (a forward-only update) after an evaluation pass: no loader is iterated
    with autograd enabled, so the one iterated again with the most batches is measured, from its second epoch."""
    script = tmp_path / "train.py"
    script.write_text(
        SLEEPY_SCRIPT.replace(
            "for epoch in range(args.epochs):", "torch.set_grad_enabled(False)\nfor epoch in range(args.epochs):"
        )
        .replace(
            "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n",
            "        model.fc.bias.add_(-0.01 * loss)\n",
        )
        .replace("sleepy_dataset(sample_wait_s=0.005)", "sleepy_dataset(num_samples=48, sample_wait_s=0.005)")
    )
    m = _trial(
        tmp_path,
        _script_config(tmp_path, [sys.executable, str(script), "-b", "{batch_size}", "--eval-first"]),
        num_workers=0,
        batch_size=8,
    )
    assert m.status == "ok", m.reason
    assert m.loader_measured["index"] == 2 and m.loader_measured["found_by"].startswith("the most batches")
    assert m.epochs_ended >= 1  # 6 batches an epoch: the measurement went on across the script's epochs


def test_the_scripts_own_work_between_epochs_is_measured(tmp_path: Path):
    """An epoch of 6 batches, then 0.25 s of the script's own work (a checkpoint, say) before its next epoch: the
    script sees each epoch end and its work lands in the windows, as in its own runs. At 8 samples per 20 ms step
    (400/s with 2 workers), 48 samples take 0.12 s + 0.25 s: about 130/s, not 400."""
    script = tmp_path / "train.py"
    script.write_text(
        SLEEPY_SCRIPT.replace(
            "sleepy_dataset(sample_wait_s=0.005)", "sleepy_dataset(num_samples=48, sample_wait_s=0.005)"
        ).replace(
            '    torch.save(model.state_dict(), os.path.join(os.path.dirname(__file__), f"epoch{epoch}.pt"))',
            "    import time; time.sleep(0.25)",
        )
    )
    raw = _script_config(tmp_path, [sys.executable, str(script), "-j", "{num_workers}", "-b", "{batch_size}"])
    raw["trial"] = {**QUICK, "window_s": 1.0}
    m = _trial(tmp_path, raw, num_workers=2, prefetch_factor=2, batch_size=8)
    assert m.status == "ok", m.reason
    assert m.epochs_ended >= 2
    # epochs within two windows' time: each window holds whole epochs, so each holds the same share of the 0.25 s
    assert m.epoch_batches == 6 and all(steps % 6 == 0 for steps in m.steps_windows), m.steps_windows
    expected = 48 / (48 / expected_samples_per_s(2, 8, 0.005, 0.02) + 0.25)
    assert 0.6 * expected < m.rate < 1.25 * expected, (m.rate, expected)
    once = tmp_path / "once.py"  # one epoch only: the loop ends with the batches it gave, none made up
    once.write_text(
        SLEEPY_SCRIPT.replace(
            "sleepy_dataset(sample_wait_s=0.005)", "sleepy_dataset(num_samples=48, sample_wait_s=0.005)"
        )
    )
    short = _trial(
        tmp_path,
        _script_config(tmp_path, [sys.executable, str(once), "--epochs", "1"]),
        name="once",
        num_workers=0,
        batch_size=8,
    )
    assert short.status == "crashed" and "ended after 6 batch(es)" in short.reason, short.reason


def test_a_trainer_built_loader_is_measured_at_the_batch_it_yields(tmp_path: Path):
    """Hugging Face Trainer builds its loader over a batch sampler (accelerate's DataLoaderShard): a batch knob set
    on it does not take. The trial measures and records the batch the loop received (16), says what it asked (32),
    and counts 16 items a batch (it reported 32, every rate twice the truth)."""
    pytest.importorskip("transformers")
    script = REPO / "tests" / "_hf_train.py"
    raw = _script_config(
        tmp_path, [sys.executable, str(script), "--workers", "{num_workers}", "--out", str(tmp_path / "hf")]
    )
    m = _trial(tmp_path, raw, num_workers=0, batch_size=32)
    assert m.status == "ok", m.reason
    assert m.params["batch_size"] == 16 and m.loader_measured["batch_size"] == 16, m.loader_measured
    assert m.asked == {"batch_size": 32}
    assert m.items_per_batch_mean == 16
    # accelerate built the loader, called from the script's Trainer(...).train() line
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if ".train()" in text)
    assert m.loader_measured["built_by"] == "accelerate", m.loader_measured
    assert m.loader_measured["built_at"] == f"{script}:{line}", m.loader_measured


def test_an_iterable_dataset_without_a_length_is_measured(tmp_path: Path):
    """A streamed dataset has no len(): the trial is measured (it crashed after its windows, asking the loader's
    length)."""
    from tests.test_launch import _trial as faulty_trial

    m = faulty_trial(tmp_path, "stream", workers=0)
    assert m.status == "ok", m.reason
    assert m.dataset_len is None and m.loader_measured["length"] is None


@pytest.mark.parametrize("fault, ran, asked", [("none", 1, None), ("threads2", 2, {"threads": 1})])
def test_threads_are_set_in_the_scripts_process_and_recorded_as_run(
    tmp_path: Path, fault: str, ran: int, asked: dict[str, int] | None
):
    """``--set threads=1`` without a {threads} placeholder: set in the script's process at its start (the script
    kept its own count); a script that sets its own afterwards runs that, recorded with what was asked."""
    from tests.test_launch import _raw

    cfg = config.from_dict(_raw(tmp_path, fault), source=str(tmp_path / "cfg.yaml")).to_dict()
    spec = TrialSpec(
        number=0, stage="single", mode="train", knobs=Knobs(num_workers=0, batch_size=8, threads=1), config=cfg
    )
    m = run_trial(spec, tmp_path / "t", 60)
    assert m.status == "ok", m.reason
    assert m.params["threads"] == ran and m.asked == asked


def test_a_script_trial_without_knobs_runs_its_own_settings(tmp_path: Path):
    """``tunekit trial --script CMD`` without ``--set``: the script's own settings (its -b 8, its -j 0), not the
    search's first values (batch 32), and the trial says so (stage baseline)."""
    import tunekit
    from tests.test_launch import _raw

    raw = _raw(tmp_path, "none")
    raw["search"]["batch_size"] = [32]
    outcome = tunekit.trial(raw, out=tmp_path / "one")
    m = outcome.measurement
    assert m.status == "ok", m.reason
    assert m.stage == "baseline" and m.params["batch_size"] == 8 and m.params["num_workers"] == 0, m.params
    assert m.asked is None


EPOCH_EVAL_SCRIPT = """
import argparse, time, torch
from torch.utils.data import DataLoader
from tunekit.workloads.synthetic import sleepy_dataset, sleepy_model

parser = argparse.ArgumentParser()
parser.add_argument("-j", type=int, default=0)
parser.add_argument("-b", type=int, default=8)
args = parser.parse_args()
model = sleepy_model(step_wait_s=0.02)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
train = DataLoader(sleepy_dataset(num_samples=320, sample_wait_s=0.005), batch_size=args.b, num_workers=args.j,
                   shuffle=True)
for epoch in range(1000):
    for x, y in train:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # the per-epoch evaluation: 0.8 s
        time.sleep(0.8)
"""


@pytest.mark.alone
def test_an_epoch_with_evaluation_is_measured_in_its_two_parts(tmp_path: Path):
    """320 samples an epoch (40 batches of 8, 1.6 s at the known 200/s of 1 worker x 5 ms a sample, the 20 ms steps
    hidden behind it), then 0.8 s of evaluation: the windows hold the steady rate inside an epoch, quiet (windows
    that mixed the two parts spread by a third), the boundary is measured apart (waited for: the fixed windows end
    inside the first epoch), and the trial's figure is the rate over whole epochs, 320 / (320 / 200 + 0.8) = 133/s."""
    script = tmp_path / "train.py"
    script.write_text(EPOCH_EVAL_SCRIPT)
    raw = _script_config(tmp_path, [sys.executable, str(script), "-j", "{num_workers}", "-b", "{batch_size}"])
    raw["trial"] = {**QUICK, "window_s": 0.4, "measure_windows": 3}
    m = _trial(tmp_path, raw, num_workers=1, prefetch_factor=2, batch_size=8)
    assert m.status == "ok", m.reason
    steady = expected_samples_per_s(1, 8, 0.005, 0.02)
    assert m.rate_in_epoch == pytest.approx(steady, rel=0.10), m.rate_windows
    assert m.noise_cv < 0.05, m.rate_windows
    assert m.epoch_boundaries >= 2 and len(m.boundaries_s) == m.epoch_boundaries, m.boundaries_s  # waited for
    assert m.boundary_s == pytest.approx(0.8, abs=0.25), m.boundaries_s
    assert m.epoch_items == 320
    whole = 320 / (320 / m.rate_in_epoch + m.boundary_s)
    assert m.rate == pytest.approx(whole) and m.rate_whole_epoch == pytest.approx(whole)
    assert m.rate == pytest.approx(320 / (320 / steady + 0.8), rel=0.10)


RESTART_SCRIPT = EPOCH_EVAL_SCRIPT.replace(
    "args = parser.parse_args()",
    'parser.add_argument("--pin", default="False")\nparser.add_argument("--prefetch", type=int, default=2)\n'
    "args = parser.parse_args()",
).replace(
    "shuffle=True)",
    'shuffle=True, prefetch_factor=args.prefetch, pin_memory=args.pin == "True",\n'
    "                   worker_init_fn=lambda _: time.sleep(0.5))  # each epoch's workers start in 0.5 s",
)
"""EPOCH_EVAL_SCRIPT with every loader knob a flag, and workers that take 0.5 s to start each epoch."""


def test_a_boundary_holds_the_loaders_restart_and_the_scripts_evaluation(tmp_path: Path):
    """A loader whose workers restart each epoch in 0.5 s (not persistent: every knob is filled into the command, so
    none is set on the loader, and tunekit keeps the script's own persistent_workers=False), and a 0.8 s evaluation:
    an epoch boundary costs both, 0.8 + 0.5 s and the first batch (40 ms), as in the script's own runs."""
    script = tmp_path / "train.py"
    script.write_text(RESTART_SCRIPT)
    raw = _script_config(
        tmp_path,
        [
            sys.executable,
            str(script),
            "-j",
            "{num_workers}",
            "-b",
            "{batch_size}",
            "--pin",
            "{pin_memory}",
            "--prefetch",
            "{prefetch_factor}",
        ],
    )
    raw["trial"] = {**QUICK, "window_s": 0.4, "measure_windows": 3}
    m = _trial(tmp_path, raw, num_workers=1, prefetch_factor=2, batch_size=8)
    assert m.status == "ok", m.reason
    assert m.loader_measured["persistent_workers"] is False
    assert m.epoch_boundaries >= 2, m.boundaries_s
    assert m.boundary_s == pytest.approx(0.8 + 0.5 + 0.04, abs=0.25), m.boundaries_s


def test_the_loader_alone_is_measured_apart_from_its_epoch_ends(tmp_path: Path):
    """The loader ceiling of a script whose epoch (1.6 s) outlasts its windows: the loader's own epoch ends (its
    workers' refill) are measured apart, as a training trial's are, so its windows hold only the steady part and
    its figure is the rate over whole epochs, never above the steady rate (windows straddled the epochs' ends,
    8-14 % window noise on the H200)."""
    script = tmp_path / "train.py"
    script.write_text(EPOCH_EVAL_SCRIPT)
    raw = _script_config(tmp_path, [sys.executable, str(script), "-j", "{num_workers}", "-b", "{batch_size}"])
    raw["trial"] = {**QUICK, "window_s": 0.4, "measure_windows": 3}
    m = _trial(tmp_path, raw, num_workers=1, prefetch_factor=2, batch_size=8, mode="loader")
    assert m.status == "ok", m.reason
    assert m.epoch_boundaries >= 1 and m.rate_in_epoch is not None, (m.epoch_boundaries, m.rate_windows)
    assert m.rate <= m.rate_in_epoch


def test_a_loader_built_anew_each_epoch_is_followed(tmp_path: Path):
    """A loop that builds its DataLoader inside each epoch (48 samples: 6 batches an epoch): the measurement goes on
    with each new loader (every trial timed out, "no result within trial.timeout_s", the script training on loaders
    nobody metered)."""
    script = tmp_path / "train.py"
    body = SLEEPY_SCRIPT.replace(
        "sleepy_dataset(sample_wait_s=0.005)", "sleepy_dataset(num_samples=48, sample_wait_s=0.005)"
    )
    build = (
        "train = DataLoader(sleepy_dataset(num_samples=48, sample_wait_s=0.005), batch_size=args.b, "
        "num_workers=args.j, shuffle=True)\n"
    )
    body = body.replace(build, "data = sleepy_dataset(num_samples=48, sample_wait_s=0.005)\n").replace(
        "for epoch in range(args.epochs):\n",
        "for epoch in range(args.epochs):\n    train = DataLoader(data, "
        "batch_size=args.b, num_workers=args.j, shuffle=True)\n",
    )
    assert "    train = DataLoader(data" in body
    script.write_text(body)
    raw = _script_config(tmp_path, [sys.executable, str(script), "-j", "{num_workers}", "-b", "{batch_size}"])
    raw["trial"] = {**QUICK, "timeout_s": 60}
    m = _trial(tmp_path, raw, num_workers=2, prefetch_factor=2, batch_size=8)
    assert m.status == "ok", m.reason
    assert m.epochs_ended >= 2 and m.loader_measured["rebuilt"] >= 2, m.loader_measured


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


def test_a_lightning_trainer_loop_is_measured_at_the_batch_it_yields(tmp_path: Path):
    """A Lightning Trainer script: the fit loop iterates the module's loader through its CombinedLoader, with a
    validation loop between epochs. The script has no batch flag; its loader is a plain DataLoader(batch_size=16),
    so the batch knob is set on it: the trial records and counts the 32 the loop received, and its rate stays under
    the bound of 32 samples of 1 ms each plus a 10 ms step."""
    pytest.importorskip("lightning")
    script = REPO / "tests" / "_lightning_train.py"
    raw = _script_config(tmp_path, [sys.executable, str(script), "--workers", "{num_workers}"])
    m = _trial(tmp_path, raw, num_workers=0, batch_size=32)
    assert m.status == "ok", m.reason
    assert m.params["batch_size"] == 32 and m.loader_measured["batch_size"] == 32, m.loader_measured
    assert m.asked is None
    assert m.items_per_batch_mean == 32
    assert m.rate < 32 / (32 * 0.001 + 0.01), m.rate
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "DataLoader(Rows(1024)" in text)
    assert m.loader_measured["built_at"] == f"{script}:{line}" and "built_by" not in m.loader_measured
