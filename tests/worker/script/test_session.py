"""Script mode inside the user's own process (tunekit/worker/script/_session.py): the training script run unedited
in every trial and measured from inside its loop, its training loader found, its epochs and its own work between
them measured."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.launch.test_ending import _faulty_trial
from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial, script_command
from tunekit.workloads.synthetic import expected_samples_per_s

QUICK = {"window_s": 0.5, "measure_windows": 2, "precision": None, "warmup_steps": 1, "timeout_s": 120}

# a plain training loop over the known-answer workload: 5 ms of wall time per sample, 20 ms per step
SLEEPY_SCRIPT = """
import argparse, os, torch
from torch.utils.data import DataLoader
from tunekit.workloads.synthetic import sleepy_dataset, sleepy_model

parser = argparse.ArgumentParser()
parser.add_argument("-j", type=int, default=0)
parser.add_argument("-b", type=int, default=8)
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--eval-first", action="store_true")
args = parser.parse_args()
model = sleepy_model(step_wait_s=0.02)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if args.eval_first:  # evaluation before training, under no_grad: not the loader to measure
    with torch.no_grad():
        for x, y in DataLoader(sleepy_dataset(num_samples=64, sample_wait_s=0.0), batch_size=16):
            model(x)
train = DataLoader(sleepy_dataset(sample_wait_s=0.005), batch_size=args.b, num_workers=args.j, shuffle=True)
for epoch in range(args.epochs):
    for x, y in train:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), os.path.join(os.path.dirname(__file__), f"epoch{epoch}.pt"))
"""


def _script_config(tmp_path: Path, command: list[str], *, cwd: Path | None = None, **search: Any) -> dict[str, Any]:
    """A config that runs ``command`` in ``cwd``; by default in the folder of every test's ``tmp_path`` (this test
    process's): a script trial's fork server is started for the script's working folder, so the trials of tests
    that do not need a folder of their own share one, as a sweep's trials do. Each test's script, and what it
    writes beside itself, stays in its own ``tmp_path``."""
    return {
        "name": "script",
        "device": "cpu",
        "script": {"command": command, "cwd": str(cwd or tmp_path.parent)},
        "search": {"num_workers": [0, 2], "batch_size": [8], "pin_memory": [False], **search},
        "trial": dict(QUICK),
        "selection": {"repeats": 0},
    }


def _trial(tmp_path: Path, raw: dict[str, Any], name: str = "t", stage: str = "single", **knobs: Any):
    cfg = config.from_dict(raw, source=str(tmp_path / "cfg.yaml")).to_dict()
    spec = TrialSpec(number=0, stage=stage, mode=knobs.pop("mode", "train"), knobs=Knobs(**knobs), config=cfg)
    return run_trial(spec, tmp_path / name, 120)


def _no_process_runs(marker: str) -> bool:
    mine = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            mine += [proc] if marker in " ".join(proc.info["cmdline"] or []) else []
        except psutil.Error:
            continue
    return not mine


@pytest.fixture
def sleepy_script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SLEEPY_SCRIPT)
    return path


def test_script_mode_and_workload_mode_agree_on_the_knee_of_a_known_answer_job(tmp_path: Path, sleepy_script: Path):
    """The same job twice, as the user's script run unedited and as factories: 1 worker x 5 ms per sample delivers
    200/s, 3 workers 600/s against a 20 ms step of 8 samples (400/s). Both sweeps pick 3 workers, at the same
    figure within noise; the script trials meter its loop from inside (the training loader, not another), never
    reach its checkpoint, and leave no process behind."""
    import tunekit

    search = {"num_workers": [1, 3], "batch_size": [8], "pin_memory": [False], "prefetch_factor": [2]}
    raw = _script_config(
        tmp_path, [sys.executable, str(sleepy_script), "-j", "{num_workers}", "-b", "{batch_size}"], **search
    )
    # the factories first: the script trials of the tests after this one then find the fork server of theirs
    factory = tunekit.sweep(
        {
            "name": "f",
            "device": "cpu",
            "workload": {
                "model": "tunekit.workloads.synthetic:sleepy_model",
                "model_args": {"step_wait_s": 0.02},
                "dataset": "tunekit.workloads.synthetic:sleepy_dataset",
                "dataset_args": {"sample_wait_s": 0.005},
            },
            "search": search,
            "trial": dict(QUICK),
            "selection": {"repeats": 0},
        },
        out=tmp_path / "factory",
        strategy="grid",
    )
    script = tunekit.sweep(raw, out=tmp_path / "script", strategy="grid")
    knees = {}
    for mode, outcome in (("script", script), ("factory", factory)):
        assert outcome.summary.choice.knee is not None, (mode, outcome.reason)
        knees[mode] = outcome.summary.choice.knee
    bands = [outcome.summary.choice.band or 0.0 for outcome in (script, factory)]
    if max(bands) > 0.3:  # 1 worker gives half of 3 workers' rate: a band that wide cannot tell them apart
        pytest.skip(f"the box was too busy to tell 1 worker from 3 (the runs' bands {bands[0]:.0%}, {bands[1]:.0%})")
    assert knees["script"].knobs.num_workers == knees["factory"].knobs.num_workers == 3, knees
    analytic = expected_samples_per_s(3, 8, 0.005, 0.02)
    assert 0.6 * analytic < knees["script"].rate < 1.1 * analytic
    assert 0.8 < knees["script"].rate / knees["factory"].rate < 1.25  # the same job, the same figure within noise
    m = knees["script"].measurement
    assert m.loader_measured["dataset"] == "_SleepyDataset" and m.loader_measured["index"] == 1
    assert not list(tmp_path.glob("epoch*.pt"))  # every trial ended at the batch request after its last window
    assert _no_process_runs(str(sleepy_script))


def test_the_training_loader_is_the_one_iterated_with_autograd_not_the_evaluation_one(tmp_path, sleepy_script):
    command = [sys.executable, str(sleepy_script), "-j", "{num_workers}", "-b", "{batch_size}", "--eval-first"]
    m = _trial(tmp_path, _script_config(tmp_path, command), num_workers=0, batch_size=8)
    assert m.status == "ok", m.reason
    assert m.loader_measured["index"] == 2 and m.loader_measured["found_by"] == "autograd enabled"
    assert m.loader_measured["batch_size"] == 8  # not the evaluation loader's 16


def test_knobs_without_a_placeholder_are_set_on_the_training_loader(tmp_path: Path, sleepy_script: Path):
    """The command carries no flag for the workers: the trial sets them on the DataLoader the script built."""
    m = _trial(
        tmp_path,
        _script_config(tmp_path, [sys.executable, str(sleepy_script), "-b", "{batch_size}"]),
        num_workers=2,
        prefetch_factor=3,
        batch_size=8,
    )
    assert m.status == "ok", m.reason
    assert m.loader_measured["num_workers"] == 2 and m.loader_measured["prefetch_factor"] == 3
    assert m.loader_measured["persistent_workers"] is True  # kept across epochs, as the recommendation says
    assert m.epoch_batches is None and all(steps % 2 == 0 for steps in m.steps_windows)  # long epochs: whole rounds


def test_the_baseline_runs_the_script_with_its_own_settings(tmp_path: Path, sleepy_script: Path):
    raw = _script_config(tmp_path, [sys.executable, str(sleepy_script), "-j", "{num_workers}", "-b", "{batch_size}"])
    spec = TrialSpec(
        number=0,
        stage="baseline",
        mode="train",
        knobs=Knobs(num_workers=2, batch_size=8),
        config=config.from_dict(raw).to_dict(),
    )
    assert script_command(spec) == [sys.executable, str(sleepy_script)]  # -j and -b left out with their values
    m = run_trial(spec, tmp_path / "baseline", 120)
    assert m.status == "ok", m.reason
    assert m.loader_measured["num_workers"] == 0 and m.loader_measured["batch_size"] == 8  # the script's defaults


@pytest.mark.parametrize(
    ("body", "args", "expected"),
    [
        ("import sys\nprint('no loader here')\n", [], "without building a torch DataLoader"),
        (SLEEPY_SCRIPT, ["--epochs", "0"], "without training on a DataLoader"),
        (SLEEPY_SCRIPT, ["--workers", "2"], "the script rejected its arguments: train.py: error: "),
    ],
)
def test_a_script_that_ends_before_its_windows_says_why_in_one_line(
    tmp_path: Path, body: str, args: list[str], expected: str
):
    script = tmp_path / "train.py"
    script.write_text(body)
    m = _trial(tmp_path, _script_config(tmp_path, [sys.executable, str(script), *args]), num_workers=0, batch_size=8)
    assert m.status == "crashed" and expected in m.reason, m.reason
    assert "\n" not in m.reason
    if "--workers" in args:
        assert "unrecognized arguments: --workers 2" in m.reason  # argparse's own words


def test_a_loop_that_ends_early_names_the_batches_it_gave(tmp_path: Path):
    """A script that trains 3 steps and stops, long before the windows are done: the reason says how many batches
    it gave and what to raise."""
    script = tmp_path / "train.py"
    script.write_text(
        SLEEPY_SCRIPT.replace(
            "    for x, y in train:",
            "    for step, (x, y) in enumerate(train):\n        if step == 3:\n            raise SystemExit(0)",
        )
    )
    m = _trial(tmp_path, _script_config(tmp_path, [sys.executable, str(script)]), num_workers=0, batch_size=8)
    assert m.status == "crashed", m
    assert "ended after 4 batch(es)" in m.reason and "give it more batches" in m.reason  # steps 0 to 3


def test_a_hard_coded_loader_is_recorded_as_it_ran(tmp_path: Path):
    """The script builds its loader with num_workers=1 whatever -j says: the trial says what ran and what was
    asked, and the plan counts the request as done (it asked 24 times, until the budget ran out)."""
    from tunekit.plan._request import Request, pending
    from tunekit.records import TrialRow

    m = _faulty_trial(tmp_path, "workers1", workers=2)
    assert m.status == "ok", m.reason
    assert m.params["num_workers"] == 1 and m.asked == {"num_workers": 2}
    row = TrialRow.from_measurement(m)
    again = Request(row.stage, row.mode, Knobs(**{**row.knobs.to_dict(), "num_workers": 2}))
    assert pending([again], [row]) == []


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


CYCLING_SCRIPT = """
import itertools, time, torch
from torch.utils.data import DataLoader
from tunekit.workloads.synthetic import sleepy_dataset

model = torch.nn.Linear(192, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
pace = itertools.cycle([0.05] * 5 + [0.2])  # one slow step in six: three-step windows 2x apart in turn
train = DataLoader(sleepy_dataset(sample_wait_s=0.0), batch_size=8)
for epoch in range(1000):
    for x, y in train:
        time.sleep(next(pace))
        loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_scripts_own_settings_below_the_band_measure_on_until_a_gain_can_rest_on_them(tmp_path: Path):
    """The script's own settings are what a script's gain is over: far below the band (needed), with windows 2x
    apart, they measure to max_windows where a trial of the walk stops after two windows (rules.CLAIM_PRECISION)."""
    from tunekit import rules

    script = tmp_path / "train.py"
    script.write_text(CYCLING_SCRIPT)
    raw = _script_config(tmp_path, [sys.executable, str(script)], num_workers=[0, 1])
    raw["trial"] = {**QUICK, "window_s": 0.1, "precision": 1e-6, "max_windows": 5}
    cfg = config.from_dict(raw, source=str(tmp_path / "cfg.yaml")).to_dict()
    own = TrialSpec(number=0, stage="baseline", mode="train", knobs=Knobs(batch_size=8), config=cfg, needed=1e9)
    m = run_trial(own, tmp_path / "own", 120)
    assert m.status == "ok", m.reason
    assert m.stop_reason == "max_windows" and m.rate_interval > rules.CLAIM_PRECISION, (m.stop_reason, m.rate_windows)
    walk = dataclasses.replace(own, number=1, stage="end_to_end", knobs=Knobs(num_workers=1, batch_size=8))
    raced = run_trial(walk, tmp_path / "walk", 120)
    assert raced.status == "ok", raced.reason
    assert raced.stop_reason == "below_band" and raced.windows_measured == 2, (raced.stop_reason, raced.rate_windows)
