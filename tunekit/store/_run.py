"""The studies of one run, as a sweep records its trials and every stage reads them back (``RunStore``)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState

from tunekit.config import COMPILE_MODES, Config, extra_knobs
from tunekit.contract import Knobs, Measurement, Mode, Stage, measurement_problem
from tunekit.records import TrialRow
from tunekit.store._url import storage_errors

__all__ = [
    "RunStore",
    "fingerprint",
    "knob_params",
    "suggest_knobs",
    "STUDY_FILE",
    "MAIN_STUDY",
    "CEILINGS_STUDY",
    "INTERRUPTED",
]

STUDY_FILE = "study.db"
MAIN_STUDY = "tunekit"
CEILINGS_STUDY = "tunekit-ceilings"
INTERRUPTED = "interrupted"
_SET_ASIDE = "set_aside"
"""The studies' user attribute that lists the trials a resumed sweep measured again (``Runs.set_aside``)."""
_WORDS = {Stage: {m.value for m in Stage}, Mode: {m.value for m in Mode}}
_FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
_T = TypeVar("_T")


def _guarded(method: Callable[..., _T]) -> Callable[..., _T]:
    @functools.wraps(method)
    def call(self: RunStore, *args: Any, **kwargs: Any) -> _T:
        with storage_errors(self.where):
            return method(self, *args, **kwargs)

    return call


def fingerprint(cfg: Config) -> str:
    """What makes two sweeps comparable: the config without its name, budget and storage."""
    data = cfg.to_dict()
    for key in ("budget", "name", "storage", "fleet"):  # none changes what a trial measures
        data.pop(key, None)
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
        "ranks": tuple(sorted({1, cfg.launch.world})),
        "threads": (None, *(s.threads or [])),
        "worker_threads": (None, *(s.worker_threads or [])),
        **{_EXTRA_PARAM + k.key: k.values for k in extra_knobs(cfg)},
    }


_ANY_BATCH = 2**24
"""The batch range of a script that keeps its own batch size (``script.own_batch``)."""

_EXTRA_PARAM = "extra:"
"""Prefix of a user-defined knob's optuna parameter (its config key follows)."""


def suggest_knobs(cfg: Config, study: optuna.Study, trial: optuna.Trial, params: dict[str, Any]) -> None:
    """Suggest every knob of an asked trial, which optuna answers from the params it was enqueued with, so that
    its own tools see them; a value other than the enqueued one fails the trial (the study must record exactly
    what runs)."""
    for name, choices in _choices(cfg).items():
        if name == "batch_size" and cfg.own_batch:
            got = trial.suggest_int(name, 1, _ANY_BATCH)  # the script's own, known once its baseline ran
        else:
            got = trial.suggest_categorical(name, choices)
        if got != params[name]:
            study.tell(trial, state=TrialState.FAIL)
            raise RuntimeError(f"optuna returned {name}={got!r} for an enqueued {params[name]!r}")


def knob_params(cfg: Config, knobs: Knobs) -> dict[str, Any]:
    """The trial's optuna parameters: the built-in knobs, and each user-defined knob at its value."""
    data = knobs.to_dict()
    set_extra = data.pop("extra")
    return {**data, **{_EXTRA_PARAM + k.key: set_extra.get(k.key, k.baseline) for k in extra_knobs(cfg)}}


class RunStore:
    """The studies of one run: ``main`` (the end-to-end trials) and ``ceilings`` (None in runs recorded in one
    study), in the run folder's study.db."""

    shared = False
    """Whether other nodes may ask for trials of this run at the same time (:class:`SharedRun`)."""

    def __init__(self, run_dir: Path, main: optuna.Study, ceilings: optuna.Study | None):
        self.run_dir = run_dir
        self.main = main
        self.ceilings = ceilings

    @property
    def where(self) -> str:
        """The studies' place, as an error line names it."""
        return str(self.run_dir / STUDY_FILE)

    def _studies(self) -> list[optuna.Study]:
        return [s for s in (self.main, self.ceilings) if s is not None]

    def _study_for(self, mode: Mode) -> optuna.Study:
        if Mode(mode).ceiling and self.ceilings is not None:
            return self.ceilings
        return self.main

    def next_number(self) -> int:
        """Run-wide trial numbers: every trial asked for in either study takes the next one."""
        return sum(len(s.get_trials(deepcopy=False)) for s in self._studies())

    @_guarded
    def start(
        self, cfg: Config, stage: Stage, mode: Mode, knobs: dict[str, Any], run: int = 0
    ) -> tuple[optuna.Trial, int]:
        """Ask for a trial with exactly these knobs, tagged with its number, stage, mode and run (a repeat's); it is
        RUNNING."""
        study = self._study_for(mode)
        number = self.next_number()
        knobs = knob_params(cfg, Knobs.of(**knobs))  # every knob, the defaults of those not given included
        tags = {
            "number": number,
            "stage": Stage(stage).value,
            "mode": Mode(mode).value,  # the words, checked
            "run": run,
        }
        study.enqueue_trial(knobs, user_attrs=tags, skip_if_exists=False)
        trial = study.ask()
        suggest_knobs(cfg, study, trial, knobs)
        return trial, number

    @_guarded
    def finish(self, trial: optuna.Trial, mode: Mode, measurement: Measurement) -> bool:
        """Record a trial's measurement (``to_dict()``, version 2): COMPLETE with its rate (``unit``/s) when ok,
        PRUNED when skipped (with the reason), FAIL (with status and reason) otherwise. True once recorded."""
        study = self._study_for(mode)
        trial.set_user_attr("measurement", measurement.to_dict())
        trial.set_user_attr("status", measurement.status)
        if measurement.status == "ok":
            study.tell(trial, float(measurement.rate or 0.0))
            return True
        trial.set_user_attr("reason", measurement.reason or "")
        study.tell(trial, state=TrialState.PRUNED if measurement.status == "skipped" else TrialState.FAIL)
        return True

    @_guarded
    def interrupt(self, trial: optuna.Trial, mode: Mode) -> None:
        """The sweep stopped while this trial ran: it does not count as finished and will be asked for again."""
        trial.set_user_attr("status", INTERRUPTED)
        self._study_for(mode).tell(trial, state=TrialState.FAIL)

    @_guarded
    def set_aside(self, numbers: list[int]) -> None:
        """Finished trials a resumed sweep measures again (their figures were disturbed): no longer finished, so the
        plan asks for them anew; their folders stay. A finished optuna trial cannot change, so the studies record
        the numbers."""
        for study in self._studies():
            held = set(study.user_attrs.get(_SET_ASIDE, []))
            study.set_user_attr(_SET_ASIDE, sorted(held | set(numbers)))

    @_guarded
    def restore(self, numbers: list[int]) -> None:
        """Set-aside trials kept again as they were measured (the sweep stopped before it measured them anew)."""
        for study in self._studies():
            held = set(study.user_attrs.get(_SET_ASIDE, []))
            study.set_user_attr(_SET_ASIDE, sorted(held - set(numbers)))

    @_guarded
    def rows(self) -> list[TrialRow]:
        """Every finished trial (ok, failed or skipped; not interrupted, not set aside) as rows, in run-wide trial
        order."""
        rows = []
        aside = {n for study in self._studies() for n in study.user_attrs.get(_SET_ASIDE, [])}
        for study in self._studies():
            for t in study.get_trials(deepcopy=False, states=_FINISHED):
                m = t.user_attrs.get("measurement")
                if m is None or t.user_attrs.get("status") == INTERRUPTED:
                    continue
                number = t.user_attrs.get("number", t.number)
                if number in aside:
                    continue
                record = Measurement.from_dict({**m, "number": number})
                if record.stage not in _WORDS[Stage] or record.mode not in _WORDS[Mode]:  # a record that says only
                    # how the trial ended (a bootstrap that could not load): the trial's own tags say what it was
                    record = dataclasses.replace(
                        record,
                        stage=t.user_attrs.get("stage", ""),
                        mode=t.user_attrs.get("mode", ""),
                        params=record.params or t.params,
                        run=int(t.user_attrs.get("run", 0)),
                    )
                problem = measurement_problem(record, complete=False)
                if problem:  # a study edited or corrupted: this trial is data that says so, never a figure
                    record = Measurement(
                        status="bad_output",
                        number=number,
                        stage=record.stage,
                        mode=record.mode,
                        run=record.run,
                        params=record.params,
                        reason=f"study.db's record of trial {number} is not a measurement: {problem}",
                    )
                rows.append(TrialRow.from_measurement(record))
        return sorted(rows, key=lambda r: r.number)

    @_guarded
    def recover_running(self) -> list[int]:
        """Close trials left RUNNING by a sweep that died as interrupted, killing their leftover process groups."""
        numbers = []
        for study in self._studies():
            for _ in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                # enqueued but never asked for: ask() would hand its knobs to the next trial, so close it now
                study.tell(study.ask(), state=TrialState.FAIL)
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                number = t.user_attrs.get("number", t.number)
                study.tell(t.number, state=TrialState.FAIL)  # no measurement: not finished, so planned again
                numbers.append(number)
        return numbers

    @_guarded
    def record_knee(self, knee: dict[str, Any] | None) -> None:
        """Store the sweep's knee on the main study (None: no recommendation)."""
        self.main.set_user_attr("knee", knee)

    @property
    def config(self) -> dict[str, Any]:
        return self.main.user_attrs["config"]

    @property
    def strategy(self) -> str | None:
        return self.main.user_attrs.get("strategy")

    @property
    def machine(self) -> dict[str, Any] | None:
        """The machine the sweep ran on (``env.machine_fingerprint``), as its first invocation recorded it."""
        return self.main.user_attrs.get("machine")
