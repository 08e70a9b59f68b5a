"""The sweep's loop (tunekit/driver.py) through its stable interfaces: the CLI in real subprocesses, the files a run
writes and the study in study.db.

Budget stops, interrupts (SIGTERM, Ctrl-C) and resume, the accumulation stage, a driver that never imports torch,
a resume that would mix strategies, and a finished run resumed in a folder it cannot trust or write. Every sweep
here is the tiny CPU sleepy workload (tests/conftest.py): a trial is a few seconds, mostly interpreter and torch
start-up."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import psutil
import pytest
import yaml

import tunekit
from tests.conftest import REPO, sleepy_config, study_trials, trial_number
from tests.plan.test_plan import _knee_config
from tunekit.errors import TunekitError, UsageError

EXIT_INTERRUPTED = 130  # cli.main: a KeyboardInterrupt (Ctrl-C, or SIGTERM/SIGHUP via the driver) exits 130


def _tunekit(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunekit", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def _sweep_cmd(config: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tunekit", "sweep", str(config), "--out", str(out), *extra]


def _finished(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if t.state.is_finished()]


def _measured(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """Trials that finished with a measurement (ok or failed); an interrupted trial has none."""
    return [t for t in _finished(trials) if "measurement" in t.user_attrs]


def _key(t: optuna.trial.FrozenTrial) -> tuple:
    return (t.user_attrs.get("stage"), *sorted(t.params.items()))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains ``text`` (zombies have an empty one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append((int(entry.name), cmdline))
    return found


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the sweep exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


# --- 1. budget.minutes (the same run is the first half of test 6) ---------------------------------------------------

PLANNED = 5  # staged, workers [0, 2], one batch, on the CPU: 1 compute + 2 loader + 2 end-to-end trials


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``tunekit sweep --strategy staged --budget-min 0.05``: one trial alone (interpreter, torch, build, windows)
    outlasts 3 s, so the budget stops the sweep after its first trial or so."""
    base = tmp_path_factory.mktemp("budget")
    config, out = base / "cfg.yaml", base / "run"
    config.write_text(
        yaml.safe_dump(sleepy_config(**{"search.num_workers": [0, 2], "trial.window_s": 0.3}), sort_keys=False)
    )
    extra = ("--strategy", "staged", "--budget-min", "0.05")
    result = _tunekit("sweep", str(config), "--out", str(out), *extra)
    return {"config": config, "out": out, "result": result, "args": extra}


@pytest.mark.slow
def test_budget_minutes_stops_the_sweep_early_and_still_writes_outputs(budget_run: dict):
    out, result = budget_run["out"], budget_run["result"]
    meta = json.loads((out / "sweep.json").read_text())
    assert "budget.minutes = 0.05" in meta["stop_reason"], (meta, result.stderr)
    assert meta["interrupted"] is False
    trials = pd.read_csv(out / "trials.csv")
    assert 1 <= len(trials) < PLANNED, trials
    assert len(study_trials(out)) == len(trials)
    report = (out / "report.md").read_text()
    assert "Stopped early" in report and "budget.minutes" in report
    # too few trials for an end-to-end comparison: no recommendation, said why, exit 1
    assert result.returncode == 1, result.stderr
    assert not (out / "recommended.yaml").exists()
    assert "No recommendation" in result.stdout
    for name in ("study.db", "config.resolved.yaml", "env.json"):
        assert (out / name).exists(), name


def test_the_time_budget_ends_with_the_baseline_it_kept_room_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The driver's loop on a simulated clock (trials are not launched): 20 s a trial, but the end-to-end start
    takes 60 s, eating the room the budget kept for PyTorch's defaults. The sweep still ends with them, started
    before the deadline, rather than with a report without its baseline."""
    import io

    from rich.console import Console

    from tests.conftest import measurement
    from tunekit import config, driver
    from tunekit.contract import Measurement
    from tunekit.records import TrialRow

    clock = [0.0]
    monkeypatch.setattr(driver.time, "monotonic", lambda: clock[0])

    def run_one(sweep: driver._RunningSweep, req) -> TrialRow:
        k = req.knobs
        took = 0.0 if req.skip else 60.0 if (req.stage, k.num_workers) == ("end_to_end", 6) else 20.0
        clock[0] += took
        rate = {"compute": 400.0, "loader": 100.0 * k.num_workers}.get(req.mode, 80.0 if not k.num_workers else 400.0)
        m = measurement(
            len(sweep.rows),
            req.stage,
            req.mode,
            None if req.skip else rate,
            status="skipped" if req.skip else "ok",
            launcher_wall_s=took,
            **k.to_dict(),
        )
        return TrialRow.from_measurement(Measurement.from_dict(m))

    monkeypatch.setattr(driver, "_run_one", run_one)
    cfg = config.from_dict(sleepy_config(**{"search.num_workers": [0, 2, 6, 8], "search.pin_memory": [False]}))
    sweep = driver._RunningSweep(
        cfg=cfg,
        run_dir=tmp_path,
        strategy="staged",
        runs=None,
        rows=[],
        cuda=False,
        console=Console(file=io.StringIO()),
    )
    driver._run_trials(sweep, driver._Budget(minutes=2.5, max_trials=60))
    run = [(r.stage, r.knobs.num_workers) for r in sweep.rows if r.status == "ok"]
    assert run[-2:] == [("end_to_end", 6), ("end_to_end", 0)], run  # the start, then the owed baseline
    assert "budget.minutes = 2.5 would be exceeded by another trial (~20 s each)" in sweep.stop_reason
    assert clock[0] == 160.0  # started at 140 s, before the 150-s deadline; the median room was not left


# --- 2. SIGTERM / Ctrl-C during a sweep, then resume -----------------------------------------------------------


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_mid_trial(
    cmd: list[str], out: Path, pids: Path, trial: int, sig: signal.Signals, logs: Path
) -> tuple[int, list[int]]:
    """Start the sweep, wait until trial ``trial`` has its two DataLoader workers serving samples, send ``sig`` to
    the sweep process alone; return its exit code and the pids of the trial's worker and loader workers."""
    with open(logs / "stdout", "w") as so, open(logs / "stderr", "w") as se:
        # as a terminal's foreground job: a test run started in the background inherits SIGINT ignored (the shell's
        # rule for background jobs), and a sweep rightly keeps an inherited SIG_IGN
        proc = subprocess.Popen(
            cmd,
            stdout=so,
            stderr=se,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )
    try:
        pid_file = out / "trials" / str(trial) / "worker.pid"
        _wait_for(pid_file.exists, 120, f"trial {trial} to start", proc)
        worker = int(pid_file.read_text())

        def loader_workers() -> list[int]:
            found = []
            for p in pids.iterdir():
                try:
                    if psutil.Process(int(p.name)).ppid() == worker:
                        found.append(int(p.name))
                except psutil.NoSuchProcess:
                    pass
            return found

        _wait_for(lambda: len(loader_workers()) >= 2, 60, f"trial {trial}'s DataLoader workers to serve", proc)
        victims = [worker, *loader_workers()]
        proc.send_signal(sig)  # the sweep process only: the trial runs in its own session
        return proc.wait(timeout=60), victims
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _assert_no_survivors(out: Path, victims: list[int]) -> None:
    run_dir = str(out.resolve())
    deadline = time.monotonic() + 10  # grace period; the launcher already waited for the trial's group to die
    while (_processes_mentioning(run_dir) or any(_alive(p) for p in victims)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_mentioning(run_dir)
    assert not [p for p in victims if _alive(p)], "the trial or its DataLoader workers survived the sweep"


def _interrupt_config(write_config, pids: Path, batches: list[int]) -> Path:
    # 2 loader workers at 10 ms per sample: a batch of 32 takes a worker 0.32 s, so a batch-32 trial has ~5 s of
    # pipeline fill, warm-up and windows (>= 1.5 s each) left after its workers start serving: the signal lands
    # inside it even when a loaded 2-core host is slow to see the workers
    return write_config(
        sleepy_config(
            **{
                "workload.dataset_args": {"sample_wait_s": 0.01, "pid_dir": str(pids)},
                "search.num_workers": [2],
                "search.batch_size": batches,
                "search.prefetch_factor": [2],
                "trial.window_s": 1.5,
            }
        )
    )


@pytest.mark.slow
def test_sigterm_mid_trial_kills_its_process_tree_then_resume_keeps_finished_trials(write_config, tmp_path: Path):
    pids = tmp_path / "pids"  # every process that serves a sample touches a file named by its pid here
    pids.mkdir()
    config = _interrupt_config(write_config, pids, [8, 32])  # grid: trial 0 at batch 8, trial 1 at batch 32
    out = tmp_path / "run"
    cmd = _sweep_cmd(config, out, "--strategy", "grid")
    rc, victims = _signal_mid_trial(cmd, out, pids, 1, signal.SIGTERM, tmp_path)
    assert rc == EXIT_INTERRUPTED, (tmp_path / "stderr").read_text()
    _assert_no_survivors(out, victims)

    meta = json.loads((out / "sweep.json").read_text())
    assert meta["interrupted"] is True and "interrupted" in meta["stop_reason"]
    assert (out / "report.md").exists()
    assert list(pd.read_csv(out / "trials.csv")["number"]) == [0]  # the outputs hold the finished trial
    before = study_trials(out)
    assert [t.number for t in _measured(before)] == [0]
    assert before[1].user_attrs.get("status") == "interrupted" and "measurement" not in before[1].user_attrs
    kept = {t.number: t.value for t in _measured(before)}

    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr
    assert "finished trial(s)" in resumed.stderr and "are kept" in resumed.stderr
    after = study_trials(out)
    assert len(_finished(after)) > len(_finished(before))
    measured = _measured(after)
    keys = [_key(t) for t in measured]
    assert len(keys) == len(set(keys)) == 2, keys  # both grid configs once: none lost, none repeated
    assert {t.number: t.value for t in measured if t.number in kept} == kept  # trial 0 kept as it was
    assert sorted(t.params["batch_size"] for t in measured) == [8, 32]
    resumed_meta = json.loads((out / "sweep.json").read_text())
    assert resumed_meta["interrupted"] is False
    # each invocation's wall time, the cut one first (its finished trial at its end), then the one that resumed it
    calls = resumed_meta["invocations"]
    assert [(c["interrupted"], c["trials"]) for c in calls] == [(True, 1), (False, 2)]
    assert all(c["wall_s"] > c["dataset_s"] >= 0 for c in calls)
    assert len(pd.read_csv(out / "trials.csv")) == 2
    assert (out / "recommended.yaml").exists()

    # the resume ran a trial, so it prepared the dataset (a rerun with nothing left to run prepares neither the
    # dataset nor the fork server: test_sweep_json_records_each_invocation... below)
    assert "dataset ready" in resumed.stderr and calls[1]["dataset_s"] > 0


@pytest.mark.slow
def test_ctrl_c_mid_first_trial_kills_its_process_tree_and_still_writes_outputs(write_config, tmp_path: Path):
    pids = tmp_path / "pids"
    pids.mkdir()
    config = _interrupt_config(write_config, pids, [32])
    out = tmp_path / "run"
    rc, victims = _signal_mid_trial(
        _sweep_cmd(config, out, "--strategy", "grid"), out, pids, 0, signal.SIGINT, tmp_path
    )
    assert rc == EXIT_INTERRUPTED, (tmp_path / "stderr").read_text()
    _assert_no_survivors(out, victims)
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["interrupted"] is True and "interrupted" in meta["stop_reason"]
    for name in ("report.md", "trials.csv", "study.db"):
        assert (out / name).exists(), name
    assert not (out / "recommended.yaml").exists()
    trials = study_trials(out)
    assert [t.user_attrs.get("status") for t in trials] == ["interrupted"]  # not finished: it will run again
    assert _measured(trials) == []


# --- 3. + 4. + 5. (a valid file): one in-process sweep with an effective-batch target ----------------------------

TARGET = 16


@pytest.fixture(scope="module")
def in_process_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A real staged sweep with search.target_effective_batch, run by ``tunekit.cli.main`` inside one fresh
    interpreter, which then reports which torch modules it had imported. Its tests read the knee (2 workers, with
    accumulation): 4 ms a sample makes the loader the bound by its sleeps, 2 workers 2.3-2.6x PyTorch's defaults,
    which a busy box's overheads do not close (at 1 ms a sample they did: the knee went to 0 workers)."""
    base = tmp_path_factory.mktemp("inproc")
    config, out = base / "cfg.yaml", base / "run"
    cfg = sleepy_config(
        **{
            "workload.model_args": {"step_wait_s": 0.005},
            "workload.dataset_args": {"sample_wait_s": 0.004},
            "search.num_workers": [2],
            "search.batch_size": [4, 8],
            "search.target_effective_batch": TARGET,
            "trial.window_s": 0.2,
        }
    )
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    code = textwrap.dedent(f"""
        import json, sys
        from tunekit.cli import main
        code = 0
        try:
            main(["sweep", {str(config)!r}, "--out", {str(out)!r}, "--quiet"])
        except SystemExit as exc:
            code = exc.code
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision"))
        print("RESULT " + json.dumps({{"exit": code, "torch_modules": loaded}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    return {"out": out, "output": proc.stdout + proc.stderr, **json.loads(lines[-1][len("RESULT ") :])}


@pytest.mark.slow
def test_the_driver_process_never_imports_torch(in_process_sweep: dict):
    assert in_process_sweep["exit"] in (0, None), in_process_sweep["output"]
    assert in_process_sweep["torch_modules"] == []
    assert (in_process_sweep["out"] / "recommended.yaml").exists()
    assert len(pd.read_csv(in_process_sweep["out"] / "trials.csv")) >= 4  # the trials did run (in subprocesses)


@pytest.mark.slow
def test_accumulation_stage_reaches_the_target_effective_batch(in_process_sweep: dict):
    out = in_process_sweep["out"]
    trials = pd.read_csv(out / "trials.csv")
    accumulation = trials[trials["stage"] == "accumulation"]
    assert len(accumulation) >= 1, trials[["number", "stage", "batch_size", "grad_accum", "status"]]
    assert set(accumulation["status"]) == {"ok"}
    assert all(accumulation["batch_size"] * accumulation["grad_accum"] == TARGET)
    assert sorted(zip(accumulation["batch_size"], accumulation["grad_accum"], strict=True)) == [(4, 4), (8, 2)]
    raw = yaml.safe_load((out / "recommended.yaml").read_text())
    assert raw["training"]["grad_accum"] * raw["dataloader"]["batch_size"] == TARGET
    rec = tunekit.load_recommended(out / "recommended.yaml")
    assert rec.grad_accum * rec.batch_size == TARGET and rec.grad_accum > 1
    assert rec.evidence["run"]["knee_trial"] in set(accumulation["number"])


@pytest.mark.slow
def test_recommended_yaml_of_a_real_sweep_drives_a_dataloader(in_process_sweep: dict):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    rec = tunekit.load_recommended(in_process_sweep["out"] / "recommended.yaml")
    kwargs = rec.dataloader_kwargs()
    accepted = set(inspect.signature(DataLoader.__init__).parameters)
    assert {"batch_size", "num_workers", "pin_memory"} <= set(kwargs) <= accepted, kwargs
    assert kwargs["num_workers"] == 2 and {"prefetch_factor", "persistent_workers"} <= set(kwargs)
    dataset = TensorDataset(torch.randn(4 * rec.batch_size, 3), torch.arange(4 * rec.batch_size))
    loader = DataLoader(dataset, **kwargs)
    x, y = next(iter(loader))
    assert x.shape == (rec.batch_size, 3) and y.shape == (rec.batch_size,)
    del loader  # persistent workers shut down with the loader


# --- 6. resuming with another strategy ---------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_with_a_different_strategy_is_refused(budget_run: dict, tmp_path: Path):
    """Staged and grid trials must not mix in one study: the staged run resumed as a grid in the same folder is
    refused (exit 2, one line naming --no-resume) and the study is left as it was."""
    out = tmp_path / "run"
    shutil.copytree(budget_run["out"], out)  # a copy of test 1's staged run, so that test keeps its own
    before = [(t.number, t.state, t.user_attrs.get("stage")) for t in study_trials(out)]
    assert before and {stage for _, _, stage in before} <= {"compute", "loader", "end_to_end"}

    given = dict(zip(budget_run["args"][::2], budget_run["args"][1::2], strict=True))
    assert given["--strategy"] == "staged"
    with pytest.raises(UsageError) as refused:  # `tunekit sweep` prints it as its one line and exits 2
        tunekit.sweep(budget_run["config"], out=out, strategy="grid", budget_min=float(given["--budget-min"]))
    assert refused.value.exit_code == 2 and "\n" not in str(refused.value)
    assert "--no-resume" in str(refused.value)
    assert [(t.number, t.state, t.user_attrs.get("stage")) for t in study_trials(out)] == before
    assert json.loads((out / "sweep.json").read_text())["strategy"] == "staged"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunekit", *args], capture_output=True, text=True, timeout=300)


def _tiny_sweep(write_config, out: Path, **overrides):
    """A tiny grid sweep into ``out`` through the Python API, in this process: a refusal or a storage failure is
    the TunekitError that ``tunekit sweep`` prints as its one line and exits with (tunekit.cli.main, tested by
    tests/cli/test_cli.py's command-line tests and by the command lines run here)."""
    cfg = write_config(
        sleepy_config(**{"search.num_workers": [0, 1], "trial.window_s": 0.3, "strategy": "grid", **overrides})
    )
    return tunekit.sweep(cfg, out=out)


def _one_line(err: pytest.ExceptionInfo[TunekitError], exit_code: int) -> str:
    """The refusal's text, checked to be the one line the command line prints, with its exit code."""
    assert err.value.exit_code == exit_code and "\n" not in str(err.value), (err.value.exit_code, str(err.value))
    return str(err.value)


@pytest.fixture(scope="module")
def _finished_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished tiny sweep for the module, run under umask 077; each test that only needs a finished run gets
    a copy of it."""
    base = tmp_path_factory.mktemp("tiny")

    def write(data: Any, name: str = "cfg.yaml") -> Path:
        path = base / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    old = os.umask(0o077)  # test_outputs_follow_the_umask reads this run's own files
    try:
        assert _tiny_sweep(write, base / "run").recommendation is not None
    finally:
        os.umask(old)
    return base / "run"


@pytest.fixture
def finished(_finished_tiny: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(_finished_tiny, out)
    return out


def test_trials_the_study_does_not_know_are_never_overwritten(write_config, finished: Path):
    out = finished
    kept = {p.name: (p / "measurement.json").read_bytes() for p in (out / "trials").iterdir()}
    (out / "study.db").write_bytes(b"")  # lost: an empty file beside the trials
    with pytest.raises(TunekitError) as err:
        _tiny_sweep(write_config, out)
    _one_line(err, 2)
    refused = _cli("report", str(out))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert (out / "study.db").stat().st_size == 0  # neither wrote a schema into it
    assert {p.name: (p / "measurement.json").read_bytes() for p in (out / "trials").iterdir()} == kept
    (out / "study.db").unlink()
    with pytest.raises(TunekitError) as err:  # missing: the same refusal
        _tiny_sweep(write_config, out)
    assert "--no-resume" in _one_line(err, 2)


def test_a_trial_into_a_sweeps_folder_is_refused_and_unknown_folders_block_a_resume(write_config, finished: Path):
    out = finished
    cfg = write_config(sleepy_config(), name="one.yaml")
    with pytest.raises(TunekitError) as err:
        tunekit.trial(cfg, out=out)
    assert "another --out" in _one_line(err, 2)
    (out / "trials" / "99").mkdir()  # written by something else
    with pytest.raises(TunekitError) as err:
        _tiny_sweep(write_config, out)
    said = _one_line(err, 2)
    assert "trials/99" in said and "--no-resume" in said


def test_a_corrupt_study_is_one_line_naming_the_file_and_cause(write_config, finished: Path):
    out = finished
    (out / "study.db").write_bytes(b"this is not a database " * 100)
    with pytest.raises(TunekitError) as err:
        _tiny_sweep(write_config, out)
    said = _one_line(err, 1)
    assert "study.db" in said and "not a database" in said
    result = _cli("report", str(out))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "study.db" in lines[0] and "not a database" in lines[0]


@pytest.mark.parametrize(
    "umask,mode", [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)], ids=["umask-077", "umask-022", "umask-002"]
)
def test_outputs_follow_the_umask(_finished_tiny: Path, tmp_path: Path, umask: int, mode: int):
    """The module's tiny sweep ran under umask 077: its outputs are the owner's alone. A run's outputs rebuilt (as
    ``tunekit report`` does) and an environment snapshot saved (as ``tunekit env`` does) under 022 and 002 are
    readable by all, and group-writable under 002."""
    from tunekit._files import write_json_atomic
    from tunekit.driver import rebuild
    from tunekit.env import snapshot

    if umask == 0o077:
        out = _finished_tiny
        names = ("recommended.yaml", "report.md", "trials.csv", "env.json", "sweep.json", "config.resolved.yaml")
    else:
        out = tmp_path / "run"
        shutil.copytree(_finished_tiny, out)
        old = os.umask(umask)
        try:
            rebuild(out)
            write_json_atomic(out / "env.json", snapshot())
        finally:
            os.umask(old)
        names = ("recommended.yaml", "report.md", "trials.csv", "env.json")
    for name in names:
        assert stat.S_IMODE((out / name).stat().st_mode) == mode, name
    assert stat.S_IMODE((out / "plots" / "workers.png").stat().st_mode) == mode


def test_a_read_only_study_is_one_line_naming_the_file(write_config, finished: Path):
    out = finished
    db = out / "study.db"
    # root ignores file modes: make the file immutable instead (where the file system supports it)
    lock = ["chattr", "+i", str(db)] if os.geteuid() == 0 else ["chmod", "0444", str(db)]
    unlock = ["chattr", "-i", str(db)] if os.geteuid() == 0 else ["chmod", "0644", str(db)]
    if subprocess.run(lock, capture_output=True).returncode != 0:
        pytest.skip("this file system cannot make a file read-only for root")
    try:
        with pytest.raises(TunekitError) as err:
            _tiny_sweep(write_config, out)  # resuming a finished sweep still records its knee
    finally:
        subprocess.run(unlock, check=True)
    said = _one_line(err, 1)
    assert "study.db" in said and "readonly" in said, said


def test_a_read_only_run_folder_is_one_line_naming_the_file(write_config, finished: Path):
    """Resuming a finished sweep in a folder nothing may be written into: exit 1, one line naming the file it could
    not write (inside the run folder), and the recorded trials as they were."""
    out = finished
    kept = {p.name: (p / "measurement.json").read_bytes() for p in (out / "trials").iterdir()}
    before = [(t.number, t.value) for t in study_trials(out)]
    # root ignores file modes: make the folder immutable instead (where the file system supports it)
    lock = ["chattr", "+i", str(out)] if os.geteuid() == 0 else ["chmod", "0555", str(out)]
    unlock = ["chattr", "-i", str(out)] if os.geteuid() == 0 else ["chmod", "0755", str(out)]
    if subprocess.run(lock, capture_output=True).returncode != 0:
        pytest.skip("this file system cannot make a folder read-only for root")
    try:
        with pytest.raises(TunekitError) as err:
            _tiny_sweep(write_config, out)
    finally:
        subprocess.run(unlock, check=True)
    said = _one_line(err, 1)
    assert said.startswith(f"{out}/") and "cannot write" in said, said
    assert [(t.number, t.value) for t in study_trials(out)] == before
    assert {p.name: (p / "measurement.json").read_bytes() for p in (out / "trials").iterdir()} == kept


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 8 MiB file system of its own (tmpfs), or a skip where this machine does not allow mounting one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a small file system needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_one_line_and_the_sweep_resumes_once_space_is_freed(write_config, small_disk: Path):
    cfg = write_config(sleepy_config(**{"search.num_workers": [0, 1, 2], "trial.window_s": 0.3, "strategy": "grid"}))
    out = small_disk / "run"
    free_kib = int(
        subprocess.run(["df", "-k", "--output=avail", str(small_disk)], capture_output=True, text=True).stdout.split()[
            -1
        ]
    )
    (small_disk / "filler").write_bytes(b"\0" * ((free_kib - 230) * 1024))  # room for the study and a few trials
    with pytest.raises(TunekitError) as err:
        tunekit.sweep(cfg, out=out)
    said = _one_line(err, 1)
    assert "full" in said or "No space left" in said, said
    assert str(small_disk) in said  # names the file it could not write
    before = {t.user_attrs["number"]: t.value for t in _finished_trials(out)}

    (small_disk / "filler").unlink()
    resumed = tunekit.sweep(cfg, out=out)
    assert resumed.recommendation is not None, resumed.reason
    after = {t.user_attrs["number"]: t.value for t in _finished_trials(out)}
    assert all(after[n] == v for n, v in before.items())  # nothing recorded was lost or changed
    assert (out / "recommended.yaml").exists() and len(pd.read_csv(out / "trials.csv")) >= 3


def _finished_trials(out: Path) -> list:
    return [t for t in study_trials(out) if t.state.is_finished() and "measurement" in t.user_attrs]


def test_sweep_json_records_each_invocation_and_a_fresh_start_forgets_the_old_ones(
    write_config, finished: Path, capsys: pytest.CaptureFixture
):
    """A finished sweep rerun resumes (nothing left to run): its record gains a second invocation with the same
    trials, and it prepared neither the dataset nor the fork server; --no-resume starts the folder afresh, and its
    record holds that one invocation alone."""
    out = finished
    first = json.loads((out / "sweep.json").read_text())["invocations"]
    assert len(first) == 1 and first[0]["trials"] == 2 and first[0]["wall_s"] > 0 and first[0]["dataset_s"] > 0
    cfg = write_config(sleepy_config(**{"search.num_workers": [0, 1], "trial.window_s": 0.3, "strategy": "grid"}))
    tunekit.sweep(cfg, out=out, quiet=False)  # not quiet: what it prepares would be said
    said = capsys.readouterr().err
    assert "finished trial(s)" in said and "dataset ready" not in said, said
    again = json.loads((out / "sweep.json").read_text())["invocations"]
    # dataset_s stays 0.0 unless the one step that starts the fork server and prepares the dataset ran
    assert again[0] == first[0] and len(again) == 2 and again[1]["trials"] == 2 and again[1]["dataset_s"] == 0.0
    assert tunekit.sweep(cfg, out=out, resume=False).recommendation is not None
    fresh = json.loads((out / "sweep.json").read_text())["invocations"]
    assert len(fresh) == 1 and fresh[0]["trials"] == 2


@pytest.mark.slow
def test_resume_after_sigkill_mid_trial(write_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # two 0.5-s windows and the warm-up keep trial 1 running for well over a second after its pid file appears
    config = write_config(_knee_config(**{"search.num_workers": [0, 2, 6], "trial.window_s": 0.5}))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "tunekit", "sweep", str(config), "--out", str(out), "--strategy", "grid"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "trials" / "1" / "worker.pid").exists():  # trial 0 finished, trial 1 running
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    orphan = int((out / "trials" / "1" / "worker.pid").read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished_before = {trial_number(t): t.value for t in study_trials(out) if t.state.is_finished()}
    assert list(finished_before) == [0]

    resumed = tunekit.sweep(config, out=out, strategy="grid", quiet=False)
    assert resumed.recommendation is not None, resumed.reason
    assert "were running when the last sweep stopped" in capsys.readouterr().err
    with pytest.raises(ProcessLookupError):
        os.killpg(orphan, 0)  # the dead sweep's trial was killed, not left to compete
    trials = study_trials(out)
    done = [t for t in trials if "measurement" in t.user_attrs]
    keys = [(t.params["num_workers"], t.params["pin_memory"]) for t in done]
    assert sorted(keys) == [(0, False), (2, False), (6, False)]  # none lost, none repeated
    assert {trial_number(t): t.value for t in trials if trial_number(t) == 0} == finished_before  # kept as it was
    assert trials[1].state == optuna.trial.TrialState.FAIL and "measurement" not in trials[1].user_attrs


@pytest.mark.slow
def test_budget_max_trials_is_honoured(write_config, tmp_path: Path):
    config = write_config(_knee_config(**{"budget.max_trials": 3}))
    result = tunekit.sweep(config, out=tmp_path / "run")
    assert result.recommendation is None  # three trials reach no end-to-end comparison: no recommendation, said why
    assert len(study_trials(tmp_path / "run")) == 3
    trials = pd.read_csv(tmp_path / "run" / "trials.csv")
    assert len(trials) == 3
    # the budget kept the last room for the report's baseline: the ceilings, then PyTorch's defaults
    assert list(trials["stage"]) == ["compute", "loader", "end_to_end"]
    assert (trials.iloc[-1]["num_workers"], trials.iloc[-1]["pin_memory"]) == (0, False)
    assert not (tmp_path / "run" / "recommended.yaml").exists()
    assert result.reason.startswith("No recommendation")
    meta = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert "max_trials = 3" in meta["stop_reason"]


def test_an_iterable_dataset_sweep_prints_no_false_failure(
    write_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    cfg = write_config(
        sleepy_config(
            **{
                "workload.dataset": "tests._workloads:sharded_stream",
                "workload.dataset_args": {},
                "search.num_workers": [0],
                "search.batch_size": [4, 8],
                "strategy": "grid",
                "trial.window_s": 0.3,
            }
        )
    )
    run = tunekit.sweep(cfg, out=tmp_path / "run", quiet=False)  # what `tunekit sweep` prints, in this process
    said = capsys.readouterr().err
    assert run.recommendation is not None, said
    assert "building the dataset failed" not in said and "dataset ready: an IterableDataset" in said
