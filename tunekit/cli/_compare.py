"""``tunekit compare URL|RUN_DIR...``: one job's sweeps on several machine types, each type's knee, rate and items per
unit of money, and the cheapest type per item (``analysis.compare``); the table and a sentence on the console,
compare.md and compare.png under ``--out``, or one JSON object with ``--json``. A run folder is one run; a storage URL
is every run its database holds (``store.runs_in``)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tunekit import store
from tunekit._files import read_json_or
from tunekit.config import Config, from_dict
from tunekit.errors import UsageError
from tunekit.records import TrialRow


@dataclass(frozen=True)
class _Run:
    """One machine type's sweep as read from where it is kept."""

    where: str
    """The run folder as given, or the database's URL (password masked) and the run's name."""
    name: str
    """The folder's name, or the run's name in its database."""
    config: Config
    rows: list[TrialRow]
    env: dict[str, Any]
    """Its env.json; empty for a run read from a database."""
    strategy: str
    machine: dict[str, Any] | None = None
    """The machine its study records, read where there is no env.json."""


@click.command()
@click.argument("runs", nargs=-1, required=True, metavar="URL|RUN_DIR...")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="results/compare",
    show_default=True,
    help="Where compare.md and compare.png go.",
)
@click.option(
    "--per-hour",
    "prices",
    multiple=True,
    metavar="TYPE=PRICE",
    help="A type's price per hour (TYPE: its name in the table, or its run folder as given), over its cost.per_hour.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout instead of the sentences.")
def compare(runs: tuple[str, ...], out_dir: str, prices: tuple[str, ...], as_json: bool) -> None:
    """Compare one job's sweeps on several machine types (a run folder each, or the runs of a storage URL): each
    type's knee, its rate and its items per unit of money with their 95 % intervals, and the cheapest type per
    item."""
    from tunekit import analysis, report

    found = [run for argument in runs for run in runs_of(argument)]
    named = _labels(found)
    price = _prices(prices, found, named)
    types = [
        report.type_run(
            label,
            r.config,
            r.rows,
            env=r.env,
            strategy=r.strategy,
            per_hour=price.get(label),
            machine=r.machine,
            where=r.where,
        )
        for r, label in zip(found, named, strict=True)
    ]
    comparison = analysis.compare(types)
    md, _ = report.write_compare(Path(out_dir), comparison)
    report.make_console().print(report.compare_table(comparison))
    lines = [report.cheapest_text(comparison), *(f"{note}." for note in comparison.notes), f"-> {md}"]
    for line in lines:
        click.echo(line, err=as_json)
    if as_json:
        click.echo(json.dumps(report.compare_json(comparison), indent=2))


def runs_of(argument: str) -> list[_Run]:
    """The runs an argument names: a run folder holds one, a storage URL every run its database holds.

    Raises:
        UsageError: not a folder, or not a tunekit run's (its study.db missing, empty or foreign); a bad URL, or
            a database that holds no run.
        StorageError: the database cannot be reached or read.
    """
    if "://" in argument:
        return _stored(argument)
    folder = Path(argument)
    if not folder.is_dir():
        raise UsageError(f"{argument}: no such folder; give the run folder of a tunekit sweep, one per machine type")
    runs = store.load_run(folder)
    cfg = from_dict(runs.config, source=str(folder / store.STUDY_FILE))
    meta, env = read_json_or(folder / "sweep.json", {}), read_json_or(folder / "env.json", {})
    machine = None if env else runs.main.user_attrs.get("machine")
    name = folder.resolve().name
    return [_Run(argument, name, cfg, runs.rows(), env, meta.get("strategy", cfg.strategy), machine)]


def _stored(url: str) -> list[_Run]:
    """Every run a database holds, each named by its run name, with the machine its study records."""
    held = store.runs_in(url)
    if not held:
        raise UsageError(f"{store.masked(url)}: holds no tunekit run; give the URL the sweeps wrote to (--storage)")
    out = []
    for run in held:
        runs = store.load_stored(url, run.name)
        cfg = from_dict(runs.config, source=f"{store.masked(url)}: run {run.name}")
        where = f"{store.masked(url)} run {run.name}"
        out.append(_Run(where, run.name, cfg, runs.rows(), {}, runs.strategy or cfg.strategy, run.machine))
    return out


def _labels(found: list[_Run]) -> list[str]:
    """Each type's name in the table: its folder's or run's name, or where it is kept where two share a name."""
    names = [r.name for r in found]
    return [r.name if names.count(r.name) == 1 else r.where for r in found]


def _prices(given: tuple[str, ...], found: list[_Run], labels: list[str]) -> dict[str, float]:
    """``--per-hour TYPE=PRICE`` items as each type's price, by its label; TYPE names a run by its label, its
    folder's or run's name, or its folder as given."""
    out: dict[str, float] = {}
    for item in given:
        key, sep, value = item.partition("=")
        try:
            price = float(value) if sep else math.nan
        except ValueError:
            price = math.nan
        if not (price > 0 and math.isfinite(price)):
            raise UsageError(f"--per-hour {item}: give TYPE=PRICE, PRICE a number above 0 (a price per hour)")
        named = [label for r, label in zip(found, labels, strict=True) if _names(key, r, label)]
        if len(named) != 1:
            which = "no run" if not named else f"{len(named)} runs"
            raise UsageError(
                f"--per-hour {item}: {key!r} names {which} of {', '.join(labels)}; name one by its name in the "
                "table, or its folder as given"
            )
        out[named[0]] = price
    return out


def _names(key: str, run: _Run, label: str) -> bool:
    return key in (label, run.name) or os.path.normpath(key) == os.path.normpath(run.where)
