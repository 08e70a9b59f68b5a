"""Faults that must not lose data, write in the wrong place, or be misreported."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest
import yaml

import tunekit
from tests.conftest import sleepy_config, study_trials
from tunekit import config, launch, store
from tunekit.contract import Knobs, TrialSpec
from tunekit.errors import ConfigError, StorageError, TunekitError, UsageError
from tunekit.launch import classify_error, run_trial


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunekit", *args], capture_output=True, text=True, timeout=300)


def test_a_second_process_on_a_run_folder_is_refused_naming_the_holder(write_config, tmp_path: Path):
    cfg = write_config(sleepy_config(**{"search.num_workers": [0]}))
    out = tmp_path / "run"
    held = launch.lock_run(out)  # a sweep in progress
    try:
        for args in (("sweep", str(cfg), "--out", str(out)), ("trial", str(cfg), "--out", str(out))):
            refused = _cli(*args)
            assert refused.returncode == 2, refused.stderr
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and str(out) in lines[0] and f"pid {os.getpid()}" in lines[0]
        assert not (out / "study.db").exists() and not (out / "trials").exists()  # nothing written
        with pytest.raises(UsageError, match="another tunekit process"):
            launch.lock_run(out)
    finally:
        held.close()
    assert (out / ".tunekit.lock").exists()  # what a killed holder leaves behind: it does not block
    launch.lock_run(out).close()


@pytest.mark.parametrize("name", ["../../etc/x", "/tmp/abs", "a/b", ".."])
def test_a_run_name_is_a_plain_folder_name(name: str):
    with pytest.raises(ConfigError) as err:
        config.from_dict(sleepy_config(name=name))
    (line,) = err.value.lines()
    assert "name" in line and "--out" in line


def test_a_bad_set_value_is_one_line_and_exit_2(write_config):
    bad = _cli("trial", str(write_config(sleepy_config())), "--set", "trial.window_s=[")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "trial.window_s" in bad.stderr


@pytest.mark.parametrize("step,shown", [("nan_step", "nan"), ("inf_step", "inf")])
def test_a_nan_or_inf_loss_is_diverged_and_never_the_knee(tmp_path: Path, step: str, shown: str):
    """A non-finite loss, seen at a window edge: the trial is diverged with the micro-batch it was seen at, and no
    rate. Recorded among completed end-to-end trials, it is neither the knee nor the best."""
    from tests.conftest import measurement
    from tunekit.analysis import select_knee
    from tunekit.config import Selection
    from tunekit.records import TrialRow, rows_from_measurements

    cfg = sleepy_config(**{"workload.step": f"tests._workloads:{step}", "trial.window_s": 0.3})
    spec = TrialSpec(
        number=0, stage="single", mode="train", knobs=Knobs(batch_size=8), config=config.from_dict(cfg).to_dict()
    )
    m = run_trial(spec, tmp_path / "t", 60)
    assert m.status == "diverged", m
    assert f"the loss is {shown} at micro-batch " in m.reason
    assert m.rate is None and m.rate_windows is None
    saved = json.loads((tmp_path / "t" / "measurement.json").read_text())
    assert saved["status"] == "diverged" and saved["reason"] == m.reason
    # the diverged trial as the sweep records it, beside two completed ones (0 workers at 80/s, 2 at 200/s)
    diverged = TrialRow.from_measurement(
        dataclasses.replace(m, number=12, stage="end_to_end", params={**m.params, "num_workers": 8})
    )
    rows = [
        *rows_from_measurements(
            [measurement(10, "end_to_end", "train", 80.0), measurement(11, "end_to_end", "train", 200.0, num_workers=2)]
        ),
        diverged,
    ]
    choice = select_knee(rows, Selection(tolerance=0.03, min_headroom=0.10))
    assert choice.knee is not None and choice.knee.number == 11 and choice.best.number == 11


def test_a_failure_message_in_brackets_is_printed_as_text_and_the_sweep_goes_on(
    write_config, tmp_path: Path, capsys: pytest.CaptureFixture
):
    cfg = write_config(
        sleepy_config(
            **{
                "workload.dataset": "tests._workloads:bracketed_failure_dataset",
                "workload.dataset_args": {},
                "search.num_workers": [0, 1, 2],
                "search.batch_size": [4],
                "trial.window_s": 0.3,
                "strategy": "grid",
            }
        )
    )
    out = tmp_path / "run"
    done = tunekit.sweep(cfg, out=out, quiet=False)  # the console `tunekit sweep` prints to, in this process
    said = capsys.readouterr().err
    assert done.recommendation is not None, said
    for name in ("report.md", "trials.csv", "sweep.json", "recommended.yaml"):
        assert (out / name).exists(), name
    assert "MarkupError" not in said
    # the reason as the worker raised it, brackets and all, and the log line's [stage/mode] prefix
    assert "[/data/img1.jpg]" in said and "[/__w/pytorch/" in said and "[bold]" in said
    assert "[grid/train]" in said
    assert "[/data/img1.jpg]" in (out / "report.md").read_text()
    # a one-worker loader crashes on every sample, the main process and two workers load fine: the sweep went on
    # past the crash to the next trial
    trials = pd.read_csv(out / "trials.csv").sort_values("number")
    assert list(zip(trials["num_workers"], trials["status"], strict=True)) == [(0, "ok"), (1, "crashed"), (2, "ok")]
    assert "[/data/img1.jpg]" in trials.iloc[1]["reason"]


def _tiny_sweep(write_config, out: Path, **overrides):
    """A tiny grid sweep into ``out`` through the Python API, in this process: a refusal or a storage failure is
    the TunekitError that ``tunekit sweep`` prints as its one line and exits with (tunekit.cli.main, tested by
    test_config's command-line tests and by the command lines run here)."""
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


def test_storage_failures_name_the_database_cause(tmp_path: Path):
    import optuna

    def failing() -> None:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as exc:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from exc

    with pytest.raises(StorageError) as err, store.storage_errors(tmp_path / "study.db"):
        failing()
    assert str(err.value) == f"{tmp_path / 'study.db'}: database or disk is full" and err.value.exit_code == 1


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


def test_worker_counts_are_bounded_by_the_machine(write_config):
    bound = max(4 * config.cpu_count(), 32)  # 4 per usable CPU, and 32 on any machine
    assert config.max_workers() == bound
    assert config.from_dict(sleepy_config(**{"search.num_workers": [0, bound]})).search.num_workers == [0, bound]
    with pytest.raises(
        ConfigError,
        match=rf"search.num_workers: {bound + 1} is more than this machine allows "
        rf"\({bound}:",
    ):
        config.from_dict(sleepy_config(**{"search.num_workers": [0, bound + 1]}))
    path = str(write_config(sleepy_config()))
    refused = _cli("trial", path, "--set", f"num_workers={bound + 1}")
    assert refused.returncode == 2 and f"num_workers={bound + 1}: more than this machine allows ({bound}:" in (
        refused.stderr
    )
    assert config.parse_knob("num_workers", str(bound)) == bound  # --set takes the bound itself
    assert classify_error("BlockingIOError: [Errno 11] Resource temporarily unavailable")[1].startswith(
        "the system refused another process"
    )


def test_a_chatty_dataset_cannot_fill_the_disk_with_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(launch._log, "LOG_KEEP_BYTES", 32 * 1024)
    cfg = sleepy_config(**{"workload.dataset_args": {"sample_wait_s": 0.0, "print_every": 1}})
    spec = TrialSpec(
        number=0, stage="single", mode="train", knobs=Knobs(batch_size=8), config=config.from_dict(cfg).to_dict()
    )
    m = launch.run_trial(spec, tmp_path / "t", 60)
    assert m.status == "ok", m
    log = (tmp_path / "t" / "worker.log").read_bytes()
    assert len(log) < 3 * 32 * 1024 and b"bytes of output left out here" in log
    assert log.rstrip().endswith(b"samples/s -> " + str(tmp_path / "t" / "measurement.json").encode())
    # the head: exactly the first 32 KiB the trial printed, from its first line on, then the line saying how much
    # of the middle was left out
    head, marker, _ = log.partition(b"\n[tunekit: ")
    assert len(head) == 32 * 1024, len(head)
    lines = head.split(b"\n")
    assert all(re.fullmatch(rb"sample \d+ x{1024}", line) for line in lines[:-1]), lines[0][:40]
    assert len(lines) == 32 and re.fullmatch(rb"sample \d+ x*", lines[-1])  # 31 whole lines of 1 KiB and a bit
    dropped = int(log[len(head) + len(marker) :].split(b" ", 1)[0])
    assert dropped > 0 and b"keeps the first and last 32768 bytes]" in log


@pytest.mark.parametrize("fork_server", [True, False])
def test_sigterm_while_the_dataset_is_prepared_ends_its_processes(write_config, tmp_path: Path, fork_server: bool):
    """The dataset is built forked from the fork server (or, without one, in a fresh `python -m tunekit.worker
    --prepare`); a SIGTERM to the sweep while it builds ends that process, and the sweep exits 130."""
    marker = 7654321  # in a fresh interpreter's command line
    cfg = write_config(
        sleepy_config(
            **{"workload.dataset_args": {"build_wait_s": 60, "num_samples": marker}, "trial.fork_server": fork_server}
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunekit", "sweep", str(cfg), "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def command(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # gone, or a zombie not reaped yet (the import-path check's, say)
            return ""

    def preparing() -> list[psutil.Process]:
        try:
            below = psutil.Process(proc.pid).children(recursive=True)
            if not fork_server:
                return [p for p in below if "--prepare" in command(p) and str(marker) in command(p)]
            servers = [p for p in below if "--fork-server" in command(p)]
            return [c for s in servers for c in s.children() if command(c)]  # the dataset being built
        except psutil.Error:
            return []

    deadline, first_seen = time.monotonic() + 120, {}
    while True:  # a child that lasts: the import-path check is forked from the server too, for milliseconds
        assert time.monotonic() < deadline and proc.poll() is None
        found = preparing()
        for p in found:
            first_seen.setdefault(p.pid, time.monotonic())
        if any(time.monotonic() - first_seen[p.pid] > 1.0 for p in found):
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err
    deadline = time.monotonic() + 10

    def alive() -> list[psutil.Process]:
        return [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    while alive():  # the sweep killed it before exiting; give the kernel a moment to reap it
        assert time.monotonic() < deadline, alive()
        time.sleep(0.05)


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
    before = {t.user_attrs["number"]: t.value for t in _finished(out)}

    (small_disk / "filler").unlink()
    resumed = tunekit.sweep(cfg, out=out)
    assert resumed.recommendation is not None, resumed.reason
    after = {t.user_attrs["number"]: t.value for t in _finished(out)}
    assert all(after[n] == v for n, v in before.items())  # nothing recorded was lost or changed
    assert (out / "recommended.yaml").exists() and len(pd.read_csv(out / "trials.csv")) >= 3


def _finished(out: Path) -> list:
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
