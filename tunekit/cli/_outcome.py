"""What the subcommands share: the outcome they print and how --set values are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from tunekit.errors import UsageError


def print_outcome(summary: Any, run_dir: Path) -> None:
    """The knee's reason, the gain over the PyTorch defaults and where recommended.yaml is."""
    click.echo(summary.choice.reason)
    if summary.choice.knee is None:
        return
    if summary.speedup_vs_defaults:
        click.echo(f"{summary.speedup_vs_defaults:.2f}x the PyTorch defaults (0 workers, no pinning).")
    click.echo(f"-> {run_dir / 'recommended.yaml'}")


def parse_overrides(sets: tuple[str, ...]) -> dict[str, Any]:
    """``--set`` items of dotted config keys, values parsed as YAML."""
    overrides = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or "." not in key.strip():
            raise UsageError(f"--set {item!r}: expected a dotted config key, e.g. --set trial.window_s=5")
        overrides[key.strip()] = parse_value(key.strip(), value)
    return overrides


def parse_value(key: str, text: str) -> Any:
    """A --set value as YAML (one line naming the key when it is not valid YAML)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"--set {key}={text}: not a valid YAML value ({problem})") from None
