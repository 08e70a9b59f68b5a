"""tunekit's bootstrap for script mode: a ``sitecustomize`` the trial puts first on ``PYTHONPATH``, so the user's
own command (``python train.py``, ``python -m pkg.train``, ``torchrun ... train.py``) runs unedited with the
meter inside (``tunekit.worker.script._hook``). Without the trial's spec in the environment
(``contract.process.SCRIPT_SPEC``: every process but the script's own, which takes it out as the meter installs, and
torchrun's ranks) it does nothing but hand over to the next ``sitecustomize`` on the path, as Python would have
imported it."""

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


def _names() -> object:
    """``tunekit.contract.process``, loaded by its path: it imports nothing, so it loads in an interpreter that
    cannot import tunekit (or torch), where the bootstrap must still say why."""
    package = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    path = os.path.join(package, "contract", "process.py")  # tunekit/worker/script/_bootstrap/ -> tunekit/
    spec = importlib.util.spec_from_file_location("_tunekit_process_names", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bootstrap(names: object) -> None:
    """Load the meter; if it cannot load, the trial fails at once with the reason (a script left to run unmetered
    would train to its end, or to the trial's timeout, and measure nothing)."""
    out_path = os.environ[names.SCRIPT_MEASUREMENT]  # type: ignore[attr-defined]
    try:
        import torch  # noqa: F401 - first: the usual reason it cannot load is an interpreter without torch

        from tunekit.worker.script._hook import install

        install()
    except BaseException as exc:  # noqa: BLE001 - any failure here must end the trial, said in one line
        import json

        reason = (
            f"tunekit's bootstrap could not load in the script's interpreter ({sys.executable}): "
            f"{type(exc).__name__}: {exc}"
            + (
                "; run the sweep with the interpreter of the script's environment "
                "(its virtualenv activated) or install tunekit there"
                if isinstance(exc, ImportError)
                else ""
            )
        )
        with open(out_path, "w") as out:
            json.dump({"version": 2, "status": "crashed", "reason": reason, "exception": type(exc).__name__}, out)
        sys.stderr.write(f"tunekit: {reason}\n")
        sys.stderr.flush()
        os._exit(3)


_chain()
_NAMES = _names()
if os.environ.get(_NAMES.SCRIPT_SPEC):
    _bootstrap(_NAMES)
