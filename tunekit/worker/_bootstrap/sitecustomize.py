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


_chain()
if os.environ.get("TUNEKIT_SCRIPT_SPEC"):
    from tunekit.worker._script import install

    install()
