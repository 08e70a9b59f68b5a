"""tunekit: automated tuning sweeps for PyTorch training input pipelines."""

from __future__ import annotations

__version__ = "0.1.0"

from tunekit.recommended import Recommended, load_recommended  # noqa: E402

__all__ = ["__version__", "Recommended", "load_recommended"]
