"""Opening a run's studies: for a sweep (created, resumed, or joined by another node) or for reading (a rebuild, a
comparison), in the run folder's study.db or in a shared database; and the runs a database holds."""

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from tunekit import __version__
from tunekit.config import Config
from tunekit.errors import UsageError
from tunekit.store._run import CEILINGS_STUDY, MAIN_STUDY, STUDY_FILE, RunStore, fingerprint
from tunekit.store._shared import BASE, SharedRun
from tunekit.store._url import StorageUrl, parse_url, rdb_storage, storage_errors

__all__ = ["open_run", "load_run", "load_stored", "runs_in", "StoredRun", "study_names"]

_SEP = "/"
"""Between a shared study's kind and its run's name: ``tunekit/<name>``, ``tunekit-ceilings/<name>``."""
_READ_HEARTBEAT = (60, 120)
"""The heartbeat settings of a storage opened to read (no trial runs; optuna wants them the same way)."""


def study_names(name: str) -> tuple[str, str]:
    """The studies of the run ``name`` in a shared database (the run's name tells the runs apart)."""
    return f"{MAIN_STUDY}{_SEP}{name}", f"{CEILINGS_STUDY}{_SEP}{name}"


def open_run(
    run_dir: Path,
    cfg: Config,
    *,
    resume: bool,
    strategy: str,
    storage: str | None = None,
    join: bool = False,
    machine: dict[str, Any] | None = None,
) -> RunStore:
    """Open (or create) a run's studies for a sweep: in ``run_dir``'s study.db, or, with ``storage`` (the URL, its
    password included), the run named ``cfg.name`` in that database (``join``: an existing run another node
    sweeps). ``machine`` (``env.machine_fingerprint``) is recorded with a new run. Resuming a run made from a
    different config or with another strategy is a usage error.

    Raises:
        UsageError: a bad URL, a run to join that is not there, a config or strategy that differs.
        StorageError: the file or the server cannot be read (one line naming it and the cause).
    """
    if storage is not None:
        return _open_shared(run_dir, cfg, storage, resume=resume, strategy=strategy, join=join, machine=machine)
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
        runs = _open(run_dir, path, cfg, strategy, machine)
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


def _storage(path: Path) -> optuna.storages.RDBStorage:
    optuna.logging.set_verbosity(logging.WARNING)
    return optuna.storages.RDBStorage(f"sqlite:///{path}")


def _create(name: str, storage: Any) -> optuna.Study:
    return optuna.create_study(
        study_name=name,
        storage=storage,
        direction="maximize",
        sampler=optuna.samplers.RandomSampler(seed=0),
        load_if_exists=True,
    )


def _open(run_dir: Path, path: Path, cfg: Config, strategy: str, machine: dict[str, Any] | None) -> RunStore:
    storage = _storage(path)
    existing = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    main = _create(MAIN_STUDY, storage)
    fresh = MAIN_STUDY not in existing
    # a run recorded in one study keeps its trials there
    ceilings = _create(CEILINGS_STUDY, storage) if fresh or CEILINGS_STUDY in existing else None
    _check_or_stamp(main, cfg, strategy, path, machine)
    return RunStore(run_dir, main, ceilings)


def _open_shared(
    run_dir: Path,
    cfg: Config,
    text: str,
    *,
    resume: bool,
    strategy: str,
    join: bool,
    machine: dict[str, Any] | None,
) -> SharedRun:
    url = parse_url(text)
    storage = rdb_storage(url, cfg.fleet.heartbeat_s, cfg.fleet.grace_s)
    names = study_names(cfg.name)
    with storage_errors(url.shown, url.password):
        optuna.logging.set_verbosity(logging.WARNING)
        existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
        found = existing.get(names[0])
        if join and (found is None or "config" not in found.user_attrs):
            raise UsageError(
                f"{url.shown}: holds no run named {cfg.name!r} to join; start its sweep first (tunekit sweep CONFIG "
                "--storage URL), then join it from each further machine with the same config"
            )
        if not resume and not join:
            shutil.rmtree(run_dir / "trials", ignore_errors=True)
            for name in names:  # this run's studies only: the database's other runs stay
                if name in existing:
                    optuna.delete_study(study_name=name, storage=storage)
            found = None
        base = _next_trial_id(storage) if found is None else None
        main, ceilings = _create(names[0], storage), _create(names[1], storage)
        if base is not None:
            main.set_user_attr(BASE, base)
        _check_or_stamp(main, cfg, strategy, url.shown, machine, join)
    return SharedRun(run_dir, main, ceilings, url, storage, cfg.fleet.heartbeat_s)


def _next_trial_id(storage: Any) -> int:
    """The first trial id a new run's trials can have: above every trial the database holds now."""
    ids = [t._trial_id for s in storage.get_all_studies() for t in storage.get_all_trials(s._study_id, deepcopy=False)]
    return max(ids, default=0) + 1


def _check_or_stamp(
    study: optuna.Study, cfg: Config, strategy: str, where: object, machine: dict[str, Any] | None, join: bool = False
) -> None:
    found = study.user_attrs.get("fingerprint")
    if found is None:
        study.set_user_attr("fingerprint", fingerprint(cfg))
        study.set_user_attr("tunekit", __version__)
        study.set_user_attr("config", cfg.to_dict())
        study.set_user_attr("strategy", strategy)
        study.set_user_attr("run", cfg.name)
        study.set_user_attr("machine", machine)
        return
    again = (
        "a node joins only a sweep of the same config and strategy"
        if join
        else "use --no-resume to start it again, or another --out"
    )
    if found != fingerprint(cfg):
        raise UsageError(
            f"{where}: this run was made from a different config (workload, search, trial or selection keys "
            f"changed); {again}"
        )
    stamped = study.user_attrs.get("strategy")
    if stamped is not None and stamped != strategy:
        raise UsageError(
            f"{where}: this run was made with --strategy {stamped}, not {strategy}; staged and grid "
            f"trials do not mix in one run: {again}"
        )
    if study.user_attrs.get("machine") is None and machine is not None:  # a run recorded before machines were
        study.set_user_attr("machine", machine)


def load_run(run_dir: Path, storage: str | None = None) -> RunStore:
    """Open an existing run's studies for reading; a file that holds no tunekit study is refused unwritten. A run
    whose studies live in a database (its config.resolved.yaml names the URL, without the password) is read
    there: ``storage`` gives the URL with its password, else libpq's ``PGPASSWORD`` or ``~/.pgpass`` does.

    Raises:
        UsageError: no study.db, an empty one, or one without a tunekit study.
        StorageError: the file cannot be read (corrupt, not SQLite), or the server cannot be reached.
    """
    path = run_dir / STUDY_FILE
    recorded = _recorded(run_dir)
    if storage is not None or (not path.exists() and recorded is not None):
        name = (recorded or {}).get("name") or run_dir.name
        return load_stored(storage or str(recorded["storage"]), str(name), run_dir)  # type: ignore[index]
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
        storage_ = _storage(path)
        main = optuna.load_study(study_name=MAIN_STUDY, storage=storage_)
        ceilings = optuna.load_study(study_name=CEILINGS_STUDY, storage=storage_) if CEILINGS_STUDY in names else None
    return RunStore(run_dir, main, ceilings)


def _recorded(run_dir: Path) -> dict[str, Any] | None:
    """The name and storage URL a run folder's config.resolved.yaml records, when its studies live in a
    database; None for a run of its own study.db."""
    import yaml

    path = run_dir / "config.resolved.yaml"
    try:
        data = yaml.safe_load(path.read_text()) if path.exists() else None
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) and data.get("storage") else None


def _existing(url_text: str) -> StorageUrl:
    """A storage URL to read from: a SQLite file must exist (opening one that does not would create it empty).

    Raises:
        UsageError: a bad URL, or a SQLite file that is not there.
    """
    url = parse_url(url_text)
    if url.sqlite and not Path(url.url.database).is_file():
        raise UsageError(f"{url.shown}: no such file; give the URL the sweeps wrote to (--storage)")
    return url


def load_stored(url_text: str, name: str, run_dir: Path | None = None) -> RunStore:
    """The run ``name`` of a shared database, for reading (``tunekit report``, ``tunekit compare``).

    Raises:
        UsageError: a bad URL, a SQLite file that is not there, or no run of that name there.
        StorageError: the server cannot be reached, or refuses.
    """
    url = _existing(url_text)
    storage = rdb_storage(url, *_READ_HEARTBEAT, pooled=False)
    names = study_names(name)
    with storage_errors(url.shown, url.password):
        optuna.logging.set_verbosity(logging.WARNING)
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
        held = {s.study_name: s for s in summaries}
        if names[0] not in held and MAIN_STUDY in held and held[MAIN_STUDY].user_attrs.get("run") == name:
            names = (MAIN_STUDY, CEILINGS_STUDY)  # a run folder's own study.db, named by a sqlite:/// URL
        if names[0] not in held:
            raise UsageError(f"{url.shown}: holds no run named {name!r} (its runs: {_names(held) or 'none'})")
        main = optuna.load_study(study_name=names[0], storage=storage)
        ceilings = optuna.load_study(study_name=names[1], storage=storage) if names[1] in held else None
    return SharedRun(run_dir or Path(name), main, ceilings, url, storage, _READ_HEARTBEAT[0])


@dataclass(frozen=True)
class StoredRun:
    """One run a database holds, as :func:`runs_in` lists it."""

    name: str
    """The run's name (its config's ``name``): :func:`load_stored` opens it."""
    studies: tuple[str, ...]
    """Its optuna studies: the end-to-end trials' first, then the ceilings'."""
    machine: dict[str, Any] | None
    """The machine its sweep ran on (``env.machine_fingerprint``); None for runs recorded before machines were."""


def runs_in(url_text: str) -> list[StoredRun]:
    """The tunekit runs a storage URL holds, by name: each run's studies and machine fingerprint (a database's other
    optuna studies left out).

    Raises:
        UsageError: a bad URL, or a SQLite file that is not there.
        StorageError: the server cannot be reached, or refuses.
    """
    url = _existing(url_text)
    storage = rdb_storage(url, *_READ_HEARTBEAT, pooled=False)
    with storage_errors(url.shown, url.password):
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    held = {s.study_name for s in summaries}
    found = []
    for s in summaries:
        kind, sep, name = s.study_name.partition(_SEP)
        if kind != MAIN_STUDY:
            continue
        name = name or str(s.user_attrs.get("run") or s.user_attrs.get("config", {}).get("name", MAIN_STUDY))
        ceilings = study_names(name)[1] if sep else CEILINGS_STUDY
        studies = (s.study_name, ceilings) if ceilings in held else (s.study_name,)
        found.append(StoredRun(name, studies, s.user_attrs.get("machine")))
    return sorted(found, key=lambda r: r.name)


def _names(held: dict[str, Any]) -> str:
    return ", ".join(sorted(n.partition(_SEP)[2] for n in held if n.startswith(MAIN_STUDY + _SEP)))
