"""Script mode: the user's own training script, run unedited in every trial, measured from inside its loop."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import REPO
from tunekit import command as command_mod
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


FACTS = """
import json, os, sys
import numpy
with open(os.path.join(os.getcwd(), "facts.json"), "w") as fh:
    json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "file": __file__,
               "draw": int(numpy.random.randint(2**31))}, fh)
"""


def test_script_trials_are_forked_and_run_as_the_interpreter_would(tmp_path: Path):
    """`python train.py …` and `python -m pkg.train …` run by tunekit's own interpreter are forked from a fork server
    (no interpreter start, no `import torch` per trial) and run as that interpreter would run them: `__main__`, its
    sys.argv, sys.path[0] the script's folder (the working folder with -m); an uncaught exception is the trial's
    failure as in a fresh interpreter; with trial.fork_server off, or under torchrun, the command runs itself."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(FACTS + SLEEPY_SCRIPT)
    raw = _script_config(
        tmp_path, [sys.executable, "-m", "pkg.train", "-j", "{num_workers}", "-b", "{batch_size}"], cwd=tmp_path
    )
    m = _trial(tmp_path, raw, name="module", num_workers=2, prefetch_factor=2, batch_size=8)
    assert m.status == "ok" and m.started_by == "fork server", (m.status, m.reason, m.started_by)
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["name"] == "__main__" and facts["path0"] == str(tmp_path)
    assert facts["argv"] == [str(tmp_path / "pkg" / "train.py"), "-j", "2", "-b", "8"]
    script = tmp_path / "train.py"
    script.write_text(FACTS + SLEEPY_SCRIPT)
    sub = tmp_path / "run"
    sub.mkdir()
    raw = _script_config(tmp_path, [sys.executable, str(script), "-b", "{batch_size}"])
    raw["script"]["cwd"] = str(sub)
    m = _trial(tmp_path, raw, name="path", num_workers=0, batch_size=8)
    assert m.status == "ok" and m.started_by == "fork server", (m.status, m.reason, m.started_by)
    facts = json.loads((sub / "facts.json").read_text())
    assert facts["name"] == "__main__" and facts["path0"] == str(tmp_path) and facts["file"] == str(script)
    assert facts["argv"] == [str(script), "-b", "8"]
    first = facts
    raw["trial"]["fork_server"] = False
    assert _trial(tmp_path, raw, name="fresh", num_workers=0, batch_size=8).started_by == "interpreter"
    # a symlinked script: sys.path[0] is its real folder, __file__ the path it was run by
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text(FACTS + SLEEPY_SCRIPT)
    (sub / "linked.py").symlink_to(tmp_path / "real" / "train.py")
    raw = _script_config(tmp_path, [sys.executable, "linked.py"])
    raw["script"]["cwd"] = str(sub)
    m = _trial(tmp_path, raw, name="linked", num_workers=0, batch_size=8)
    assert m.status == "ok" and m.started_by == "fork server", (m.status, m.reason, m.started_by)
    facts = json.loads((sub / "facts.json").read_text())
    assert facts["path0"] == str(tmp_path / "real") and facts["file"] == str(sub / "linked.py")
    assert facts["draw"] != first["draw"]  # the same server forked both: numpy reseeded in each, as at a fresh start
    broken = tmp_path / "broken.py"
    broken.write_text(SLEEPY_SCRIPT.replace("for epoch in", "raise ValueError('bad data path')\nfor epoch in"))
    m = _trial(
        tmp_path, _script_config(tmp_path, [sys.executable, str(broken)]), name="broken", num_workers=0, batch_size=8
    )
    assert m.status == "crashed" and "bad data path" in m.reason and m.started_by == "fork server", m.reason


def test_a_relative_pythonpath_of_script_env_is_the_scripts_folders_forked_or_not(tmp_path: Path):
    """`script.env`'s PYTHONPATH reaches the script (after the bootstrap), and a relative entry of it names a folder
    of the script's working folder, as it does for a fresh interpreter started there: the fork server is started in
    that folder too (the interpreter makes PYTHONPATH's entries absolute against the folder it starts in), not in
    the launcher's (here the repository, which has no lib/helper.py)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text("WHERE = 'the script folder'\n")
    script = tmp_path / "train.py"
    script.write_text("import helper\nassert helper.WHERE == 'the script folder'\n" + SLEEPY_SCRIPT)
    raw = _script_config(tmp_path, [sys.executable, str(script)], cwd=tmp_path)
    raw["script"]["env"] = {"PYTHONPATH": "lib"}
    forked = _trial(tmp_path, raw, name="forked", num_workers=0, batch_size=8)
    assert forked.status == "ok" and forked.started_by == "fork server", (forked.status, forked.reason)
    raw["trial"]["fork_server"] = False
    fresh = _trial(tmp_path, raw, name="fresh", num_workers=0, batch_size=8)
    assert fresh.status == "ok" and fresh.started_by == "interpreter", (fresh.status, fresh.reason)


def test_what_a_fork_server_runs_for_a_command(tmp_path: Path):
    """Only this interpreter running a script or a module without interpreter options is forked; the modules it
    imports at its top level are preloaded, but none of its own folder (another module of that name would be taken
    for it)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse, torch\nfrom torch.utils.data import DataLoader\nfrom data import load\n"
        "from . import nothing\n\ndef main():\n    import yaml\n"
    )
    (tmp_path / "data.py").write_text("")
    entry = command_mod.script_entry([sys.executable, "train.py", "-b", "8"], str(tmp_path), None, sys.executable)
    assert entry == {"path": str(script), "args": ["-b", "8"], "cwd": str(tmp_path)}
    assert command_mod.script_imports(entry) == ["argparse", "torch", "torch.utils.data"]
    assert command_mod.script_entry([sys.executable, "-m", "pkg.train"], str(tmp_path), None, sys.executable) == {
        "module": "pkg.train",
        "args": [],
        "cwd": str(tmp_path),
    }
    other = tmp_path / "python3"  # another interpreter of that name
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    for command in (
        [str(other), "train.py"],
        [sys.executable, "-u", "train.py"],
        [sys.executable, "missing.py"],
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "train.py"],
    ):
        assert command_mod.script_entry(command, str(tmp_path), None, sys.executable) is None, command
    assert command_mod.script_entry(["python3", "train.py"], str(tmp_path), str(tmp_path), sys.executable) is None
    venv = tmp_path / "venv" / "bin"  # a virtualenv's python: a symlink to this interpreter, another environment
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    assert command_mod.script_entry([str(venv / "python"), "train.py"], str(tmp_path), None, sys.executable) is None
    # a script that sets the environment or sys.path up before its imports runs itself: the server imported torch
    # before it ran
    for name, head in (
        ("threads.py", "import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch\n"),
        ("src.py", "import sys\nsys.path.insert(0, '../src')\nimport mylib\n"),
        ("env.py", "from os import environ\nenviron.setdefault('MKL_NUM_THREADS', '1')\nimport torch\n"),
        ("put.py", "import os\nos.putenv('KMP_AFFINITY', 'compact')\nimport torch\n"),
    ):
        (tmp_path / name).write_text(head + "print('train')\n")
        assert command_mod.script_entry([sys.executable, name], str(tmp_path), None, sys.executable) is None, name
    # after its imports it may, and reading them first is no setting up
    (tmp_path / "late.py").write_text(
        "import os, sys\nprint(os.environ.get('HOME'), sys.path[0])\nimport torch\n"
        "os.environ['WANDB_MODE'] = 'offline'\n"
    )
    assert command_mod.script_entry([sys.executable, "late.py"], str(tmp_path), None, sys.executable) is not None
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch\n")
    assert command_mod.script_entry([sys.executable, "-m", "pkg.train"], str(tmp_path), None, sys.executable) is None
    # a symlinked script runs from its real folder (sys.path[0]): that folder's modules are its own, not preloaded
    real = tmp_path / "shared"
    real.mkdir()
    (real / "utils.py").write_text("")
    (real / "train.py").write_text("import torch\nimport utils\n")
    (tmp_path / "linked.py").symlink_to(real / "train.py")
    linked = command_mod.script_entry([sys.executable, "linked.py"], str(tmp_path), None, sys.executable)
    assert command_mod.script_imports(linked) == ["torch"]


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


def test_validate_names_placeholders_that_are_not_knobs(write_config):
    path = write_config(
        {"name": "s", "script": {"command": "python train.py -j {workers}"}, "search": {"compile": ["none", "default"]}}
    )
    bad = subprocess.run(
        [sys.executable, "-m", "tunekit", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert any("script.command: {workers} is not a knob" in line for line in lines)
    assert any("search.compile: the script sets it itself" in line for line in lines)
    both = write_config(
        {"name": "s", "script": {"command": "python t.py"}, "workload": {"model": "a:b", "dataset": "a:c"}}, "both.yaml"
    )
    refused = subprocess.run(
        [sys.executable, "-m", "tunekit", "validate", str(both)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "give exactly one" in refused.stderr


def test_fill_command_leaves_out_a_placeholder_without_a_value_with_its_flag():
    command = "python train.py --data /d -j {num_workers} --batch={batch_size} --amp"
    assert command_mod.fill_command(command, {"num_workers": 4, "batch_size": 64}) == [
        "python",
        "train.py",
        "--data",
        "/d",
        "-j",
        "4",
        "--batch=64",
        "--amp",
    ]
    assert command_mod.fill_command(command, {}) == ["python", "train.py", "--data", "/d", "--amp"]
    assert command_mod.placeholders(textwrap.dedent(command)) == {"num_workers", "batch_size"}


def test_a_bootstrap_that_cannot_load_ends_the_script_at_once_with_the_reason(tmp_path: Path, sleepy_script: Path):
    """Were the meter not to load, the script would train unmetered to its end (or the trial's timeout)."""
    from tunekit.launch import BOOTSTRAP

    out = tmp_path / "measurement.json"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{BOOTSTRAP}:{REPO}",
        "TUNEKIT_SCRIPT_SPEC": str(tmp_path / "no"),
        "TUNEKIT_SCRIPT_MEASUREMENT": str(out),
    }
    run = subprocess.run([sys.executable, str(sleepy_script)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 3
    failed = json.loads(out.read_text())
    assert failed["status"] == "crashed" and "bootstrap could not load" in failed["reason"]
    assert not list(tmp_path.glob("epoch*.pt"))
