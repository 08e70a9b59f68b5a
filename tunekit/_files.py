"""Atomic file writes: a reader (or a resumed sweep after a kill) sees the old file or the whole new one."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunekit.errors import TunekitError

__all__ = ["atomic_path", "write_text_atomic", "write_json_atomic", "read_json"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that infer a format from it still work); once the
    block succeeds it replaces ``path`` in one step, otherwise it is removed."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
        os.close(fd)
    except OSError as exc:
        raise TunekitError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs such as recommended.yaml are shared
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a read-only folder: one line naming the file
        Path(tmp).unlink(missing_ok=True)
        raise TunekitError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike[str], text: str | bytes) -> None:
    """Write a whole file atomically, flushed to disk before it replaces the old one."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(text.encode() if isinstance(text, str) else text)
        fh.flush()
        os.fsync(fh.fileno())


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path) as fh:
        return json.load(fh)


def read_json_or(path: str | os.PathLike[str], default: Any) -> Any:
    """The JSON file's content, or ``default`` where there is no such file (an older run's folder lacks some)."""
    return read_json(path) if os.path.exists(path) else default
