"""The run's record: one optuna study in results/<run>/study.db holding every trial of the run.

Each trial is asked for with its knobs as categorical params (enqueued, so the values are exactly the plan's)
and told with samples/s (COMPLETE) or FAIL; the whole measurement, the stage and the mode are user attributes.
A trial still RUNNING when a sweep resumes belongs to a sweep that died: it is marked interrupted (and its
leftover process group killed) and will be asked for again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tunekit import __version__
from tunekit.analysis import TrialRow
from tunekit.config import COMPILE_MODES, Config
from tunekit.errors import UsageError

__all__ = ["open_study", "load_study", "start_trial", "finish_trial", "interrupt_trial", "finished_rows",
           "recover_running", "fingerprint", "STUDY_FILE"]

STUDY_FILE = "study.db"
_INTERRUPTED = "interrupted"


def fingerprint(cfg: Config) -> str:
    """What makes two sweeps comparable: the config without its name and budget."""
    data = cfg.to_dict()
    data.pop("budget", None)
    data.pop("name", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _choices(cfg: Config) -> dict[str, tuple[Any, ...]]:
    s = cfg.search
    accum = set(s.grad_accum) | {1}
    if s.target_effective_batch:
        accum |= {s.target_effective_batch // b for b in s.batch_size if s.target_effective_batch % b == 0}
    return {
        "num_workers": tuple(sorted(set(s.num_workers) | {0})),
        "prefetch_factor": (None, *s.prefetch_factor),
        "pin_memory": (False, True),
        "batch_size": tuple(s.batch_size),
        "grad_accum": tuple(sorted(accum)),
        "compile": COMPILE_MODES,
    }


def open_study(run_dir: Path, cfg: Config, *, resume: bool) -> optuna.Study:
    """Open (or create) the run's study. Resuming a study made from a different config is a usage error."""
    optuna.logging.set_verbosity(logging.WARNING)
    path = run_dir / STUDY_FILE
    if path.exists() and not resume:
        path.unlink()
        # the old trials' folders would otherwise sit beside the new ones, under the same numbers
        shutil.rmtree(run_dir / "trials", ignore_errors=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    study = optuna.create_study(study_name="tunekit", storage=storage, direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0), load_if_exists=True)
    stamp = fingerprint(cfg)
    found = study.user_attrs.get("fingerprint")
    if found is None:
        study.set_user_attr("fingerprint", stamp)
        study.set_user_attr("tunekit", __version__)
        study.set_user_attr("config", cfg.to_dict())
    elif found != stamp:
        raise UsageError(
            f"{path}: this run was made from a different config (workload, search, trial or selection keys "
            "changed); use --no-resume to start it again, or another --out"
        )
    return study


def load_study(run_dir: Path) -> optuna.Study:
    """Open an existing run's study for reading."""
    optuna.logging.set_verbosity(logging.WARNING)
    return optuna.load_study(study_name="tunekit", storage=f"sqlite:///{run_dir / STUDY_FILE}")


def start_trial(study: optuna.Study, cfg: Config, stage: str, mode: str, knobs: dict[str, Any]) -> optuna.Trial:
    """Ask for a trial with exactly these knobs, tagged with its stage and mode; the trial is RUNNING."""
    study.enqueue_trial(knobs, user_attrs={"stage": stage, "mode": mode}, skip_if_exists=False)
    trial = study.ask()
    for name, choices in _choices(cfg).items():
        got = trial.suggest_categorical(name, choices)
        if got != knobs[name]:  # the study must record exactly what runs
            study.tell(trial, state=TrialState.FAIL)
            raise RuntimeError(f"optuna returned {name}={got!r} for an enqueued {knobs[name]!r}")
    return trial


def finish_trial(study: optuna.Study, trial: optuna.Trial, measurement: dict[str, Any]) -> None:
    """Record a trial's measurement: COMPLETE with samples/s when ok, FAIL (with status and reason) otherwise."""
    trial.set_user_attr("measurement", measurement)
    trial.set_user_attr("status", measurement["status"])
    if measurement["status"] == "ok":
        study.tell(trial, float(measurement["samples_per_s"]))
    else:
        study.tell(trial, state=TrialState.FAIL)


def interrupt_trial(study: optuna.Study, trial: optuna.Trial) -> None:
    """The sweep stopped while this trial ran: it does not count as finished and will be asked for again."""
    trial.set_user_attr("status", _INTERRUPTED)
    study.tell(trial, state=TrialState.FAIL)


def finished_rows(study: optuna.Study) -> list[TrialRow]:
    """Every finished trial (ok or failed, not interrupted) as analysis rows, in trial order."""
    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        m = t.user_attrs.get("measurement")
        if m is None or t.user_attrs.get("status") == _INTERRUPTED:
            continue
        rows.append(TrialRow.from_measurement({**m, "number": t.number}))
    return rows


def recover_running(study: optuna.Study, run_dir: Path) -> list[int]:
    """Mark trials left RUNNING by a sweep that died as interrupted, killing their leftover process groups."""
    numbers = []
    for _ in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        # enqueued but never asked for: ask() would hand its knobs to the next trial, so close it now
        study.tell(study.ask(), state=TrialState.FAIL)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        _kill_leftover(run_dir / "trials" / str(t.number))
        study.tell(t.number, state=TrialState.FAIL)  # no measurement: not finished, so it is planned again
        numbers.append(t.number)
    return numbers


def _kill_leftover(trial_dir: Path) -> None:
    try:
        pid = int((trial_dir / "worker.pid").read_text())
    except (OSError, ValueError):
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return
    if "tunekit.worker" in cmdline and str(trial_dir.resolve()) in cmdline:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

