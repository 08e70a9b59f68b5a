"""tunekit's bootstrap for script mode: a ``sitecustomize`` the trial puts first on ``PYTHONPATH``, so the user's
own command (``python train.py``, ``python -m pkg.train``, ``torchrun ... train.py``) runs unedited with the
meter inside (``tunekit.worker._script``). Without ``TUNEKIT_SCRIPT_SPEC`` in the environment it does nothing but
hand over to the next ``sitecustomize`` on the path, as Python would have imported it."""

from __future__ import annotations

import importlib.util
import os
import sys


def _chain() -> None:
    """Run the sitecustomize this one shadows (a virtualenv's or a distribution's), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_tunekit_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


def _bootstrap() -> None:
    """Load the meter; if it cannot load, the trial fails at once with the reason (a script left to run unmetered
    would train to its end, or to the trial's timeout, and measure nothing)."""
    try:
        from tunekit.worker._script import install

        install()
    except BaseException as exc:  # noqa: BLE001 - any failure here must end the trial, said in one line
        import json

        reason = f"tunekit's bootstrap could not load in the script's interpreter ({sys.executable}): " \
                 f"{type(exc).__name__}: {exc}"
        with open(os.environ["TUNEKIT_SCRIPT_MEASUREMENT"], "w") as out:
            json.dump({"version": 2, "status": "crashed", "reason": reason, "exception": type(exc).__name__}, out)
        sys.stderr.write(f"tunekit: {reason}\n")
        sys.stderr.flush()
        os._exit(3)


_chain()
if os.environ.get("TUNEKIT_SCRIPT_SPEC"):
    _bootstrap()
