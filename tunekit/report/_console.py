"""The sweep's console: where its lines go (stderr, or nowhere with ``--quiet``), its warnings, and the live progress
bar with one log line per finished trial."""

from __future__ import annotations

from typing import Any

from tunekit import plan
from tunekit.records import TrialRow

__all__ = ["make_console", "warn", "Progress"]


def make_console(quiet: bool = False) -> Any:
    """A stderr console; without a terminal (CI logs) it is wide enough for the trial table.

    It reads no markup: what it prints holds library and user text (a gloo error's ``[/__w/pytorch/...]``, a path
    in brackets), which must print as it is. Styles are given as styles (:func:`warn`), never inside the text."""
    from rich.console import Console

    console = Console(stderr=True, quiet=quiet, markup=False, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=True, quiet=quiet, markup=False, highlight=False, width=160)
    return console


def warn(console: Any, line: str, prefix: str = "warning:") -> None:
    """``prefix line`` with the prefix in yellow; ``line`` is printed as text, whatever brackets it holds."""
    from rich.text import Text

    console.print(Text.assemble((prefix, "yellow"), " ", line))


class Progress:
    """A live bar (trials done / planned, elapsed, ETA, current stage and knobs, last throughput) plus one log
    line per finished trial, so logs without a terminal still show progress."""

    def __init__(self, console: Any, total: int, done: int):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            # the fields hold knob values and failure reasons: text, never markup
            TextColumn("{task.fields[stage]:<12}", style="bold", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[current]}", markup=False),
            TextColumn("{task.fields[last]}", style="dim", markup=False),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("sweep", total=total, completed=done, stage="", current="", last="")

    def __enter__(self) -> Progress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def starting(self, req: plan.Request) -> None:
        self.progress.update(self.task, stage=req.stage, current=f"{req.mode}: {req.knobs.describe()}")

    def finished(self, row: TrialRow, total: int) -> None:
        last = f"last {row.rate:.1f}/s" if row.ok else f"last {row.status}"
        self.progress.update(self.task, advance=1, total=total, last=last)
        result = f"{row.rate:.1f} {row.unit}/s" if row.ok else f"{row.status}: {row.reason}"
        m = row.measurement
        if row.ok and m.rate_whole_epoch is not None and m.rate_in_epoch and m.boundary_s is not None:
            result += (
                f" over whole epochs ({m.rate_in_epoch:.1f}/s inside an epoch, {m.boundary_s:.1f} s between epochs)"
            )
        self.progress.console.print(f"trial {row.number} [{row.stage}/{row.mode}] {row.knobs.describe()}: {result}")
        for warning in row.measurement.warnings or []:
            warn(self.progress.console, f"trial {row.number}: {warning}")
