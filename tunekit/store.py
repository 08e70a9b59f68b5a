"""The run's record: the optuna studies in results/<run>/study.db holding every trial of the run.

Two studies share the file, so that optuna's own tools (``study.best_trial``, optuna-dashboard) see the truth:

* ``tunekit`` holds the end-to-end trials, whose objective is the job's throughput: COMPLETE with its rate (``unit``/s),
  FAIL with a status and reason, PRUNED when the plan skipped it (the reason says why). The sweep stores its knee
  on this study (user attribute ``knee``); ``best_trial`` is the fastest end-to-end trial.
* ``tunekit-ceilings`` holds the compute-alone and loader-alone trials: bounds, not configs to choose.

Each trial is asked for with its knobs as categorical params (enqueued, so the values are exactly the plan's);
its run-wide number (the trials/<n>/ folder), stage, mode and whole measurement are user attributes. A trial still
RUNNING when a sweep resumes belongs to a sweep that died: its leftover process group is killed, it is closed as
interrupted, and the plan asks for it again. Runs recorded in one study (older runs) are read the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState

from tunekit import __version__
from tunekit.config import COMPILE_MODES, Config, extra_knobs
from tunekit.contract import Knobs, Measurement, Mode, Stage, measurement_problem
from tunekit.errors import StorageError, UsageError
from tunekit.records import TrialRow

__all__ = ["RunStore", "open_run", "load_run", "fingerprint", "STUDY_FILE", "MAIN_STUDY", "CEILINGS_STUDY"]

STUDY_FILE = "study.db"
MAIN_STUDY = "tunekit"
CEILINGS_STUDY = "tunekit-ceilings"
_INTERRUPTED = "interrupted"
_SET_ASIDE = "set_aside"
"""The studies' user attribute that lists the trials a resumed sweep measured again (``Runs.set_aside``)."""
_WORDS = {Stage: {m.value for m in Stage}, Mode: {m.value for m in Mode}}
_FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
_T = TypeVar("_T")


def _cause(exc: BaseException) -> str:
    """The database's own words for a storage failure (e.g. "database or disk is full"), found along the chain of
    exceptions optuna and SQLAlchemy wrap it in."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlite3.Error):
            return str(seen).splitlines()[0]
        seen = seen.__cause__ or seen.__context__
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


@contextlib.contextmanager
def storage_errors(path: Path) -> Iterator[None]:
    """Turn a failure of the study file into one line naming the file and the cause (StorageError)."""
    import sqlalchemy.exc

    try:
        yield
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error) as exc:
        raise StorageError(f"{path}: {_cause(exc)}") from exc


def _guarded(method: Callable[..., _T]) -> Callable[..., _T]:
    @functools.wraps(method)
    def call(self: RunStore, *args: Any, **kwargs: Any) -> _T:
        with storage_errors(self.run_dir / STUDY_FILE):
            return method(self, *args, **kwargs)

    return call


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
        "ranks": tuple(sorted({1, cfg.launch.world})),
        "threads": (None, *(s.threads or [])),
        "worker_threads": (None, *(s.worker_threads or [])),
        **{_EXTRA_PARAM + k.key: k.values for k in extra_knobs(cfg)},
    }


_ANY_BATCH = 2**24
"""The batch range of a script that keeps its own batch size (``script.own_batch``)."""

_EXTRA_PARAM = "extra:"
"""Prefix of a user-defined knob's optuna parameter (its config key follows)."""


def _params(cfg: Config, knobs: Knobs) -> dict[str, Any]:
    """The trial's optuna parameters: the built-in knobs, and each user-defined knob at its value."""
    data = knobs.to_dict()
    set_extra = data.pop("extra")
    return {**data, **{_EXTRA_PARAM + k.key: set_extra.get(k.key, k.baseline) for k in extra_knobs(cfg)}}


class RunStore:
    """The studies of one run folder."""

    def __init__(self, run_dir: Path, main: optuna.Study, ceilings: optuna.Study | None):
        self.run_dir = run_dir
        self.main = main
        self.ceilings = ceilings

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
        knobs = _params(cfg, Knobs(**knobs))  # every knob, the defaults of those not given included
        tags = {
            "number": number,
            "stage": Stage(stage).value,
            "mode": Mode(mode).value,  # the words, checked
            "run": run,
        }
        study.enqueue_trial(knobs, user_attrs=tags, skip_if_exists=False)
        trial = study.ask()
        for name, choices in _choices(cfg).items():
            if name == "batch_size" and cfg.script is not None and cfg.script.own_batch:
                got = trial.suggest_int(name, 1, _ANY_BATCH)  # the script's own, known once its baseline ran
            else:
                got = trial.suggest_categorical(name, choices)
            if got != knobs[name]:  # the study must record exactly what runs
                study.tell(trial, state=TrialState.FAIL)
                raise RuntimeError(f"optuna returned {name}={got!r} for an enqueued {knobs[name]!r}")
        return trial, number

    @_guarded
    def finish(self, trial: optuna.Trial, mode: Mode, measurement: Measurement) -> None:
        """Record a trial's measurement (``to_dict()``, version 2): COMPLETE with its rate (``unit``/s) when ok,
        PRUNED when skipped (with the reason), FAIL (with status and reason) otherwise."""
        study = self._study_for(mode)
        trial.set_user_attr("measurement", measurement.to_dict())
        trial.set_user_attr("status", measurement.status)
        if measurement.status == "ok":
            study.tell(trial, float(measurement.rate or 0.0))
            return
        trial.set_user_attr("reason", measurement.reason or "")
        study.tell(trial, state=TrialState.PRUNED if measurement.status == "skipped" else TrialState.FAIL)

    @_guarded
    def interrupt(self, trial: optuna.Trial, mode: Mode) -> None:
        """The sweep stopped while this trial ran: it does not count as finished and will be asked for again."""
        trial.set_user_attr("status", _INTERRUPTED)
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
                if m is None or t.user_attrs.get("status") == _INTERRUPTED:
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


def _storage(path: Path) -> optuna.storages.RDBStorage:
    optuna.logging.set_verbosity(logging.WARNING)
    return optuna.storages.RDBStorage(f"sqlite:///{path}")


def open_run(run_dir: Path, cfg: Config, *, resume: bool, strategy: str) -> RunStore:
    """Open (or create) a run's studies for a sweep. Resuming a run made from a different config or with another
    strategy is a usage error."""
    path = run_dir / STUDY_FILE
    if not resume:
        path.unlink(missing_ok=True)
        # the old trials' folders would otherwise sit beside the new ones, under the same numbers
        shutil.rmtree(run_dir / "trials", ignore_errors=True)
    elif _trial_folders(run_dir) and (not path.exists() or path.stat().st_size == 0):
        raise UsageError(
            f"{run_dir}: holds trials/ but {STUDY_FILE} is {'empty' if path.exists() else 'missing'}, "
            "so they cannot be resumed; use --no-resume to start again (deleting them), or another --out"
        )
    with storage_errors(path):
        if path.exists() and path.stat().st_size:
            _check_database(path)
        runs = _open(run_dir, path, cfg, strategy)
    unknown = sorted(n for n in _trial_folders(run_dir) if n >= runs.next_number())
    if unknown:
        raise UsageError(
            f"{run_dir}: trials/{unknown[0]} is not in {STUDY_FILE} (another command wrote it); use "
            "--no-resume to start again (deleting it), or another --out"
        )
    return runs


def _trial_folders(run_dir: Path) -> set[int]:
    trials = run_dir / "trials"
    return {int(p.name) for p in trials.iterdir() if p.name.isdigit()} if trials.is_dir() else set()


def _check_database(path: Path) -> None:
    """Read the file as SQLite without writing it (a corrupt or foreign file raises sqlite3.DatabaseError)."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        db.execute("select count(*) from sqlite_master").fetchone()


def _open(run_dir: Path, path: Path, cfg: Config, strategy: str) -> RunStore:
    storage = _storage(path)
    existing = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    main = optuna.create_study(
        study_name=MAIN_STUDY,
        storage=storage,
        direction="maximize",
        sampler=optuna.samplers.RandomSampler(seed=0),
        load_if_exists=True,
    )
    fresh = MAIN_STUDY not in existing
    if fresh or CEILINGS_STUDY in existing:
        ceilings = optuna.create_study(
            study_name=CEILINGS_STUDY,
            storage=storage,
            direction="maximize",
            sampler=optuna.samplers.RandomSampler(seed=0),
            load_if_exists=True,
        )
    else:  # a run recorded in one study keeps its trials there
        ceilings = None
    _check_or_stamp(main, cfg, strategy, path)
    return RunStore(run_dir, main, ceilings)


def _check_or_stamp(study: optuna.Study, cfg: Config, strategy: str, path: Path) -> None:
    found = study.user_attrs.get("fingerprint")
    if found is None:
        study.set_user_attr("fingerprint", fingerprint(cfg))
        study.set_user_attr("tunekit", __version__)
        study.set_user_attr("config", cfg.to_dict())
        study.set_user_attr("strategy", strategy)
        return
    if found != fingerprint(cfg):
        raise UsageError(
            f"{path}: this run was made from a different config (workload, search, trial or selection keys "
            "changed); use --no-resume to start it again, or another --out"
        )
    stamped = study.user_attrs.get("strategy")
    if stamped is not None and stamped != strategy:
        raise UsageError(
            f"{path}: this run was made with --strategy {stamped}, not {strategy}; staged and grid "
            "trials do not mix in one run: use --no-resume to start it again, or another --out"
        )


def load_run(run_dir: Path) -> RunStore:
    """Open an existing run's studies for reading; a file that holds no tunekit study is refused unwritten.

    Raises:
        UsageError: no study.db, an empty one, or one without a tunekit study.
        StorageError: the file cannot be read (corrupt, not SQLite).
    """
    path = run_dir / STUDY_FILE
    if not path.exists():
        raise UsageError(f"{run_dir}: no {STUDY_FILE} here; give the folder of a tunekit sweep")
    if path.stat().st_size == 0:
        raise UsageError(f"{path}: empty (0 bytes), not a tunekit run; give the folder of a tunekit sweep")
    with storage_errors(path):
        _check_database(path)
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
            names = {row[0] for row in db.execute("select study_name from studies")} if "studies" in tables else set()
        if MAIN_STUDY not in names:
            raise UsageError(f"{path}: holds no tunekit study; give the folder of a tunekit sweep")
        storage = _storage(path)
        main = optuna.load_study(study_name=MAIN_STUDY, storage=storage)
        ceilings = optuna.load_study(study_name=CEILINGS_STUDY, storage=storage) if CEILINGS_STUDY in names else None
    return RunStore(run_dir, main, ceilings)
