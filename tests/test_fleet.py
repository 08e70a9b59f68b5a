"""One sweep on several identical machines (``tunekit/fleet.py``): node processes sharing one study in a real
PostgreSQL server (tests/_postgres.py) take the plan's trials through optuna's queue, one SIGKILLed mid-trial.

The job is test_check's known answer: batch 8 on a model that sleeps 53.3 ms a step (150 samples/s at most), fed by
workers that sleep 5 ms a sample (200 samples/s each): the knee is 1 worker, 0 workers give 86/s, and every answer
lies a third from the next, so a loaded 2-core box does not blur it. The three nodes sweep its grid (every cell
independent), so the joiners, which start seconds after the first node on a loaded box, still find trials to take:
a staged plan's later stages decide on the last result (in one full-suite run the joiners arrived after its
parallel stages; in another, after a five-cell grid's last cell was taken). The staged plan's hand-out is
tests/plan/test_frontier.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import psutil
import pytest
import yaml

from tests._postgres import Server, postgres  # noqa: F401 - the fixture
from tests.conftest import REPO, sleepy_config
from tunekit import config, load_recommended, store
from tunekit.contract import Knobs, Mode, Stage
from tunekit.contract import process as names

QUICK = {
    "warmup_steps": 1,
    "measure_windows": 3,
    "window_s": 0.3,
    "precision": 0.05,
    "max_windows": 5,
    "timeout_s": 60,
    "remeasure_disturbed": False,
}
FLEET = {"heartbeat_s": 1, "grace_s": 3, "poll_s": 0.5}


def _config(**more: Any) -> dict[str, Any]:
    return sleepy_config(
        **{
            "name": "fleet",
            "workload.model_args.step_wait_s": 0.0533,
            "search.num_workers": [0, 1, 2, 3, 4],
            "trial": QUICK,
            # a tolerance of 25 %: the answers lie a third apart, and without repeats the knee's test reads
            # single runs with the 5 % prior spread, so 1 worker is shown within the tolerance of 2 only so wide
            "selection.tolerance": 0.25,
            "fleet": FLEET,
            **more,
        }
    )


def _env(**more: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}, **more}


def _node(cfg: Path, out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
    log = open(out.parent / f"{out.name}.log", "w")
    cmd = [sys.executable, "-m", "tunekit", "sweep", str(cfg), "--out", str(out), "--quiet", *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env or _env())
    log.close()
    return proc


def _wait_for(check: Any, timeout_s: float, what: str, every_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def _running_trial(out: Path) -> int | None:
    """The number of the trial a node runs now (its worker's pid file is there while it runs), or None."""
    found = [p.parent.name for p in (out / "trials").glob(f"*/{names.PID_FILE}")] if out.exists() else []
    return int(found[0]) if found else None


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    """Every trial of the run in both its studies."""
    runs = store.load_stored(url, "fleet")
    return [t for study in (runs.main, runs.ceilings) if study is not None for t in study.get_trials()]


def _leftovers(pids: set[int], root: Path) -> list[str]:
    """Processes a node started (they carry its pid as their launcher) or that name the test's folders."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            launcher = proc.environ().get(names.LAUNCHER_PID)
            cmdline = " ".join(proc.info["cmdline"] or [])
        except (psutil.Error, OSError):
            continue
        if proc.pid != os.getpid() and (launcher in {str(p) for p in pids} or str(root) in cmdline):
            found.append(f"{proc.pid} {cmdline[:120]}")
    return found


@pytest.fixture(scope="module")
def fleet(postgres: Server, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:  # noqa: F811
    """Three nodes of one sweep (the first runs it, two join), the first joiner to run a trial SIGKILLed in it; a
    one-process sweep of the same job on SQLite beside them."""
    root = tmp_path_factory.mktemp("fleet")
    cfg = root / "cfg.yaml"
    # nine cells, about half a minute on one node: the joiners start while most of them are still to run
    cfg.write_text(yaml.safe_dump(_config(strategy="grid", **{"search.prefetch_factor": [2, 4]})))
    url = postgres.database()
    started = time.monotonic()
    procs = {
        "alone": _node(cfg, root / "alone", "--no-resume"),
        "a": _node(cfg, root / "a", "--storage", url, "--no-resume"),
    }
    killed: dict[str, Any] = {}
    try:
        _wait_for(lambda: any(r.name == "fleet" and r.machine for r in store.runs_in(url)), 120, "the sweep's run", 0.5)
        procs.update({name: _node(cfg, root / name, "--storage", url, "--join") for name in ("b", "c")})

        def kill_first_busy_joiner() -> bool:
            for name in ("b", "c"):
                number = _running_trial(root / name)
                if number is not None and procs[name].poll() is None:
                    time.sleep(0.3)  # well inside its trial
                    procs[name].kill()
                    killed.update(name=name, number=number)
                    return True
            return all(procs[name].poll() is not None for name in ("b", "c"))

        _wait_for(kill_first_busy_joiner, 180, "a joiner to run a trial")
        for proc in procs.values():
            proc.wait(timeout=180)
    finally:  # a failed wait leaves no node running
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return SimpleNamespace(
        root=root,
        cfg=cfg,
        url=url,
        codes={name: proc.returncode for name, proc in procs.items()},
        killed=killed,
        pids={proc.pid for proc in procs.values()},
        wall_s=time.monotonic() - started,
    )


def test_three_nodes_run_every_trial_once_and_rerun_the_killed_nodes_trial(fleet: SimpleNamespace):
    logs = {n: (fleet.root / f"{n}.log").read_text() for n in ("a", "b", "c", "alone")}
    assert fleet.killed, f"no joiner ran a trial: {logs}"
    assert fleet.codes[fleet.killed["name"]] == -9
    assert all(code == 0 for n, code in fleet.codes.items() if n != fleet.killed["name"]), (fleet.codes, logs)

    trials = _trials(fleet.url)
    assert not [t.number for t in trials if not t.state.is_finished()]  # nothing left RUNNING or WAITING
    measured = [t for t in trials if "measurement" in t.user_attrs]
    runs = Counter(str(t.user_attrs["request"]) for t in measured)
    assert runs and set(runs.values()) == {1}, runs  # every trial completed exactly once
    # the killed trial: failed without a measurement when its node stopped beating, then queued again and run
    lost = [t for t in trials if t.user_attrs.get("number") == fleet.killed["number"]]
    assert [t.state for t in lost if "measurement" not in t.user_attrs] == [optuna.trial.TrialState.FAIL]
    again = [t for t in lost if "measurement" in t.user_attrs]
    assert len(again) == 1 and again[0].system_attrs.get("failed_trial") is not None


def test_the_shared_sweep_runs_the_trials_and_finds_the_knee_of_one_process(fleet: SimpleNamespace):
    shared = store.load_stored(fleet.url, "fleet").rows()
    alone = store.load_run(fleet.root / "alone").rows()
    assert Counter(r.key for r in shared) == Counter(r.key for r in alone)  # the trials a single machine runs
    knees = [load_recommended(fleet.root / n / "recommended.yaml").num_workers for n in ("a", "alone")]
    assert knees == [1, 1]  # the known answer, on both


def test_no_node_leaves_a_process_behind(fleet: SimpleNamespace):
    deadline = time.monotonic() + 10  # the killed node's trial dies by its parent watch within a second
    while _leftovers(fleet.pids, fleet.root) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not _leftovers(fleet.pids, fleet.root)


def test_another_machine_type_is_refused_in_one_line(fleet: SimpleNamespace):
    """A node whose usable CPUs differ (SLURM's allotment) is another machine type: refused before any trial."""
    out = fleet.root / "other"
    proc = _node(fleet.cfg, out, "--storage", fleet.url, "--join", env=_env(SLURM_CPUS_PER_TASK="1"))
    assert proc.wait(timeout=120) == 2
    lines = (fleet.root / "other.log").read_text().strip().splitlines()
    assert len(lines) == 1 and "is not the type the sweep runs on" in lines[0] and "cpus 2 there, 1 here" in lines[0]
    assert "s3cret" not in lines[0] and "***" in lines[0]  # the URL named, its password masked
    assert not (out / "trials").exists()


def _open(cfg: config.Config, url: str) -> Any:
    """A node's handle on the run in ``url`` (created by the first): its own connections."""
    return store.open_run(Path("/nonexistent"), cfg, resume=True, strategy="staged", storage=url)


def _claims(url: str, nodes: int) -> list[store.Claim | None]:
    """``nodes`` nodes claiming the same request at once, each through its own connection."""
    cfg = config.from_dict(_config())
    runs = [
        store.open_run(Path("/nonexistent"), cfg, resume=True, strategy="staged", storage=url) for _ in range(nodes)
    ]
    knobs = Knobs(num_workers=2, prefetch_factor=2, batch_size=8)
    got: list[store.Claim | None] = [None] * nodes
    gate = threading.Barrier(nodes)

    def claim(i: int) -> None:
        gate.wait()
        got[i] = runs[i].claim(cfg, Stage.end_to_end, Mode.train, knobs, 0)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_nodes_claiming_one_request_at_once_run_it_once(postgres: Server):  # noqa: F811
    url = postgres.database()
    got = _claims(url, 4)
    running = [c for c in got if c is not None]
    assert len(running) == 1, got  # the others popped a duplicate (or each other's) and stepped aside
    cfg, runs = config.from_dict(_config()), store.load_stored(url, "fleet")
    while runs.waiting():  # what a node listing the queue a moment too early left there: its next loop pops it
        assert runs.pop_waiting(cfg) is None  # a second trial of the running request: it steps aside too
    states = Counter(t.state for t in _trials(url))
    assert states[optuna.trial.TrialState.RUNNING] == 1 and not states[optuna.trial.TrialState.WAITING]


def test_a_trial_whose_node_stops_beating_is_queued_again_under_its_number(postgres: Server):  # noqa: F811
    url = postgres.database()
    cfg = config.from_dict(_config())
    runs = _open(cfg, url)
    knobs = Knobs(num_workers=2, prefetch_factor=2, batch_size=8)
    dead = runs.claim(cfg, Stage.end_to_end, Mode.train, knobs, 0)
    assert dead is not None
    time.sleep(FLEET["grace_s"] + 1.5)  # no beat: its node is gone
    other = _open(cfg, url)
    other.fail_stale()
    assert other.waiting() == 1
    again = other.pop_waiting(cfg)
    assert again is not None and again.number == dead.number and again.retried == dead.number
    assert (again.stage, again.mode, again.knobs, again.run) == (dead.stage, dead.mode, dead.knobs, dead.run)
    with other.beating(again):  # a live node beats: its trial is never taken for stale
        time.sleep(FLEET["grace_s"] + 1.5)
        other.fail_stale()
    assert other.in_flight() == [(Stage.end_to_end, Mode.train, knobs, 0)]


def test_a_trial_whose_node_died_before_its_first_beat_is_queued_again(postgres: Server):  # noqa: F811
    """A node killed between asking for its trial and recording its first heartbeat leaves a running trial optuna
    never finds stale (it has no heartbeat): after twice the grace period another node fails it and queues it again,
    while a claimed trial that beats is left running."""
    url = postgres.database()
    cfg = config.from_dict(_config())
    runs = _open(cfg, url)
    knobs = Knobs(num_workers=2, prefetch_factor=2, batch_size=8)

    def killed(trial_id: int) -> None:
        raise SystemExit("killed before its first beat")

    runs.storage.record_heartbeat = killed
    with pytest.raises(SystemExit):
        runs.claim(cfg, Stage.end_to_end, Mode.train, knobs, 0)
    other = _open(cfg, url)
    live = other.claim(cfg, Stage.end_to_end, Mode.train, Knobs(num_workers=4, prefetch_factor=2, batch_size=8), 0)
    assert live is not None
    with other.beating(live):
        other.fail_stale()
        assert other.waiting() == 0  # not yet: it may still be about to beat
        time.sleep(2 * FLEET["grace_s"] + 1.5)
        other.fail_stale()
        assert other.waiting() == 1
        again = other.pop_waiting(cfg)
    assert again is not None and (again.stage, again.knobs, again.run) == (Stage.end_to_end, knobs, 0)
    assert sorted(k.num_workers for _, _, k, _ in other.in_flight()) == [2, 4]
