"""Where the script is: the marks file (``names.SCRIPT_MARKS``) the launcher reads however the script ends (the
loaders it built, whether one was iterated, the batches handed to its loop)."""

from __future__ import annotations

import mmap
import os
import struct

from tunekit.contract import process as names

__all__ = ["Marks"]


class Marks:
    """Where the script is (``names.SCRIPT_MARKS`` in the trial's folder), written through a shared mapping: a store
    per batch, no system call, and there for the launcher to read however the process ends."""

    def __init__(self, path: str | None):
        self.built = self.iterated = self.batches = 0
        self._map: mmap.mmap | None = None
        if path is None:  # a rank but rank 0: rank 0 says where the ranks were
            return
        size = struct.calcsize(names.SCRIPT_MARKS_FORMAT)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def put(self, **marks: int) -> None:
        for key, value in marks.items():
            setattr(self, key, value)
        if self._map is not None:
            struct.pack_into(names.SCRIPT_MARKS_FORMAT, self._map, 0, self.built, self.iterated, self.batches)
