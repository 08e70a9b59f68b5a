"""A trial's output, read from its pipe into worker.log: the head as it comes, the tail kept in memory and written
when the trial ends. No read of the pipe can hold the sweep: the reading thread polls, and it stops when the trial
has ended even if something the trial left still holds the pipe open. This module never imports torch."""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path
from typing import Any

from tunekit.errors import TunekitError

__all__ = ["TrialLog", "LOG_KEEP_BYTES", "DRAIN_S"]

LOG_KEEP_BYTES = 4 * 2**20
"""worker.log keeps the first and the last this many bytes of a trial's output (a dataset that prints on every
sample would otherwise fill the disk), with a line saying how much was left out between them."""
DRAIN_S = 2.0
"""How long the output of a trial that has ended may take to arrive (what its processes wrote just before the end)."""
_POLL_S = 0.2


class TrialLog:
    """worker.log of one trial, fed from its output pipe by a thread (:meth:`follow`). A write that fails (a full
    disk, a file-size limit) ends the sweep as one line naming the file, once the trial has been ended."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._file = open(path, "wb")
        except OSError as exc:
            raise TunekitError(f"{path}: cannot write the trial's log: {exc.strerror or exc}") from None
        self._written = 0
        self._tail = bytearray()
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self._pipe: Any = None
        self._ended = threading.Event()
        self._error: OSError | None = None

    def __enter__(self) -> TrialLog:
        return self

    def follow(self, pipe: Any) -> None:
        self._pipe = pipe
        self._thread = threading.Thread(target=self._read, args=(pipe.fileno(),), name="tunekit-log", daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        drain_until = None
        while True:
            ready, _, _ = select.select([fd], [], [], _POLL_S)
            if not ready:
                if self._ended.is_set():
                    return
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self._keep(chunk)
            if self._ended.is_set():  # the trial has ended: what is still coming, for a short while
                drain_until = drain_until or time.monotonic() + DRAIN_S
                if time.monotonic() > drain_until:
                    return

    def _keep(self, chunk: bytes) -> None:
        head = max(0, min(len(chunk), LOG_KEEP_BYTES - self._written))
        if head and self._error is None:
            try:
                self._file.write(chunk[:head])
                self._file.flush()
            except OSError as exc:
                self._error = exc
            self._written += head
        self._tail += chunk[head:]
        if len(self._tail) > LOG_KEEP_BYTES:
            self._dropped += len(self._tail) - LOG_KEEP_BYTES
            del self._tail[: len(self._tail) - LOG_KEEP_BYTES]

    def __exit__(self, *raised: Any) -> None:
        self._ended.set()
        if self._thread is not None:
            self._thread.join(timeout=DRAIN_S + 2 * _POLL_S)
        if self._pipe is not None and (self._thread is None or not self._thread.is_alive()):
            self._pipe.close()
        try:
            if self._error is None:
                if self._dropped:
                    self._file.write(
                        f"\n[tunekit: {self._dropped} bytes of output left out here; worker.log keeps "
                        f"the first and last {LOG_KEEP_BYTES} bytes]\n".encode()
                    )
                self._file.write(bytes(self._tail))
            self._file.close()
        except OSError as failed:
            self._error = self._error or failed
        if self._error is not None and raised == (None, None, None):
            error = self._error
            raise TunekitError(
                f"{self.path}: cannot write the trial's log: {error.strerror or error}; free space "
                "(or raise the file-size limit) and resume"
            )
