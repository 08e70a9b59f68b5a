"""What the subcommands share: the outcome they print and how --set values are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from tunekit import config as config_mod
from tunekit.command import placeholders
from tunekit.errors import UsageError


def print_disturbances(summary: Any) -> None:
    """What says the figures are disturbed: printed before anything else of a run's outcome."""
    for line in summary.disturbances:
        click.echo(f"DISTURBED: {line}.", err=True)


def print_outcome(summary: Any, run_dir: Path) -> None:
    """The knee's output per unit of money (with a price), its reason, the gains, its model's share of the
    device's matmul peak and where recommended.yaml is."""
    from tunekit.report import flop_summary, money_summary

    money = money_summary(summary)
    if money:
        click.echo(money)
    click.echo(summary.choice.reason)
    if summary.choice.knee is None:
        return
    if summary.speedup_vs_defaults:
        click.echo(f"{summary.gain_text(summary.defaults)} the PyTorch defaults (0 workers, no pinning).")
    if summary.speedup_vs_script and not summary.choice.kept:
        click.echo(f"{summary.gain_text(summary.script_baseline)} the script's own settings.")
    flops = flop_summary(summary)
    if flops:
        click.echo(flops)
    click.echo(f"-> {run_dir / 'recommended.yaml'}")


def split_sets(sets: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--set`` items, the same in every subcommand: knobs (``num_workers=4``, checked as ``tunekit.trial``
    checks them) and dotted config keys (``trial.window_s=5``), each value read as YAML; a key given twice is an
    error (which one was meant cannot be told)."""
    knobs: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set num_workers=4 or --set trial.window_s=5")
        if key in given:
            raise UsageError(f"--set {key}: given twice ({given[key]} and {value.strip()}); give each key once")
        given[key] = value.strip()
        if key in config_mod.KNOB_HELP:
            knobs[key] = config_mod.parse_knob(key, value.strip())
        elif "." in key or key in config_mod.TOP_LEVEL_KEYS:
            overrides[key] = parse_value(key, value)
        else:
            raise UsageError(
                f"--set {key}: unknown knob; allowed: {', '.join(config_mod.KNOB_HELP)}, a top-level "
                f"config key ({', '.join(config_mod.TOP_LEVEL_KEYS)}) or a dotted one (e.g. "
                "trial.window_s)"
            )
    return knobs, overrides


def parse_value(key: str, text: str) -> Any:
    """A --set value as YAML (one line naming the key when it is not valid YAML)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"--set {key}={text}: not a valid YAML value ({problem})") from None


def config_source(config_path: str | None, script: str | None, name: str | None, listed_batches: bool) -> Any:
    """What a sweep or trial runs: a config file, or (``--script``) a config made for the command on this machine:
    workers 0 ... 2x the usable CPUs, both pin settings, prefetch 2 and 4, and the script's own batch unless the
    command fills ``{batch_size}`` or batches are listed (``--set 'search.batch_size=[...]'``)."""
    if (config_path is None) == (script is None):
        raise UsageError("give a CONFIG file or --script COMMAND (exactly one)")
    if config_path is not None:
        if name is not None:
            raise UsageError("--name goes with --script; a config file names its run with its name key")
        return config_path
    try:
        filled = placeholders(script)
    except ValueError as exc:
        raise UsageError(f"--script {script!r}: cannot split it into arguments: {exc}") from None
    own_batch = "batch_size" not in filled and not listed_batches
    stem = next((Path(w).stem for w in script.split() if w.endswith(".py")), None) or "script"
    return {
        "name": name or stem,
        "script": {"command": script, "cwd": str(Path.cwd()), "own_batch": own_batch},
        "search": {"num_workers": "auto", "pin_memory": [False, True], "prefetch_factor": [2, 4]},
    }
