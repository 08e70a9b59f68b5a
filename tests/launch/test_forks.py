"""The fork server (tunekit/launch/_forks.py): trials forked from one server that imported their modules once, each
isolated from the others; a server started ahead serves the first trial; an import that initialised CUDA makes
it refuse; a script's server starts in the script's working folder."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.conftest import sleepy_config
from tests.worker.script.test_session import SLEEPY_SCRIPT, _script_config, _trial
from tests.worker.test_meter import _spec
from tunekit import config
from tunekit.launch import run_trial


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


def test_the_fork_server_starts_trials_that_stay_isolated(tmp_path: Path):
    """Single-process trials are forked by the fork server (which imported the workload's module once); what a
    trial does to its modules dies with it: the model that refuses a second build in one process builds in each.
    With trial.fork_server: false a fresh interpreter starts the trial instead."""
    cfg = sleepy_config(
        **{
            "workload.model": "tests._workloads:once_per_process_model",
            "workload.model_args": {},
            "trial.measure_windows": 2,
            "trial.window_s": 0.3,
        }
    )
    first = run_trial(_spec(cfg, number=0, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "a", 60)
    second = run_trial(_spec(cfg, number=1, num_workers=0, batch_size=8), tmp_path / "b", 60)
    assert first.status == second.status == "ok", (first, second)
    assert first.started_by == second.started_by == "fork server"
    assert first.input_on_device is False  # the trial moved the batches: no input work on the device
    assert first.pid != second.pid
    fresh = run_trial(
        _spec(sleepy_config(**{"trial.fork_server": False, "trial.window_s": 0.3}), number=2, batch_size=8, threads=2),
        tmp_path / "c",
        60,
    )
    assert fresh.status == "ok" and fresh.started_by == "interpreter"
    assert fresh.params["threads"] == 2 and fresh.torch_threads == 2  # the thread knob, set


def test_a_fork_server_started_ahead_serves_the_first_trial(tmp_path: Path):
    """The sweep starts the fork server while it prepares the dataset: the first trial is forked by that same
    server (its imports already paid), not by one started on demand; with trial.fork_server: false none starts."""
    from tunekit.launch import _forks, start_fork_server

    _forks.close_servers()
    off = sleepy_config(**{"trial.fork_server": False})
    start_fork_server(config.from_dict(off))
    assert "server" not in _forks.SERVERS
    cfg = sleepy_config(**{"trial.measure_windows": 2, "trial.window_s": 0.3})
    start_fork_server(config.from_dict(cfg))
    ahead = _forks.SERVERS["server"].proc
    assert ahead.poll() is None  # importing torch while nothing asks it for a trial yet
    m = run_trial(_spec(cfg, number=0, batch_size=8), tmp_path / "t", 60)
    assert m.status == "ok" and m.started_by == "fork server"
    assert _forks.SERVERS["server"].proc is ahead and ahead.poll() is None  # the same server served it


def test_a_wait_on_a_forked_trial_whose_exit_message_was_lost_still_ends():
    """An interrupt that lands after a wait read the server's exit message but before it kept the code loses that
    message: a later wait (kill_tree's, without a timeout) must still end once the trial's process group is gone."""
    import signal

    from tunekit.launch import _forks, _start

    env = _start.child_env()
    server = _forks.server_for(env)
    proc = server.request(["--resolve", json.dumps({})], env, [])
    assert proc is not None
    try:
        while True:  # the message the cut-short wait read
            reply = server.receive(timeout=60)
            assert reply is not None, "the fork server died"
            if reply.get("exit") == proc.pid:
                break
        started = time.monotonic()
        assert proc.wait(timeout=30) == -signal.SIGKILL  # not TimeoutExpired: the group's end was seen
        assert time.monotonic() - started < 10
    finally:
        proc.stdout.close()


def test_the_fork_server_refuses_once_an_import_initialised_cuda(tmp_path: Path):
    """A workload module that leaves torch's CUDA state initialised (here marked so, on the CPU) makes the fork
    server refuse: the trial starts in a fresh interpreter, and so do the trials after it."""
    plain = sleepy_config(**{"trial.window_s": 0.3})
    first = run_trial(_spec(plain, number=0, batch_size=8), tmp_path / "a", 60)
    assert first.status == "ok" and first.started_by == "fork server", first
    cuda = sleepy_config(**{"trial.window_s": 0.3, "workload.loss": "tests._cuda_state_at_import:loss"})
    refused = run_trial(_spec(cuda, number=1, batch_size=8), tmp_path / "b", 60)
    assert refused.status == "ok" and refused.started_by == "interpreter", refused
    assert "initialised CUDA" in refused.fork_server_refused
    after = run_trial(_spec(plain, number=2, batch_size=8), tmp_path / "c", 60)
    assert after.status == "ok" and after.started_by == "interpreter", after
