from __future__ import annotations

import io
from typing import Any

from tunekit.analysis import trials_frame
from tunekit.report._summary import RunSummary


def fmt(v: Any, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


def rate_or_none(row: Any) -> float | None:
    return row.rate if row.ok else None


def trials_csv(s: RunSummary) -> str:
    """trials.csv: one row per trial with its verdict, the verdict's evidence and its items (of ``unit``) per unit
    of money."""
    verdicts = s.trial_verdicts
    extra = {r.number: {"verdict": verdicts[r.number].name if r.number in verdicts else None,
                        "verdict_evidence": "; ".join(f"{k} {v}" for k, v in verdicts[r.number].evidence.items())
                        if r.number in verdicts else None,
                        "items_per_money": s.per_money(rate_or_none(r))} for r in s.rows}
    buf = io.StringIO()
    trials_frame(list(s.rows), extra, {k.key: k.baseline for k in s.extra_knobs}).to_csv(buf, index=False)
    return buf.getvalue()


def console_table(s: RunSummary) -> Any:
    """A rich Table of the trials, knee and best marked, for the console."""
    from rich.table import Table

    table = Table(title=f"{s.name}: {len(s.rows)} trials", show_lines=False)
    ranks = any(r.knobs.ranks > 1 for r in s.rows)
    columns = ("#", "stage", *(("ranks",) if ranks else ()), "workers", "pf", "pin", "batch", "accum", "compile",
               "status", f"{s.unit}/s", "noise", "wait")
    for col in columns:
        table.add_column(col, justify="right" if col not in ("stage", "status", "compile") else "left")
    knee, best = s.choice.knee, s.choice.best
    for r in sorted(s.rows, key=lambda r: r.number):
        mark = " ◀ knee" if knee is not None and r.number == knee.number else ""
        mark += " ★ best" if best is not None and r.number == best.number and r is not knee else ""
        k = r.knobs
        table.add_row(str(r.number), r.stage, *((str(k.ranks),) if ranks else ()), str(k.num_workers),
                      str(k.prefetch_factor or "-"),
                      "y" if k.pin_memory else "n", str(k.batch_size), str(k.grad_accum), k.compile,
                      (r.status if r.ok else f"{r.status}: {r.reason[:40]}") + mark, fmt(rate_or_none(r)),
                      fmt(r.noise_cv, ".1%"), fmt(r.measurement.data_wait_frac, ".0%"))
    return table
