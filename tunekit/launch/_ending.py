"""How a trial ended, as the launcher reads it from what the trial left: measurement.json (accepted only if it is a
valid measurement), the ranks' failure files and progress marks, worker.log's tail, the exit code or signal, a full
disk (docs/measurement.md, "Statuses"). The worker classifies what it can report itself; this is the rest."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from tunekit._files import read_json
from tunekit.contract import STATUSES, Measurement, TrialSpec, failed_measurement, measurement_problem
from tunekit.contract import process as names
from tunekit.launch._outcome import classify_error, silent_ranks

__all__ = ["classify", "script_exit", "rank_failure", "hung_ranks", "accept", "tail", "signal_name"]


def script_exit(result: Measurement, rc: int, trial_dir: Path, wrote: bool) -> Measurement:
    """A script trial that ended by itself without a measurement: where the script was (``names.SCRIPT_MARKS``), how
    it ended (its exit code or signal) and its last line join the reason; an argparse rejection is the script's own
    message first. ``wrote``: the script's process wrote the failure itself (its exception, or its exit)."""
    lines = [line for line in tail(trial_dir / names.LOG_FILE, 4000).splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if rc == 2 and _ARGPARSE.search(last):
        return dataclasses.replace(result, status="crashed", reason=f"the script rejected its arguments: {last}")
    marks = names.read_marks(trial_dir / names.SCRIPT_MARKS)
    if wrote and marks is None:  # the bootstrap's own word: complete
        return result
    where = script_phase(marks)
    if rc < 0:  # the launcher's own words say which signal, and who usually sends it
        return dataclasses.replace(result, reason=f"{result.reason}, {where}")
    said = f": {last}" if last else " without a word"
    if wrote:
        return dataclasses.replace(result, reason=f"{result.reason} (the script exited with code {rc} {where}{said})")
    if result.status in ("oom", "illegal_access"):
        return dataclasses.replace(result, reason=f"{result.reason} (the script exited with code {rc} {where})")
    return dataclasses.replace(result, status="crashed", reason=f"the script exited with code {rc} {where}{said}")


_ARGPARSE = re.compile(r"^\S+: error: ")
"""argparse's last line when it rejects a command line (``train.py: error: unrecognized arguments: …``)."""


def script_phase(marks: tuple[int, int, int] | None) -> str:
    """Where a script trial's process was when it ended, from its marks (``names.read_marks``): "after batch 12 of
    its training loader"."""
    if marks is None:
        return "before tunekit's meter loaded in it"
    built, iterated, batches = marks
    if not built:
        return "before it built a DataLoader"
    if not iterated:
        return f"after building {built} DataLoader(s), before iterating its training loader"
    if not batches:
        return "before its training loader's first batch"
    return f"after batch {batches} of its training loader"


def tail(path: Path, limit: int = 20_000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def classify(
    spec: TrialSpec, rc: int | None, timed_out: bool, timeout_s: float, out_path: Path, log_path: Path
) -> Measurement:
    failed_rank = rank_failure(out_path, tail(log_path)) if not out_path.exists() else None
    if timed_out:
        if failed_rank is not None:  # a rank failed, and its peers then hung in a collective: the failure is the cause
            return dataclasses.replace(
                failed_rank,
                reason=f"{failed_rank.reason} (the other ranks then hung until "
                f"trial.timeout_s = {timeout_s:g} s; the process tree "
                "was killed)",
            )
        return failed_measurement(
            spec,
            "timeout",
            f"no result within trial.timeout_s = {timeout_s:g} s{hung_ranks(out_path.parent)}; "
            "its process tree was killed",
        )
    if out_path.exists():
        try:
            data = read_json(out_path)
        except (OSError, ValueError) as exc:
            return failed_measurement(spec, "bad_output", f"measurement.json is not valid JSON: {exc}")
        accepted = accept(data)
        if isinstance(accepted, str):
            return failed_measurement(spec, "bad_output", accepted)
        if accepted.status != "ok" and not accepted.stage:  # the bootstrap's word, from an interpreter that could
            # not load the record types: what the trial was is the spec's
            return failed_measurement(
                spec, accepted.status, accepted.reason or "no reason given", exception=accepted.exception
            )
        return accepted
    if failed_rank is not None:
        return failed_rank
    log = tail(log_path)
    if rc is not None and rc < 0:
        name = signal_name(-rc)
        status, reason = classify_error(log) if log.strip() else ("crashed", "")
        if status == "crashed":
            hint = " (not sent by tunekit; the kernel's OOM killer is the usual sender)" if name == "SIGKILL" else ""
            reason = f"the trial process was killed by {name}{hint}"
        return failed_measurement(spec, status, reason)
    if rc == 0:
        return failed_measurement(spec, "bad_output", "the worker exited 0 but wrote no measurement.json")
    full = disk_full(out_path.parent)
    if full and not log.strip():
        return failed_measurement(spec, "crashed", full)
    status, reason = classify_error(log)
    return failed_measurement(spec, status, f"exit code {rc}: {reason}")


def rank_failure(out_path: Path, log: str) -> Measurement | None:
    """The failure of a multi-rank trial: a rank that died without a word (torchrun's summary in the log names it
    and its exit code; one that SIGTERM ended is torchrun stopping the survivors, the cause only when no rank
    reported), else the first failure in time the ranks reported (its peers fail after it, in their collectives,
    for want of it)."""
    found: dict[int, Measurement] = {}
    for path in out_path.parent.glob(names.RANK_FAILURES):
        try:
            data = read_json(path)
        except (OSError, ValueError):
            continue
        accepted = accept(data)
        if isinstance(accepted, Measurement) and accepted.status != "ok":
            found[names.rank_of(path.name)] = accepted
    first = min(found.values(), key=lambda m: float(m.failed_at or 0.0)) if found else None
    silent = silent_ranks(log, set(found)) if first is not None or "ChildFailedError" in log else []
    if not silent:
        return first
    rank, local, code = silent[0]
    how = (
        f"was killed by {signal_name(-code)}"
        + (" (not sent by tunekit; the kernel's OOM killer is the usual sender)" if -code == signal.SIGKILL else "")
        if code < 0
        else f"exited with code {code}"
    )
    then = f"; then {first.reason}" if first is not None else ""
    return failed_measurement(
        TrialSpec.from_dict(read_json(out_path.parent / names.SPEC_FILE)),
        "crashed",
        f"rank {rank} (local rank {local}) {how} without reporting an error{then}",
    )


def signal_name(number: int) -> str:
    return signal.Signals(number).name if number in signal.valid_signals() else str(number)


def hung_ranks(trial_dir: Path) -> str:
    """Which ranks of a timed-out multi-rank trial hung (", rank 1 hung: …"), from the batch each last asked for
    or held (``progress.rank<r>``, written by the worker at every fetch); empty when it cannot tell."""
    where: dict[int, tuple[int, bool, float]] = {}
    for path in trial_dir.glob(names.PROGRESS_MARKS):
        try:
            batch, state, at = path.read_text().split()
            where[names.rank_of(path.name)] = (int(batch), state == "got", float(at))
        except (OSError, ValueError):
            continue
    if len(where) < 2:
        return ""
    behind = min(where.values(), key=lambda w: (w[0], w[1]))
    stuck = sorted(r for r, w in where.items() if w[:2] == behind[:2])
    if len(stuck) == len(where):
        return (
            f": every rank held its batch {behind[0]}, so they hung in the step (the model, or a collective)"
            if behind[1]
            else f": every rank waited for its batch {behind[0]} from its DataLoader"
        )
    who = ", ".join(f"rank {r}" for r in stuck)
    doing = "in its step on" if behind[1] else "waiting for its DataLoader's"
    return (
        f": {who} hung {doing} batch {behind[0]} for {time.time() - behind[2]:.0f} s while the others "
        "waited for it in a collective"
    )


def disk_full(folder: Path) -> str | None:
    """Why a trial could leave nothing behind: the disk holding its folder is (almost) full."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    return f"the disk holding {folder} is full ({free} bytes free): free space and resume" if free < 2**20 else None


def accept(data: Any) -> Measurement | str:
    """The worker's measurement.json (any version) as a record, or what is wrong with it."""
    if not isinstance(data, dict) or data.get("status") not in STATUSES:
        return "measurement.json has no valid status"
    try:
        m = Measurement.from_dict(data)
    except (TypeError, ValueError) as exc:
        return f"measurement.json is not a measurement: {exc}"
    problem = measurement_problem(m)
    return f"measurement.json: {problem}" if problem else m
