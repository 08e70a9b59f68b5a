from __future__ import annotations

from pathlib import Path

import click

from tunekit import config as config_mod
from tunekit.driver import interrupts_as_keyboard_interrupt
from tunekit.launch import run_node


@click.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option(
    "--node-rank",
    type=click.IntRange(min=1),
    required=True,
    help="This node's rank, 1 ... launch.nnodes - 1 (node 0 runs the sweep).",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="Where this node keeps its log and failures (default: results/<name>-node<K>).",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=1),
    default=3600.0,
    show_default=True,
    help="Stop after this many seconds without a trial (the sweep normally releases this node).",
)
def node(config_path: str, node_rank: int, out: str | None, idle_timeout: float) -> None:
    """Serve this node's ranks of every multi-node trial of the sweep run on node 0 (launch.nnodes > 1)."""
    cfg = config_mod.load(config_path)
    folder = Path(out) if out else Path("results") / f"{cfg.name}-node{node_rank}"
    click.echo(
        f"node {node_rank} of {cfg.launch.nnodes}: waiting for trials at {cfg.launch.rdzv_endpoint} "
        f"(log: {folder / 'node.log'})",
        err=True,
    )
    with interrupts_as_keyboard_interrupt():  # SIGTERM and SIGHUP end this node's ranks as Ctrl-C does
        run_node(cfg, node_rank, folder, idle_timeout_s=idle_timeout, say=lambda line: click.echo(line, err=True))
