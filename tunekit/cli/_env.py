from __future__ import annotations

import json

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False),
    default="results/env.json",
    show_default=True,
    help="Where to write the JSON snapshot.",
)
def env(as_json: bool, out_file: str) -> None:
    """Print and save the environment: Python, torch, CUDA, driver, CPUs, RAM, /dev/shm, GPUs via NVML."""
    from tunekit._files import write_json_atomic
    from tunekit.env import format_text, snapshot

    snap = snapshot()
    write_json_atomic(out_file, snap)
    click.echo(json.dumps(snap, indent=2) if as_json else format_text(snap))
