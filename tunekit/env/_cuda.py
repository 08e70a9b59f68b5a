"""Whether a sweep's trials will run on CUDA, asked of a short-lived subprocess: the sweep's own process never
imports torch (it must hold no CUDA context)."""

from __future__ import annotations

import subprocess
import sys

__all__ = ["probe_cuda"]


def probe_cuda(device: str) -> bool:
    """Whether trials will run on CUDA (``device`` auto or cuda, and torch sees a GPU); False when the probe does
    not answer within two minutes."""
    if device == "cpu":
        return False
    code = "import torch; print(torch.cuda.is_available())"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return out.stdout.strip() == "True"
