"""What the subcommands share: the outcome they print and how --set values are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from tunekit import config as config_mod
from tunekit.errors import UsageError


def print_outcome(summary: Any, run_dir: Path) -> None:
    """The knee's reason, the gain over the PyTorch defaults and where recommended.yaml is."""
    click.echo(summary.choice.reason)
    if summary.choice.knee is None:
        return
    if summary.speedup_vs_defaults:
        click.echo(f"{summary.speedup_vs_defaults:.2f}x the PyTorch defaults (0 workers, no pinning).")
    click.echo(f"-> {run_dir / 'recommended.yaml'}")


def split_sets(sets: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--set`` items, the same in every subcommand: knobs (``num_workers=4``, checked as ``tunekit.trial``
    checks them) and dotted config keys (``trial.window_s=5``), each value read as YAML."""
    knobs: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set num_workers=4 or --set trial.window_s=5")
        if key in config_mod.KNOB_HELP:
            knobs[key] = config_mod.parse_knob(key, value.strip())
        elif "." in key or key in config_mod.TOP_LEVEL_KEYS:
            overrides[key] = parse_value(key, value)
        else:
            raise UsageError(f"--set {key}: unknown knob; allowed: {', '.join(config_mod.KNOB_HELP)}, a top-level "
                             f"config key ({', '.join(config_mod.TOP_LEVEL_KEYS)}) or a dotted one (e.g. "
                             "trial.window_s)")
    return knobs, overrides


def parse_value(key: str, text: str) -> Any:
    """A --set value as YAML (one line naming the key when it is not valid YAML)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"--set {key}={text}: not a valid YAML value ({problem})") from None
