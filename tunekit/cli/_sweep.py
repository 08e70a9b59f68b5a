from __future__ import annotations

import sys

import click

from tunekit.cli._outcome import config_source, print_disturbances, print_outcome, split_sets
from tunekit.contract import KNOB_NAMES, Strategy


@click.command()
@click.argument("config_path", metavar="[CONFIG]", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--script",
    default=None,
    metavar="COMMAND",
    help='Your training command instead of a CONFIG, e.g. "python train.py -j {num_workers}" (knobs '
    "without a placeholder are set on its training DataLoader).",
)
@click.option("--name", default=None, help="The run's name with --script (default: the script's file name).")
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Run folder (default results/<name>)."
)
@click.option(
    "--budget-min",
    type=float,
    default=None,
    help="Wall-clock budget in minutes, more than 0 (default: budget.minutes).",
)
@click.option(
    "--strategy",
    type=click.Choice([s.value for s in Strategy]),
    default=None,
    help="staged (default from the config) or grid (every combination).",
)
@click.option(
    "--resume/--no-resume",
    default=True,
    show_default=True,
    help="Keep the finished trials of an earlier sweep in the same folder, or start again.",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help=f"A knob held at one value for the whole sweep ({', '.join(KNOB_NAMES)}) or a dotted config key "
    "(e.g. --set trial.window_s=5 --set 'search.batch_size=[64,128]').",
)
@click.option(
    "--storage",
    default=None,
    metavar="URL",
    help="A database for the run's studies (storage: in the config), e.g. postgresql://USER@HOST/DB, shared by "
    "several runs and by the machines of one sweep; default: study.db in the run folder.",
)
@click.option(
    "--join",
    is_flag=True,
    help="Take trials of the sweep another machine of the same type runs in --storage (same CONFIG).",
)
@click.option("--quiet", is_flag=True, help="No progress bar or trial log.")
def sweep(
    config_path: str | None,
    script: str | None,
    name: str | None,
    out_dir: str | None,
    budget_min: float | None,
    strategy: str | None,
    resume: bool,
    sets: tuple[str, ...],
    storage: str | None,
    join: bool,
    quiet: bool,
) -> None:
    """Run short isolated trials, pick the throughput knee, write plots, report.md, trials.csv, study.db and
    recommended.yaml under results/<name>/. With --storage URL the study lives in that database, and each further
    machine of the same type runs the same command with --join: they share the sweep's trials."""
    from tunekit import _api
    from tunekit.driver import interrupts_as_keyboard_interrupt
    from tunekit.report import console_table, make_console

    knobs, overrides = split_sets(sets)
    source = config_source(config_path, script, name, "search.batch_size" in overrides or "batch_size" in knobs)
    with interrupts_as_keyboard_interrupt():  # SIGTERM and SIGHUP end the sweep as Ctrl-C does
        outcome = _api.sweep(
            source,
            out=out_dir,
            budget_min=budget_min,
            strategy=strategy,
            overrides=overrides,
            knobs=knobs,
            resume=resume,
            quiet=quiet,
            storage=storage,
            join=join,
        )
    print_disturbances(outcome.summary)
    make_console(quiet).print(console_table(outcome.summary))
    print_outcome(outcome.summary, outcome.run_dir)
    if outcome.interrupted:
        sys.exit(130)
    if outcome.summary.choice.knee is None:
        sys.exit(1)
