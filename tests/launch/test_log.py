"""A trial's worker.log (tunekit/launch/_log.py): a chatty trial's log keeps its head and its tail, and a log that
cannot be written names the file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, sleepy_config
from tunekit import config, launch
from tunekit.contract import Knobs, TrialSpec


def test_a_log_that_cannot_be_written_names_the_file(tmp_path: Path):
    """A file-size limit (or a full disk) stops worker.log's writes: the trial is ended and the sweep says, in one
    line, which file could not be written (the error surfaced as a raw OSError from the reading thread's exit)."""
    code = f"""
import json, resource, sys
from tunekit import config, launch
from tunekit.contract import Knobs, TrialSpec
from tunekit.errors import TunekitError
from tests.conftest import sleepy_config
chatty = {{"sample_wait_s": 0.0, "print_every": 1}}
cfg = sleepy_config(**{{"workload.dataset_args": chatty, "trial.fork_server": False}})
spec = TrialSpec(number=0, stage="single", mode="train", knobs=Knobs(batch_size=8),
                 config=config.from_dict(cfg).to_dict())
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    launch.run_trial(spec, {str(tmp_path / "t")!r}, 60)
except TunekitError as exc:
    print("ERROR", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    line = [x for x in out.stdout.splitlines() if x.startswith("ERROR")]
    assert line and f"{tmp_path / 't' / 'worker.log'}: cannot write the trial's log" in line[0], (
        out.stdout,
        out.stderr[-2000:],
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
