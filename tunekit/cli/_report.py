from __future__ import annotations

from pathlib import Path

import click

from tunekit.cli._outcome import print_disturbances, print_outcome


@click.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(file_okay=False))
@click.option(
    "--storage",
    default=None,
    metavar="URL",
    help="The database holding the run's studies, with its password (default: the URL the run folder records, "
    "the password from PGPASSWORD or ~/.pgpass).",
)
def report(run_dir: str, storage: str | None) -> None:
    """Rebuild a run's outputs (trials.csv, report.md, recommended.yaml, plots) from its study; re-runs nothing."""
    from tunekit.driver import rebuild
    from tunekit.report import console_table, make_console

    summary = rebuild(Path(run_dir), storage)
    print_disturbances(summary)
    make_console().print(console_table(summary))
    print_outcome(summary, Path(run_dir))
