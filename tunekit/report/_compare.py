"""``tunekit compare``'s outputs: each machine type's sweep summarized as its report would be, then the comparison
(``analysis.compare``) rendered: the console table, the cheapest type in a sentence, compare.md, compare.png and the
JSON object for machines."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunekit._files import write_text_atomic
from tunekit.analysis import Comparison, TypeFigures, TypeRun
from tunekit.config import Config
from tunekit.env import describe_machine
from tunekit.records import TrialRow
from tunekit.report._summary import summarize

__all__ = ["type_run", "compare_table", "cheapest_text", "compare_md", "compare_json", "write_compare"]

COMPARE_MD = "compare.md"
COMPARE_PNG = "compare.png"


def type_run(
    source: str,
    cfg: Config,
    rows: list[TrialRow],
    *,
    env: Mapping[str, Any] | None,
    strategy: str,
    per_hour: float | None = None,
    machine: Mapping[str, Any] | None = None,
    where: str = "",
) -> TypeRun:
    """One machine type's sweep as the comparison reads it: its knee, machine and disturbances as its report gives
    them (the machine from its env.json and the knee's trial; ``machine``, the one its study records, where it has
    no env.json), its price ``per_hour`` when given, else its config's."""
    summary = summarize(cfg, rows, strategy=strategy, env=dict(env or {}))
    found = summary.machine
    if machine and not env:  # the record's snapshot facts (GPUs, CPU model), the knee's trial's where it has none
        found = {**found, **{k: v for k, v in machine.items() if v is not None}}
    price = per_hour if per_hour is not None else cfg.cost.per_hour
    by = "--per-hour" if per_hour is not None else "cost.per_hour" if price else ""
    return TypeRun(
        source, cfg, summary.choice, found, describe_machine(found), price, by, summary.disturbances, where or source
    )


def _count(value: float | None) -> str:
    """A count in three figures: 412, 41.2 k, 4.12 M."""
    if value is None:
        return "—"
    for factor, prefix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k"), (1.0, "")):
        if abs(value) >= factor:
            return f"{value / factor:#.3g}".rstrip(".") + prefix  # 1.20 M, its last figure kept
    return f"{value:.3g}"


def _ranged(value: float | None, span: tuple[float, float] | None, fmt: Any = _count) -> str:
    if value is None:
        return "—"
    return fmt(value) + (f" ({fmt(span[0])}–{fmt(span[1])})" if span else " (interval unknown)")


def _rate(value: float) -> str:
    return f"{value:.1f}"


def _row(t: TypeFigures) -> dict[str, str]:
    """One type's cells, the same in the console and compare.md."""
    return {
        "type": t.source,
        "machine": t.machine_text,
        "knee": t.knee.knobs.describe() if t.knee is not None else "no knee",
        "rate": _ranged(t.rate, t.rate_range, _rate),
        "per hour": f"{t.per_hour:g}" if t.per_hour else "—",
        "per hour items": _count(t.per_hour_items),
        "per money": _ranged(t.per_money, t.per_money_range),
    }


def _headers(c: Comparison) -> dict[str, str]:
    return {
        "type": "type (run)",
        "machine": "machine",
        "knee": "knee",
        "rate": f"{c.unit}/s (95 %)",
        "per hour": "price/hour",
        "per hour items": f"{c.unit}/hour",
        "per money": f"{c.unit} per unit of money (95 %)",
    }


def compare_table(c: Comparison) -> Any:
    """A rich Table of the types, the cheapest marked, for the console."""
    from rich.table import Table

    table = Table(title=f"{c.name}: {len(c.types)} machine types", show_lines=False)
    for key, header in _headers(c).items():
        table.add_column(header, justify="left" if key in ("type", "machine", "knee") else "right")
    cheapest = c.cheapest.type.source if c.cheapest is not None and c.cheapest.next is not None else None
    if cheapest is not None:
        table.caption = f"★ cheapest per {c.item}"
    for t in c.types:
        cells = _row(t)
        if t.source == cheapest:
            cells["type"] = f"★ {cells['type']}"
        table.add_row(*cells.values())
    return table


def cheapest_text(c: Comparison) -> str:
    """The cheapest type per item in a sentence, with the ratio to the next and whether the intervals settle it."""
    ch, unit = c.cheapest, c.unit
    if ch is None:
        return f"Cheapest per {c.item}: not known: no type has both a knee and a price (cost.per_hour or --per-hour)."
    t = ch.type
    if ch.next is None:
        return (
            f"Only {t.source} is priced with a knee ({_count(t.per_money)} {unit} per unit of money): nothing to set "
            "its cost against."
        )
    lead = (
        f"Cheapest per {c.item}: {t.source} ({t.machine_text}), {_count(t.per_money)} {unit} per unit of money, "
        f"{ch.ratio:.2f}x {ch.next.source}'s {_count(ch.next.per_money)}"
    )
    if ch.overlap is None:
        return lead + "; an interval is unknown, so whether it is cheaper beyond noise is not known."
    if ch.overlap:
        return (
            lead + "; their 95 % intervals overlap, so the cheaper one is not settled: measure the knees more "
            "precisely (trial.precision, selection.repeats) to tell them apart."
        )
    return lead + "; their 95 % intervals do not overlap."


def compare_md(c: Comparison, plot: str | None) -> str:
    """compare.md: the table, the cheapest type, what is left out, the plot and each type's machine."""
    headers = _headers(c)
    lead = f"The knee of each machine type, its rate and {c.unit} per unit of money, with their 95 % intervals."
    out = [f"# tunekit compare: {c.name}", "", lead, ""]
    out += ["| " + " | ".join(headers.values()) + " |", "|" + " --- |" * len(headers)]
    out += ["| " + " | ".join(_row(t).values()) + " |" for t in c.types]
    out += ["", cheapest_text(c), ""]
    out += [f"- {note}." for note in c.notes]
    out += [""] if c.notes else []
    if plot:
        out += [f"![{c.unit}/s and {c.unit} per unit of money per machine type]({plot})", ""]
    out += ["## Machine types", ""]
    for t in c.types:
        price = f"{t.per_hour:g} per hour ({t.priced_by})" if t.per_hour else "not priced"
        out.append(f"- **{t.source}**: {t.machine_text}; {price}. {t.reason}")
    return "\n".join(out) + "\n"


def compare_json(c: Comparison) -> dict[str, Any]:
    """The comparison as plain data (``--json``)."""
    ch = c.cheapest
    return {
        "name": c.name,
        "unit": c.unit,
        "types": [_type_json(t) for t in c.types],
        "cheapest": None
        if ch is None
        else {
            "type": ch.type.source,
            "next": ch.next.source if ch.next is not None else None,
            "ratio": ch.ratio,
            "overlap": ch.overlap,
            "settled": ch.settled,
        },
        "notes": list(c.notes),
    }


def _type_json(t: TypeFigures) -> dict[str, Any]:
    return {
        "type": t.source,
        "run": t.where or t.source,
        "machine": dict(t.machine),
        "machine_text": t.machine_text,
        "knee": t.knee.knobs.to_dict() if t.knee is not None else None,
        "knee_trial": t.knee.number if t.knee is not None else None,
        "reason": t.reason,
        "rate": t.rate,
        "rate_interval": list(t.rate_range) if t.rate_range else None,
        "per_hour": t.per_hour,
        "priced_by": t.priced_by or None,
        "items_per_hour": t.per_hour_items,
        "items_per_money": t.per_money,
        "items_per_money_interval": list(t.per_money_range) if t.per_money_range else None,
    }


def write_compare(out_dir: Path, c: Comparison) -> tuple[Path, Path]:
    """compare.png, then compare.md linking it, each written atomically under ``out_dir``."""
    from tunekit.report.plots import draw_compare  # matplotlib only when writing

    png, md = out_dir / COMPARE_PNG, out_dir / COMPARE_MD
    draw_compare(c, png)
    write_text_atomic(md, compare_md(c, COMPARE_PNG))
    return md, png
