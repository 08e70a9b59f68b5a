"""tunekit: automated tuning sweeps for PyTorch training input pipelines."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
