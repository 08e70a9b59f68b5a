"""A run's outputs, rebuilt from its finished trials: trials.csv, recommended.yaml, plots, report.md, and the
console table; ``tunekit compare``'s table, compare.md and compare.png (``_compare``).

Compute, then render: :func:`summarize` turns rows into a :class:`RunSummary`; every writer only formats it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tunekit._files import write_text_atomic
from tunekit.errors import UsageError
from tunekit.report._compare import cheapest_text, compare_json, compare_md, compare_table, type_run, write_compare
from tunekit.report._console import Progress, make_console, warn
from tunekit.report._markdown import report_md
from tunekit.report._recommendation import recommendation_yaml
from tunekit.report._summary import RunSummary, summarize
from tunekit.report._tables import console_table, flop_summary, money_summary, trials_csv

__all__ = [
    "RunSummary",
    "summarize",
    "write_outputs",
    "console_table",
    "flop_summary",
    "money_summary",
    "make_console",
    "warn",
    "Progress",
    "type_run",
    "compare_table",
    "cheapest_text",
    "compare_md",
    "compare_json",
    "write_compare",
]


OUTPUTS = ("trials.csv", "recommended.yaml", "report.md", "plots")
"""What a run's outputs are, each a plain file (or, plots, a plain folder) inside the run folder."""


def write_outputs(run_dir: Path, summary: RunSummary, env: dict[str, Any]) -> None:
    """Write trials.csv, recommended.yaml (removed when there is no recommendation), plots/*.png and report.md:
    all of them or none. Everything is rendered first (the plots into a fresh folder beside plots/), so a run whose
    figures cannot be rendered leaves its earlier outputs as they were; then each file is replaced atomically and
    the new plots folder takes the old one's place.

    Raises:
        UsageError: an output path is a symlink, or resolves outside the run folder (tunekit writes nowhere else).
    """
    from tunekit.report.plots import render_all  # matplotlib only when writing

    _refuse_links(run_dir)
    fresh = run_dir / ".plots.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    try:
        csv_text, rec_text = trials_csv(summary), recommendation_yaml(summary)
        title = f"{summary.name} — {summary.device or 'unknown device'} — {summary.date[:10]}"
        plots = render_all(fresh, list(summary.rows), summary.choice, title, summary.min_headroom)
        md_text = report_md(summary, plots, env)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    write_text_atomic(run_dir / "trials.csv", csv_text)
    rec_path = run_dir / "recommended.yaml"
    if rec_text is not None:
        write_text_atomic(rec_path, rec_text)
    else:
        rec_path.unlink(missing_ok=True)
    old = run_dir / ".plots.old"
    shutil.rmtree(old, ignore_errors=True)
    if (run_dir / "plots").exists():
        (run_dir / "plots").rename(old)
    fresh.rename(run_dir / "plots")
    shutil.rmtree(old, ignore_errors=True)
    write_text_atomic(run_dir / "report.md", md_text)


def _refuse_links(run_dir: Path) -> None:
    root = run_dir.resolve()
    paths = [run_dir / name for name in OUTPUTS]
    if (run_dir / "plots").is_dir() and not (run_dir / "plots").is_symlink():
        paths += sorted((run_dir / "plots").iterdir())
    for path in paths:
        if path.is_symlink() or (path.exists() and root not in path.resolve().parents):
            raise UsageError(
                f"{path}: a symlink (to {path.resolve()}); tunekit writes its outputs only inside the "
                f"run folder {run_dir}: replace it with a plain file or folder, or choose another --out"
            )
