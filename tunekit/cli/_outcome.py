from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def print_outcome(summary: Any, run_dir: Path) -> None:
    """The knee's reason, the gain over the PyTorch defaults and where recommended.yaml is."""
    click.echo(summary.choice.reason)
    if summary.choice.knee is None:
        return
    if summary.speedup_vs_defaults:
        click.echo(f"{summary.speedup_vs_defaults:.2f}x the PyTorch defaults (0 workers, no pinning).")
    click.echo(f"-> {run_dir / 'recommended.yaml'}")
