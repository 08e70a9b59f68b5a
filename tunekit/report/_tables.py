from __future__ import annotations

import io
from typing import Any

from tunekit import rules
from tunekit.analysis import trials_frame
from tunekit.records import compute_ceiling
from tunekit.report._summary import RunSummary


def fmt(v: Any, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


def rate_or_none(row: Any) -> float | None:
    return row.rate if row.ok else None


def share_text(share: float | None) -> str:
    """A model FLOP share as a percentage ("—" when unknown; a share the percentage would round to 0 says so)."""
    if share is None:
        return "—"
    return "<0.1%" if share < 0.001 else f"{share:.1%}"


def si(value: float, unit: str) -> str:
    """``value`` with an SI prefix: 24.6 GFLOP, 712.4 TFLOP/s."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.1f} {prefix}{unit}"
    return f"{value:.1f} {unit}"


def flop_summary(s: RunSummary) -> str | None:
    """One sentence: the knee's and its compute ceiling's share of the device's measured matmul peak (model FLOP
    utilisation), the FLOPs per item and the peak with the datasheet's figure beside it; or why the share is not
    known. None without a knee, and for a run recorded before trials counted FLOPs."""
    k = s.choice.knee
    if k is None:
        return None
    ceiling = compute_ceiling(s.rows, k.knobs.batch_size)
    flops, peak = rules.flops_per_item(k, s.rows), s.peak(k)
    reason = k.measurement.flops_reason or (ceiling.measurement.flops_reason if ceiling is not None else None)
    if flops is None and peak is None and not s.peaks and reason is None:
        return None
    if peak is None:
        why = next((p["reason"] for p in s.peaks if p.get("reason")), None) or "no trial measured it"
        return f"Model FLOP utilisation: not known: no matmul peak of this device ({why})."
    if not flops:
        return f"Model FLOP utilisation: not known: the model's FLOPs were not counted ({reason or 'no count'})."
    shares = [f"the knee {share_text(s.flop_share(k))}{' per GPU' if k.knobs.ranks > 1 else ''}"]
    if ceiling is not None and ceiling is not k and s.flop_share(ceiling) is not None:
        shares.append(f"its compute ceiling (batch {k.knobs.batch_size}) {share_text(s.flop_share(ceiling))}")
    sheet = f"; datasheet {si(peak.datasheet_flops, 'FLOP/s')}" if peak.datasheet_flops else ""
    # items counted by the workload (tokens, say) are not the positions the model computes on: a padded batch's
    # padding is work too, so the count per item is of executed FLOPs, and it varies with the batch it was taken on
    executed = (
        ", on one batch, its padding's work included: shares of executed FLOPs, above the useful share "
        "by the batches' padding"
        if s.counted
        else ""
    )
    ratio = rules.flops_uncertain(k, s.rows)
    low, high = rules.FLOP_BACKWARD_BAND
    uncertain = (
        f" **Uncertain**: the count's backward is {ratio:.1f}x its forward, where a model of matrix "
        f"multiplies and convolutions gives {low:g}-{high:g}x (an op the counter miscounts, or frozen "
        "layers); the share decides no fix."
        if ratio is not None
        else ""
    )
    return (
        f"Model FLOP utilisation: {', '.join(shares)} of this device's measured matmul peak ({si(flops, 'FLOP')} "
        f"per {k.item}, forward and backward, counted with FlopCounterMode, grouped convolutions' backward "
        f"corrected{executed}; peak {si(peak.flops, 'FLOP/s')} in {peak.precision}, trial {peak.trial}{sheet})."
        + uncertain
    )


def money_summary(s: RunSummary) -> str | None:
    """With ``cost.per_hour``: the knee's items per unit of money at its rate, beside the best config's and the
    PyTorch defaults'. None without a price or a knee."""
    k = s.choice.knee
    if k is None or not s.per_hour:
        return None
    u = s.unit
    others = [
        f"{name} {s.per_money(r.rate):,.0f}"
        for name, r in (("best", s.choice.best), ("defaults", s.defaults))
        if r is not None and r.number != k.number
    ]
    return (
        f"{s.per_money(k.rate):,.0f} {u} per unit of money at {k.rate:.1f} {u}/s (cost.per_hour "
        f"{s.per_hour:g})" + (f"; {', '.join(others)}" if others else "") + "."
    )


def trials_csv(s: RunSummary) -> str:
    """trials.csv: one row per trial with its verdict, the verdict's evidence, its items (of ``unit``) per unit of
    money and its model's share of the device's measured matmul peak (``flop_share``)."""
    verdicts = s.trial_verdicts
    extra = {
        r.number: {
            "verdict": verdicts[r.number].name if r.number in verdicts else None,
            "verdict_evidence": "; ".join(f"{k} {v}" for k, v in verdicts[r.number].evidence.items())
            if r.number in verdicts
            else None,
            "items_per_money": s.per_money(rate_or_none(r)),
            "flop_share": s.flop_share(r),
        }
        for r in s.rows
    }
    buf = io.StringIO()
    trials_frame(list(s.rows), extra, {k.key: k.baseline for k in s.extra_knobs}).to_csv(buf, index=False)
    return buf.getvalue()


def console_table(s: RunSummary) -> Any:
    """A rich Table of the trials, knee and best marked, for the console."""
    from rich.table import Table

    table = Table(title=f"{s.name}: {len(s.rows)} trials", show_lines=False)
    ranks = any(r.knobs.ranks > 1 for r in s.rows)
    columns = (
        "#",
        "stage",
        *(("ranks",) if ranks else ()),
        "workers",
        "pf",
        "pin",
        "batch",
        "accum",
        "compile",
        "status",
        f"{s.unit}/s",
        "noise",
        "wait",
    )
    for col in columns:
        table.add_column(col, justify="right" if col not in ("stage", "status", "compile") else "left")
    knee, best = s.choice.knee, s.choice.best
    for r in sorted(s.rows, key=lambda r: r.number):
        mark = " ◀ knee" if knee is not None and r.number == knee.number else ""
        mark += (
            " ★ best"
            if best is not None and r.number == best.number and (knee is None or knee.number != best.number)
            else ""
        )
        k = r.knobs
        table.add_row(
            str(r.number),
            r.stage,
            *((str(k.ranks),) if ranks else ()),
            str(k.num_workers),
            str(k.prefetch_factor or "-"),
            "y" if k.pin_memory else "n",
            str(k.batch_size),
            str(k.grad_accum),
            k.compile,
            (r.status if r.ok else f"{r.status}: {r.reason[:40]}") + mark,
            fmt(rate_or_none(r)),
            fmt(r.noise_cv, ".1%"),
            fmt(r.measurement.data_wait_frac, ".0%"),
        )
    return table
