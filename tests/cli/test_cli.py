"""The command line (tunekit/cli/), each command through the real one in a subprocess: what the README promises
(``tunekit env`` with ``--json``, ``--out FILE``, ``results/env.json``; ``tunekit trial --mode compute|loader`` and
its exit 1 on a failed trial; the default ``results/<name>/`` folder; ``tunekit sweep --quiet``; SIGHUP while a
sweep opens its run or writes its outputs), the exit codes of usage errors, ``--set`` in a sweep and
``tunekit sweep --script`` without a config."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

import tunekit
from tests.conftest import REPO, sleepy_config, study_trials
from tests.worker.script.test_session import SLEEPY_SCRIPT
from tunekit import launch

EXIT_INTERRUPTED = 130


def _tunekit(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunekit", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


# --- tunekit env ------------------------------------------------------------------------------------------------


def test_env_prints_json_and_saves_it_where_out_says(tmp_path: Path):
    out = tmp_path / "snapshots" / "here.json"
    shown = _tunekit("env", "--json", "--out", str(out), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    printed = json.loads(shown.stdout)
    assert printed == json.loads(out.read_text())  # what it printed is what it saved
    assert {"python", "packages", "cpu", "memory", "nvml", "gpus"} <= set(printed)
    assert printed["cpu"]["logical"] == os.cpu_count()
    assert not (tmp_path / "results").exists()  # --out replaces the default place, it does not add to it


def test_env_without_out_saves_results_env_json_in_the_current_folder(tmp_path: Path):
    shown = _tunekit("env", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    saved = json.loads((tmp_path / "results" / "env.json").read_text())
    assert saved["cpu"]["logical"] == os.cpu_count()
    assert f"{os.cpu_count()} logical" in shown.stdout and "NVML" in shown.stdout  # text, not JSON
    with pytest.raises(json.JSONDecodeError):
        json.loads(shown.stdout)


# --- tunekit trial --mode, and its exit code ---------------------------------------------------------------------


@pytest.fixture
def trial_config(write_config) -> Path:
    """The known-answer workload: 8 samples per 20-ms step (400/s for the model alone), 10 ms a sample (2 workers:
    200/s for the loader alone)."""
    return write_config(
        sleepy_config(
            **{
                "workload.model_args": {"step_wait_s": 0.02},
                "workload.dataset_args": {"sample_wait_s": 0.01},
                "trial.window_s": 0.3,
            }
        )
    )


@pytest.mark.parametrize("mode,bound", [("compute", 400.0), ("loader", 200.0)])
def test_trial_mode_measures_the_model_or_the_loader_alone(trial_config: Path, tmp_path: Path, mode: str, bound: float):
    out = tmp_path / "run"
    done = _tunekit(
        "trial",
        str(trial_config),
        "--mode",
        mode,
        "--set",
        "num_workers=2",
        "--set",
        "batch_size=8",
        "--out",
        str(out),
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert f"({mode})" in done.stderr and "samples/s:" in done.stdout
    m = json.loads((out / "trials" / "0" / "measurement.json").read_text())
    assert (m["status"], m["mode"], m["stage"]) == ("ok", mode, "single")
    assert 0.6 * bound <= m["rate"] <= bound * 1.03, m["rate"]  # the other half would have set another rate
    if mode == "compute":
        assert m["host_processes"] == 1 and m["data_wait_frac"] < 0.01  # a staged batch: no loader at all
    else:
        assert m["host_processes"] >= 3  # the loader's two workers ran


def test_a_failed_trial_exits_1_and_writes_results_name_trial_without_out(write_config, tmp_path: Path):
    cfg = write_config(
        sleepy_config(
            name="broken", **{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "raise_at": 3}}
        )
    )
    done = _tunekit("trial", str(cfg), "--set", "num_workers=1", "--set", "batch_size=16", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("status: crashed — ") and "sample 3 is corrupt" in done.stdout
    saved = json.loads((tmp_path / "results" / "broken-trial" / "trials" / "0" / "measurement.json").read_text())
    assert saved["status"] == "crashed" and "sample 3 is corrupt" in saved["reason"]
    assert "Traceback" not in done.stderr


# --- one quiet sweep without --out, from a folder of its own ---------------------------------------------------

NAME = "promised"


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``tunekit sweep CONFIG --quiet`` with no ``--out``, run from an empty folder: a grid of 0 and 1 workers."""
    cwd = tmp_path_factory.mktemp("cwd")
    config = tmp_path_factory.mktemp("config") / "promised.yaml"
    config.write_text(
        yaml.safe_dump(
            sleepy_config(name=NAME, **{"search.num_workers": [0, 1], "trial.window_s": 0.3, "strategy": "grid"}),
            sort_keys=False,
        )
    )
    result = _tunekit("sweep", str(config), "--quiet", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return {"cwd": cwd, "config": config, "out": cwd / "results" / NAME, "result": result}


def test_a_sweep_without_out_writes_results_name_under_the_current_folder(quiet_run: dict):
    out = quiet_run["out"]
    for name in (
        "recommended.yaml",
        "report.md",
        "trials.csv",
        "study.db",
        "config.resolved.yaml",
        "env.json",
        "sweep.json",
    ):
        assert (out / name).exists(), name
    assert len(pd.read_csv(out / "trials.csv")) == 2 and len(study_trials(out)) == 2
    assert f"-> {Path('results') / NAME / 'recommended.yaml'}" in quiet_run["result"].stdout
    assert sorted(p.name for p in quiet_run["cwd"].iterdir()) == ["results"]  # nothing else written there
    assert not (REPO / "results" / NAME).exists()  # relative to where it ran, not to the package


def test_a_quiet_sweep_prints_no_progress_bar_and_no_trial_log(quiet_run: dict):
    result = quiet_run["result"]
    assert not re.search(r"^trial \d+ \[", result.stderr, re.M), result.stderr  # the per-trial log lines
    assert not re.search(r"\beta \d", result.stderr) and "━" not in result.stderr, result.stderr  # the bar's columns
    assert "dataset ready" not in result.stderr
    # the outcome still reaches stdout: the knee's reason and where recommended.yaml is
    assert tunekit.load_recommended(quiet_run["out"] / "recommended.yaml").num_workers in (0, 1)
    assert "recommended.yaml" in result.stdout


# --- SIGHUP while the run is opened and while the outputs are written -----------------------------------------


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and text in " ".join(proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


@pytest.mark.parametrize(
    "phase,held", [("opening the run", "tunekit.driver:snapshot"), ("writing outputs", "tunekit.report:write_outputs")]
)
def test_sighup_while_opening_the_run_or_writing_outputs_exits_130_and_keeps_the_run(
    quiet_run: dict, tmp_path: Path, phase: str, held: str
):
    """A resumed sweep (nothing left to run) gets SIGHUP (a closed terminal) while it opens the run or while it
    writes the outputs, each held open by tests/_hold_at.py: exit 130 with one line, no process of the run left,
    the study and the outputs written before intact (atomic writes), the folder's lock free; after the outputs'
    interruption, the same command resumes and writes every output (the outputs it lost deleted first)."""
    out = tmp_path / "run"
    shutil.copytree(quiet_run["out"], out)
    before = [(t.number, t.value) for t in study_trials(out)]
    recommended = (out / "recommended.yaml").read_text()
    marker = tmp_path / "held"
    cmd = [
        sys.executable,
        "-m",
        "tests._hold_at",
        held,
        str(marker),
        "sweep",
        str(quiet_run["config"]),
        "--out",
        str(out),
        "--quiet",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the sweep never reached {phase}"
            time.sleep(0.02)
        proc.send_signal(signal.SIGHUP)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED, stdout + stderr
    # a neighbour that kept the CPUs busy during quiet_run's trials has every later sweep of the run say so, in a
    # DISTURBED line: the run's own figures, not this sweep's output
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("DISTURBED:")]
    assert "Traceback" not in stderr
    assert not _processes_mentioning(str(out))
    # every trial kept as it was (a trial whose own figures a loaded box disturbed is measured again on resume)
    assert set(before) <= {(t.number, t.value) for t in study_trials(out)}
    launch.lock_run(out).close()  # the interrupted sweep let go of the folder
    if phase == "opening the run":
        assert len(lines) == 1 and lines[0].startswith("tunekit: "), stderr
        assert (out / "recommended.yaml").read_text() == recommended  # untouched
        return  # the rerun below is the same for both phases: once is enough
    # interrupted while writing the outputs: they are written once more, whole, and the sweep says it was
    # interrupted (the README's promise: the finished trials' outputs are written, exit 130)
    assert not lines, stderr  # --quiet: the outcome only, on stdout
    assert json.loads((out / "sweep.json").read_text())["interrupted"] is True
    assert (
        tunekit.load_recommended(out / "recommended.yaml").evidence["rate"]
        == tunekit.load_recommended(quiet_run["out"] / "recommended.yaml").evidence["rate"]
    )

    for name in ("recommended.yaml", "report.md", "trials.csv"):
        (out / name).unlink()
    resumed = _tunekit("sweep", str(quiet_run["config"]), "--out", str(out), "--quiet", cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr
    assert [(t.number, t.value) for t in study_trials(out)] == before  # nothing ran again
    again, first = (
        tunekit.load_recommended(out / "recommended.yaml"),
        tunekit.load_recommended(quiet_run["out"] / "recommended.yaml"),
    )
    assert again.dataloader_kwargs() == first.dataloader_kwargs() and again.evidence["rate"] == first.evidence["rate"]
    assert len(pd.read_csv(out / "trials.csv")) == 2 and (out / "report.md").exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunekit", *args], capture_output=True, text=True, timeout=120)


def test_validate_cli_exit_codes(write_config):
    good = _cli("validate", str(write_config(sleepy_config())))
    assert good.returncode == 0 and ": ok" in good.stdout
    bad_path = write_config(sleepy_config(**{"device": "tpu", "trial.timeout_s": "long"}), "bad.yaml")
    bad = _cli("validate", str(bad_path))
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"tunekit: error: {bad_path}: ") for line in lines)
    assert "Traceback" not in bad.stderr
    debug = _cli("--debug", "validate", str(bad_path))
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    missing = _cli("validate", "does/not/exist.yaml")
    assert missing.returncode == 2 and "does/not/exist.yaml: cannot read config" in missing.stderr


def test_trial_cli_usage_errors(write_config):
    path = str(write_config(sleepy_config()))
    unknown = _cli("trial", path, "--set", "workers=4")
    assert unknown.returncode == 2 and "--set workers: unknown knob; allowed: num_workers" in unknown.stderr
    bad_value = _cli("trial", path, "--set", "pin_memory=maybe")
    assert bad_value.returncode == 2 and "pin_memory=maybe: expected true or false" in bad_value.stderr
    bad_compile = _cli("trial", path, "--set", "compile=turbo")
    assert bad_compile.returncode == 2 and "choose one of: none, default" in bad_compile.stderr
    ranks = _cli("trial", path, "--set", "ranks=2")  # the config launches no ranks
    assert ranks.returncode == 2 and "ranks=2:" in ranks.stderr and "launches 1 rank(s)" in ranks.stderr
    assert "Traceback" not in ranks.stderr
    twice = _cli("trial", path, "--set", "num_workers=2", "--set", "trial.window_s=1", "--set", "num_workers=4")
    assert twice.returncode == 2 and "--set num_workers: given twice (2 and 4); give each key once" in twice.stderr


def test_sweep_takes_set_overrides(write_config, tmp_path: Path):
    cfg = write_config(sleepy_config(**{"trial.window_s": 0.3}))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunekit",
            "sweep",
            str(cfg),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--set",
            "search.num_workers=[0]",
            "--set",
            "workers=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "--set workers: unknown knob" in run.stderr and run.returncode == 2  # neither a knob nor a config key
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunekit",
            "sweep",
            str(cfg),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--set",
            "search.num_workers=[0, 2]",
            "--strategy",
            "grid",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    resolved = yaml.safe_load((tmp_path / "run" / "config.resolved.yaml").read_text())
    assert resolved["search"]["num_workers"] == [0, 2]


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


def test_trial_cli_writes_measurement(write_config, tmp_path: Path):
    path = write_config(sleepy_config())
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunekit",
            "trial",
            str(path),
            "--set",
            "num_workers=2",
            "--set",
            "batch_size=8",
            "--set",
            "trial.window_s=0.5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    m = json.loads((out / "trials" / "0" / "measurement.json").read_text())
    assert m["status"] == "ok" and m["params"]["num_workers"] == 2 and m["params"]["batch_size"] == 8
    assert "samples/s:" in proc.stdout
    assert (out / "config.resolved.yaml").exists()
