"""Where a run's studies live: the embedded ``study.db`` of its run folder, or a database named by a URL
(``storage:``, ``--storage``) that the nodes of one sweep, and several runs, share.

A URL's password is never shown or written: :func:`masked` (``***``) is what an error line or the console says,
:attr:`StorageUrl.recorded` (no password at all) what a run folder records; libpq then takes the password from
``PGPASSWORD`` or ``~/.pgpass``, as any PostgreSQL client does. A malformed URL or an unknown scheme is a usage error
(exit 2); a server that cannot be reached, or refuses, a :class:`StorageError` (exit 1), each one line naming the
masked URL and the cause.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sqlite3
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import optuna

from tunekit.errors import StorageError, UsageError

__all__ = ["StorageUrl", "parse_url", "masked", "storage_errors", "rdb_storage", "quiet_optuna"]

_DRIVERS = {"postgresql": ("psycopg2", "psycopg")}
"""The PostgreSQL drivers SQLAlchemy knows, the first installed one taken for a plain ``postgresql://``."""
_FORMS = "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE or sqlite:///PATH"
_FLEET = "pip install 'tunekit[fleet]'"
_CONNECT_TIMEOUT_S = 10
"""How long a PostgreSQL connection may take before the server counts as unreachable."""


@dataclass(frozen=True)
class StorageUrl:
    """A checked storage URL (``sqlalchemy.engine.URL``), its driver installed."""

    url: Any
    shown: str
    """The URL as given, as the console and error lines show it: its password masked."""

    @property
    def recorded(self) -> str:
        """The URL as a run folder and its study record it: without its password (and without the driver, which
        the machine that reads it chooses again)."""
        bare = self.url._replace(password=None).set(drivername=self.url.drivername.partition("+")[0])
        return str(bare.render_as_string(hide_password=False))

    @property
    def password(self) -> str | None:
        return self.url.password or None

    @property
    def sqlite(self) -> bool:
        return bool(self.url.drivername.partition("+")[0] == "sqlite")


def masked(text: str) -> str:
    """Any storage URL with its password replaced by ``***`` (a string that does not parse is cut at its last
    ``@``'s user part, so a malformed URL's password is never shown either)."""
    from sqlalchemy.engine import make_url

    try:
        url = make_url(text)
        return str(url.render_as_string(hide_password=True)) if url.password else text
    except Exception:  # noqa: BLE001 - a malformed URL: mask by hand
        scheme, sep, rest = text.partition("://")
        user, at, host = rest.rpartition("@")
        if not sep or not at:
            return text
        return f"{scheme}://{user.partition(':')[0]}{':***' if ':' in user else ''}@{host}"


def parse_url(text: str) -> StorageUrl:
    """Check a storage URL: its form, its scheme (``postgresql``, with the psycopg2 or psycopg driver, or
    ``sqlite`` with a file), and that its driver is installed.

    Raises:
        UsageError: malformed, another scheme, a SQLite URL without a file, or the driver missing (exit 2).
    """
    from sqlalchemy.engine import make_url

    try:
        url = make_url(text)
    except Exception:  # noqa: BLE001 - SQLAlchemy's ArgumentError, or a bad port: the same line
        raise UsageError(f"storage {masked(text)!r}: not a URL; give {_FORMS}") from None
    backend, plus, driver = url.drivername.partition("+")
    if backend == "postgres":  # the old spelling some hosts hand out
        url = url.set(drivername="postgresql" + plus + driver)
        backend = "postgresql"
    if backend == "sqlite" and not driver:
        if not url.database or url.database == ":memory:":
            raise UsageError(f"storage {masked(text)!r}: a SQLite URL names a file (sqlite:///PATH)")
        return StorageUrl(url, masked(text))
    if backend not in _DRIVERS:
        raise UsageError(f"storage {masked(text)!r}: unknown scheme {url.drivername!r}; give {_FORMS}")
    return StorageUrl(_with_driver(url, text), masked(text))


def _with_driver(url: Any, text: str) -> Any:
    """The URL with an installed driver: the one it names, else the first of :data:`_DRIVERS` installed."""
    backend, _, named = url.drivername.partition("+")
    if named and named not in _DRIVERS[backend]:
        raise UsageError(
            f"storage {masked(text)!r}: driver {named!r} is not supported; use {' or '.join(_DRIVERS[backend])}"
        )
    for driver in (named,) if named else _DRIVERS[backend]:
        if importlib.util.find_spec(driver) is not None:
            return url.set(drivername=f"{backend}+{driver}")
    raise UsageError(f"storage {masked(text)!r}: the {backend} driver is not installed: {_FLEET}")


def _cause(exc: BaseException, password: str | None = None) -> str:
    """The database's own words for a storage failure ("database or disk is full", "Connection refused"), found
    along the chain of exceptions optuna and SQLAlchemy wrap it in; never the password."""
    import sqlalchemy.exc

    seen: BaseException | None = exc
    words = ""
    while seen is not None:
        if isinstance(seen, sqlite3.Error):
            words = str(seen)
            break
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.orig is not None:
            words = str(seen.orig)
            break
        seen = seen.__cause__ or seen.__context__
    words = words or str(exc) or type(exc).__name__
    lines = [line.strip() for line in words.splitlines() if line.strip()]
    text = "; ".join(lines[:2])[:300] if lines else type(exc).__name__
    return text.replace(password, "***") if password else text


@contextlib.contextmanager
def storage_errors(where: object, password: str | None = None) -> Iterator[None]:
    """Turn a failure of the study's storage into one line naming it (a file, or a masked URL) and the cause
    (StorageError)."""
    import sqlalchemy.exc

    try:
        yield
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error) as exc:
        raise StorageError(f"{where}: {_cause(exc, password)}") from exc


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's notes that do not concern a user here: the heartbeat is experimental, and is "supposed to be used
    with Study.optimize" (a node records it itself around each trial it asked for)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        yield


def rdb_storage(storage: StorageUrl, heartbeat_s: int, grace_s: int, pooled: bool = True) -> optuna.storages.RDBStorage:
    """The optuna storage of a URL, with heartbeats: a trial whose node stops beating for ``grace_s`` is failed by
    the next node that asks for a trial, and optuna's retry callback puts it back in the queue. ``pooled``: keep
    connections open for the next query (a node); else each query connects afresh (a reader: ``tunekit report``,
    ``tunekit compare``), so that no connection outlives its use.

    Raises:
        StorageError: the server cannot be reached, refuses, or holds another optuna's schema.
    """
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is None:  # optuna < 4.9 names it otherwise, and its keyword too
        raise UsageError(f"storage {storage.shown}: needs optuna >= 4.9 for its heartbeat: {_FLEET}")
    from sqlalchemy.pool import NullPool

    kwargs: dict[str, Any] = {"pool_pre_ping": True} if pooled else {"poolclass": NullPool}
    if not storage.sqlite:
        kwargs["connect_args"] = {"connect_timeout": _CONNECT_TIMEOUT_S}
    with quiet_optuna(), storage_errors(storage.shown, storage.password):
        try:
            return optuna.storages.RDBStorage(
                storage.url.render_as_string(hide_password=False),
                engine_kwargs=kwargs,
                heartbeat_interval=heartbeat_s,
                grace_period=grace_s,
                heartbeat_stale_trial_callback=retry(max_retry=None),
            )
        except RuntimeError as exc:  # optuna's word on a schema it cannot use (another version's)
            raise StorageError(f"{storage.shown}: {_cause(exc, storage.password)}") from exc
