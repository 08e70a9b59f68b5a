"""Trials over several nodes (tunekit/launch/_node.py, ``tunekit node``): two nodes of one rank on localhost, and a
node that never joins."""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import sleepy_config
from tests.launch.test_ending import SLEEPY, _rank_spec
from tunekit import config
from tunekit.launch import run_trial


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_nodes_of_one_rank_on_localhost(tmp_path: Path):
    """Node 0 runs the trial (as a sweep does); node 1 is `tunekit node`, served through the rendezvous."""
    import subprocess
    import sys

    import yaml

    from tunekit.launch import release_nodes

    raw = sleepy_config(
        **{
            **SLEEPY,
            "launch.nproc_per_node": 1,
            "launch.nnodes": 2,
            "trial.window_s": 0.5,
            "launch.rdzv_endpoint": f"127.0.0.1:{_free_port()}",
        }
    )
    path = tmp_path / "two-nodes.yaml"
    path.write_text(yaml.safe_dump(raw))
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunekit",
            "node",
            str(path),
            "--node-rank",
            "1",
            "--out",
            str(tmp_path / "node1"),
            "--idle-timeout",
            "120",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        m = run_trial(_rank_spec(raw, num_workers=2, prefetch_factor=2, batch_size=8, ranks=2), tmp_path / "t", 120)
        assert m.status == "ok", m
        assert m.ranks == 2 and m.nodes == 2 and [p["rank"] for p in m.per_rank] == [0, 1]
        assert len({p["host"] for p in m.per_rank}) == 2  # one node each (the same machine here)
        assert release_nodes(config.from_dict(raw))
        out, _ = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, out
    assert "trial 0 done" in out and "released this node after 1 trial(s)" in out


def test_a_node_that_never_joins_fails_the_trial_at_the_join_timeout_saying_so(tmp_path: Path):
    """Two nodes configured, no `tunekit node` started: the trial fails after launch.join_timeout_s (3 s here), not
    the trial's timeout (120 s), and says how many nodes joined."""
    raw = sleepy_config(
        **{
            **SLEEPY,
            "launch.nproc_per_node": 1,
            "launch.nnodes": 2,
            "launch.join_timeout_s": 3,
            "launch.rdzv_endpoint": f"127.0.0.1:{_free_port()}",
        }
    )
    t0 = time.monotonic()
    m = run_trial(_rank_spec(raw, num_workers=0, batch_size=8, ranks=2), tmp_path / "t", 120)
    assert m.status == "crashed" and "1 of 2 nodes had joined" in m.reason and "tunekit node" in m.reason, m.reason
    assert time.monotonic() - t0 < 60
