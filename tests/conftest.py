from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tunekit.config import set_dotted

REPO = Path(__file__).resolve().parent.parent


def sleepy_config(**overrides: Any) -> dict[str, Any]:
    """A config of the known-answer workload (sleepy dataset + sleepy model) on the CPU."""
    cfg: dict[str, Any] = {
        "name": "sleepy",
        "device": "cpu",
        "workload": {
            "model": "tunekit.workloads.synthetic:sleepy_model",
            "model_args": {"step_wait_s": 0.02},
            "dataset": "tunekit.workloads.synthetic:sleepy_dataset",
            "dataset_args": {"sample_wait_s": 0.005},
        },
        "search": {"num_workers": [0, 2], "batch_size": [8], "pin_memory": [False], "prefetch_factor": [2]},
        # a loaded 2-core box disturbs trials: resuming keeps them, and the repeats are tested where they are the
        # subject (tests/test_store.py, the script decisions of tests/analysis/test_analysis.py)
        "trial": {
            "warmup_steps": 2,
            "measure_windows": 2,
            "window_s": 0.5,
            "precision": None,
            "timeout_s": 60,
            "remeasure_disturbed": False,
        },
        "selection": {"repeats": 0},
    }
    for key, value in overrides.items():
        set_dotted(cfg, key, value)
    return cfg


def measurement(
    number: int,
    stage: str,
    mode: str,
    rate: float | None,
    *,
    status: str = "ok",
    num_workers: int = 0,
    prefetch_factor: int | None = None,
    pin_memory: bool = False,
    batch_size: int = 64,
    grad_accum: int = 1,
    compile: str = "none",
    ranks: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """A measurement.json (version 2) as the launcher writes it, for analysis, plan, diagnosis and plot tests. A
    quiet trial by default (1 % window noise, half the memory free, 30 % of 16 CPUs, no data wait); ``extra`` sets
    any field, but a mapping under ``extra`` is the trial's user-defined knobs (``Knobs.to_dict()`` passes them
    so)."""
    ok = status == "ok"
    params = {
        "num_workers": num_workers,
        "prefetch_factor": (prefetch_factor or 2) if num_workers else None,
        "pin_memory": pin_memory,
        "batch_size": batch_size,
        "grad_accum": grad_accum,
        "compile": compile,
        "ranks": ranks,
        "extra": extra.pop("extra", None) or {},
    }
    base: dict[str, Any] = {
        "version": 2,
        "number": number,
        "stage": stage,
        "mode": mode,
        "status": status,
        "reason": "" if ok else status,
        "params": params,
        "rate": rate if ok else None,
        "noise_cv": 0.01,
        "headroom": 0.5,
        "rate_windows": [rate * 0.98, rate, rate * 1.01] if ok and rate else None,
        "cpu_count": 16,
        "cpu_util_frac": 0.3,
        "data_wait_frac": 0.0,
        "compile_s": 0.0,
    }
    return {**base, **extra}


def repeated(ms: list[dict[str, Any]], runs: int = 3, jitter: float = 0.002) -> list[dict[str, Any]]:
    """``ms`` with each completed end-to-end trial measured ``runs`` times in all, in alternated blocks (run k of
    every config back to back), run k of each ``jitter`` above, then below, its first: the repeats then measure a
    small spread between runs, every block moves every config alike, and each config's mean is its first rate, so a
    decision reads the rates as written (for tests of what is decided, not of the evidence)."""
    out, number = list(ms), max(m["number"] for m in ms) + 1
    for run in range(1, runs):
        shift = jitter if run % 2 else -jitter
        for m in ms:
            if m["mode"] == "train" and m.get("status", "ok") == "ok" and m.get("rate"):
                out.append({**m, "number": number, "run": run, "rate": m["rate"] * (1 + shift)})
                number += 1
    return out


def trial_number(trial: Any) -> int:
    """A stored trial's run-wide number (its trials/<n>/ folder)."""
    return trial.user_attrs.get("number", trial.number)


def study_trials(out: Path) -> list[Any]:
    """Every trial of a run's study.db, both studies (end-to-end and ceilings), in run-wide order."""
    import optuna

    storage = f"sqlite:///{out / 'study.db'}"
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    trials = [t for name in names for t in optuna.load_study(study_name=name, storage=storage).get_trials()]
    return sorted(trials, key=trial_number)


@pytest.fixture
def write_config(tmp_path: Path):
    def write(data: Any, name: str = "cfg.yaml") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture(autouse=True)
def _run_from_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    # Trial workers import test helpers (tests._workloads) relative to the working directory.
    monkeypatch.chdir(REPO)


@pytest.fixture(autouse=True)
def _one_fork_server_across_tests(monkeypatch: pytest.MonkeyPatch):
    """Trials run in this process share one fork server across tests, as a sweep's trials do.

    The launcher keys its fork server on the trials' whole environment (``_forks.server_key``), and pytest sets
    PYTEST_CURRENT_TEST to each test's id: left in, that variable alone would start a fresh server (a fresh
    interpreter importing torch, ~1.5 s on 2 cores) for every test that runs a trial. The trials' environment here is
    the launcher's own, less that one variable. A server a test broke (made it refuse to fork, or killed it) is
    closed after that test, so the next one starts afresh as it would have before."""
    from tunekit.launch import _forks, _start

    real = _start.child_env
    monkeypatch.setattr(_start, "child_env", lambda: {k: v for k, v in real().items() if k != "PYTEST_CURRENT_TEST"})
    yield
    server = _forks.SERVERS.get("server")
    if server is not None and (server.broken or server.proc.poll() is not None):
        _forks.close_servers()


LONGEST_FIRST = (
    "test_driver.py",
    "cli/test_cli.py",
    "plan/test_plan.py",
    "test_store.py",
    "worker/script/test_session.py",
    "worker/test_meter.py",
    "test_api.py",
    "launch/test_ending.py",
    "test_fleet.py",
    "worker/script/test_loader.py",
    "report/test_recommendation.py",
    "launch/test_procs.py",
    "worker/test_dist.py",
    "check/test_check.py",
    "launch/test_forks.py",
    "launch/test_node.py",
    "workloads/test_images.py",
    "worker/script/test_hook.py",
    "analysis/test_analysis.py",
    "worker/test_factory.py",
    "worker/script/test_forkserver.py",
    "diagnosis/test_diagnosis.py",
    "launch/test_leftovers.py",
)
"""The files whose tests take longest (tens of seconds each, whole sweeps and trials), by their path under tests/, in
that order: pytest-xdist hands out whole files (``--dist loadfile``, ``--no-loadscope-reorder``) in the order
collected, and with the long ones first the short ones fill the end, so no worker waits long for another's last file."""


def _under_tests(item: pytest.Item) -> str:
    """The item's file by its path under tests/ (a file's name alone repeats across folders: check/test_check.py and
    cli/test_check.py)."""
    try:
        return item.path.relative_to(REPO / "tests").as_posix()
    except ValueError:
        return item.path.as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # stable: each file's own order kept, but its ``alone`` tests last and together (they drain the other workers
    # once, pytest_runtest_protocol)
    items.sort(
        key=lambda item: (
            rank.get(_under_tests(item), len(rank)),
            _under_tests(item),
            item.get_closest_marker("alone") is not None,
        )
    )
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


LOCKS = Path(tempfile.gettempdir()) / f"tunekit-tests-{os.getuid()}"
"""The lock folder of every test run of this user on this machine, with pytest-xdist or without: two runs side by
side (two checkouts, a file run on its own beside the suite) keep off each other's ``alone`` tests as the workers
of one run do."""
LOCK_WAIT_S = 600.0
"""The longest a test waits for a lock; then it runs without it. Ten times the longest test: within a run no wait
comes near it; a test another run holds still (stopped in a debugger) delays this run no longer."""


_HELD: list[Any] = []
"""The ``cpus`` lock file an ``alone`` test kept for the next test of its worker, also ``alone``."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Tests marked ``alone`` have the CPUs to themselves: they measure real CPU work (verdicts read from workers'
    CPU time, a host other processes keep busy, a run that must not be marked disturbed), so a test beside them
    would change their answer (another test file under the suite's ``-n 4``, or another run on this machine: two
    runs side by side on 2 cores read ``shared-host`` where ``data-starved`` and ``compute-bound`` were due). A
    readers-writer lock over the tests of every run (``LOCKS``): every other test holds ``cpus`` shared for its
    setup, call and teardown; an ``alone`` test takes the ``gate`` first, so no new test starts beside it, then waits
    for ``cpus`` exclusively, and then for what the tests before it left running to end (a killed sweep's trial
    dying with it, a server shutting down, a sweep run by hand): until the CPUs are quiet for half a second, at most
    15 s. An ``alone`` test followed on its worker by another (a file's are run last, together) keeps ``cpus`` for
    it: the other workers drain once for them all."""
    LOCKS.mkdir(exist_ok=True)
    alone = item.get_closest_marker("alone") is not None
    cpus = _HELD.pop() if _HELD else None
    if cpus is None:
        cpus = open(LOCKS / "cpus", "a")
        with open(LOCKS / "gate", "a") as gate:
            _flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            _flock(cpus, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
    if alone:
        _wait_for_quiet_cpus()
    try:
        yield
    finally:
        if alone and nextitem is not None and nextitem.get_closest_marker("alone") is not None:
            _HELD.append(cpus)  # still exclusive: the next test is alone too
        else:
            fcntl.flock(cpus, fcntl.LOCK_UN)
            cpus.close()


def _flock(file: Any, mode: int) -> None:
    """``flock(file, mode)``, waiting at most ``LOCK_WAIT_S``."""
    import time

    end = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(file, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > end:
                return
            time.sleep(0.05)


def _wait_for_quiet_cpus(quiet: float = 25.0, deadline_s: float = 15.0) -> None:
    """Until the machine's CPU use stays under ``quiet`` % of one CPU over half a second (or the deadline)."""
    import time

    import psutil

    cpus, end = psutil.cpu_count() or 1, time.monotonic() + deadline_s
    psutil.cpu_percent()
    while time.monotonic() < end:
        time.sleep(0.5)
        if psutil.cpu_percent() * cpus < quiet:
            return
