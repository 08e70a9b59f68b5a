"""Command-line interface: ``tunekit sweep | trial | check | validate | report | compare | env | node``, one module per
subcommand.

Errors are one line each on stderr (``--debug`` shows the traceback); exit 0 success, 1 runtime failure,
2 usage or config error (``check`` adds 3: tuned on another machine). Nothing here imports torch: trials run in
subprocesses.
"""

from __future__ import annotations

import sys
import traceback

import click

from tunekit.cli._check import check
from tunekit.cli._compare import compare
from tunekit.cli._env import env
from tunekit.cli._node import node
from tunekit.cli._report import report
from tunekit.cli._sweep import sweep
from tunekit.cli._trial import trial
from tunekit.cli._validate import validate
from tunekit.errors import TunekitError

__all__ = ["main", "cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="tunekit")
def cli(debug: bool) -> None:
    """Tune a PyTorch training input pipeline: short isolated trials, the throughput knee, recommended.yaml."""
    # --debug is read by main() before click runs, so that errors raised while parsing also get a traceback


for _command in (sweep, trial, check, validate, report, compare, env, node):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``tunekit`` console script and ``python -m tunekit``."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="tunekit", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except click.Abort:
        click.echo("tunekit: aborted", err=True)
        sys.exit(130)
    except TunekitError as exc:
        if debug:
            traceback.print_exc()
        for line in exc.lines():
            click.echo(f"tunekit: error: {line}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("tunekit: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - one line unless --debug
        if debug:
            traceback.print_exc()
        click.echo(f"tunekit: error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
        sys.exit(1)
