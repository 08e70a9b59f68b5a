"""Test-only workload pieces, imported by trial workers through their import paths (tests._workloads:...)."""

from __future__ import annotations

import os
import signal

import torch


def huge_alloc_step(model, batch, ctx):
    """Asks the host allocator for far more memory than any machine has: a real host OOM error."""
    torch.empty(1 << 50, dtype=torch.uint8)
    return model(batch[0]).sum()


def self_kill_step(model, batch, ctx):
    """Dies the way the kernel's OOM killer ends a process: SIGKILL, no message."""
    os.kill(os.getpid(), signal.SIGKILL)


def nan_step(model, batch, ctx):
    return model(batch[0]).sum() * float("nan")
