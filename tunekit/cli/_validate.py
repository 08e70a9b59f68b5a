from __future__ import annotations

import click

from tunekit import config as config_mod


@click.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
def validate(config_path: str) -> None:
    """Check a config file strictly (keys, types, ranges, choices, import paths). Needs no GPU."""
    cfg = config_mod.load(config_path)
    s = cfg.search
    click.echo(
        f"{config_path}: ok — {cfg.name}: workers {s.num_workers}, batch {s.batch_size}, "
        f"pin_memory {s.pin_memory}, prefetch {s.prefetch_factor}, compile {s.compile}, strategy {cfg.strategy}"
    )
