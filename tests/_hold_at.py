"""``python -m tests._hold_at MODULE:ATTR MARKER tunekit-args...``: the tunekit CLI, with ``MODULE.ATTR`` held open.

The first call of that function touches MARKER and then waits (up to a minute) before it runs, so that a test can
send a signal while the command is inside that phase (opening the run, writing the outputs), which otherwise lasts
milliseconds. Everything else is the real CLI: its signal handlers, its exit codes, its files.
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from pathlib import Path


def _hold(target: str, marker: Path) -> None:
    module_name, attr = target.split(":")
    module = importlib.import_module(module_name)
    original = getattr(module, attr)
    held = []

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if not held:
            held.append(True)
            marker.touch()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # a signal handler's KeyboardInterrupt ends this wait
                time.sleep(0.05)
        return original(*args, **kwargs)

    setattr(module, attr, wrapper)


if __name__ == "__main__":
    _hold(sys.argv[1], Path(sys.argv[2]))
    from tunekit.cli import main

    main(sys.argv[3:])
