"""tunekit: automated tuning sweeps for PyTorch training input pipelines."""

from __future__ import annotations

__version__ = "0.1.0"

from tunekit.recommended import Recommended, load_recommended  # noqa: E402

__all__ = ["__version__", "Recommended", "load_recommended", "sweep", "trial", "check"]


def __getattr__(name: str):  # the sweep API loads optuna, pandas and the rest only when it is used
    if name in ("sweep", "trial"):
        from tunekit import _api

        return getattr(_api, name)
    if name == "check":
        from tunekit import _check

        return _check.check
    raise AttributeError(f"module 'tunekit' has no attribute {name!r}")
