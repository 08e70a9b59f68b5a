"""The data of compare.png (``tunekit compare``): per machine type, its knee's rate and its items per unit of money,
each with its 95 % interval; :func:`._draw.draw_compare` only renders it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tunekit.analysis import Comparison


class Bar(NamedTuple):
    label: str
    """The type (its run)."""
    value: float | None
    """None: not measured (no knee) or, for items per money, not priced; ``missing`` says which."""
    low: float | None
    high: float | None
    cheapest: bool = False
    missing: str = ""


@dataclass(frozen=True)
class ComparePlot:
    """Two panels over the machine types: the knee's rate and the items per unit of money, with interval bars."""

    title: str
    unit: str
    rates: tuple[Bar, ...]
    per_money: tuple[Bar, ...]
    note: str
    """What the bars of the second panel left out, or whether the cheapest is settled."""


def compare_data(c: Comparison) -> ComparePlot:
    """The plot of a comparison: a bar per type in each panel, in the order given."""
    ch = c.cheapest
    cheapest = ch.type.source if ch is not None and ch.next is not None else None
    rates, money = [], []
    for t in c.types:
        rr, mr = t.rate_range, t.per_money_range
        missing = "no knee" if t.knee is None else "not priced"
        rates.append(Bar(t.source, t.rate, rr[0] if rr else None, rr[1] if rr else None, missing=missing))
        money.append(
            Bar(t.source, t.per_money, mr[0] if mr else None, mr[1] if mr else None, t.source == cheapest, missing)
        )
    if ch is None or cheapest is None:
        note = "no two priced types to compare"
    elif ch.overlap is None:
        note = "cheaper not settled: an interval is unknown"
    else:
        note = "cheaper not settled: the intervals overlap" if ch.overlap else "cheaper settled: no overlap"
    return ComparePlot(f"{c.name}: the knee per machine type", c.unit, tuple(rates), tuple(money), note)
