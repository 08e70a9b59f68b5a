from __future__ import annotations

import sys
from pathlib import Path

import click

from tunekit import config as config_mod
from tunekit.cli._outcome import parse_overrides, print_outcome


@click.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Run folder (default results/<name>).")
@click.option("--budget-min", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Wall-clock budget in minutes (default: budget.minutes).")
@click.option("--strategy", type=click.Choice(["staged", "grid"]), default=None,
              help="staged (default from the config) or grid (every combination).")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Keep the finished trials of an earlier sweep in the same folder, or start again.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="A dotted config key to override (e.g. --set trial.window_s=5 --set 'search.batch_size=[64,128]').")
@click.option("--quiet", is_flag=True, help="No progress bar or trial log.")
def sweep(config_path: str, out_dir: str | None, budget_min: float | None, strategy: str | None, resume: bool,
          sets: tuple[str, ...], quiet: bool) -> None:
    """Run short isolated trials, pick the throughput knee, write plots, report.md, trials.csv, study.db and
    recommended.yaml under results/<name>/."""
    from tunekit.driver import make_console, run_sweep
    from tunekit.report import console_table

    cfg = config_mod.load(config_path, overrides=parse_overrides(sets))
    run_dir = Path(out_dir or Path("results") / cfg.name)
    result = run_sweep(cfg, run_dir, strategy=strategy or cfg.strategy,
                       budget_minutes=budget_min or cfg.budget.minutes, resume=resume, quiet=quiet)
    make_console(quiet).print(console_table(result.summary))
    print_outcome(result.summary, run_dir)
    if result.interrupted:
        sys.exit(130)
    if result.summary.choice.knee is None:
        sys.exit(1)
