"""A run's outputs, rebuilt from its finished trials: trials.csv, recommended.yaml, plots, report.md, and the
console table.

Compute, then render: :func:`summarize` turns rows into a :class:`RunSummary`; every writer only formats it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunekit._files import write_text_atomic
from tunekit.report._markdown import report_md
from tunekit.report._recommendation import recommendation_yaml
from tunekit.report._summary import RunSummary, summarize
from tunekit.report._tables import console_table, trials_csv

__all__ = ["RunSummary", "summarize", "write_outputs", "console_table"]


def write_outputs(run_dir: Path, summary: RunSummary, env: dict[str, Any]) -> None:
    """Write trials.csv, recommended.yaml (removed when there is no recommendation), plots/*.png and report.md,
    each atomically."""
    from tunekit.report.plots import render_all  # matplotlib only when writing

    write_text_atomic(run_dir / "trials.csv", trials_csv(summary))
    rec_path = run_dir / "recommended.yaml"
    text = recommendation_yaml(summary)
    if text is not None:
        write_text_atomic(rec_path, text)
    else:
        rec_path.unlink(missing_ok=True)
    title = f"{summary.name} — {summary.device or 'unknown device'} — {summary.date[:10]}"
    plots = render_all(run_dir, list(summary.rows), summary.choice, title, summary.min_headroom)
    write_text_atomic(run_dir / "report.md", report_md(summary, plots, env))
