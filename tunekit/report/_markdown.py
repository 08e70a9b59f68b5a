"""report.md: the recommendation and what it rests on (the script's own settings, costs, user knobs, the loop's
parts); the evidence sections below it are ``_evidence``'s."""

from __future__ import annotations

from typing import Any

from tunekit import rules
from tunekit.analysis import pooled
from tunekit.contract import Mode, Stage
from tunekit.records import TrialRow
from tunekit.report._evidence import (
    ceilings_section,
    diagnosis_section,
    environment_section,
    plots_section,
    ranks_section,
    trials_section,
)
from tunekit.report._summary import RunSummary, where_built
from tunekit.report._tables import flop_summary, fmt
from tunekit.report.plots import PlotResult


def report_md(s: RunSummary, plots: list[PlotResult], env: dict[str, Any]) -> str:
    """report.md: recommendation, diagnosis, plots, environment, every trial."""
    out = [
        f"# tunekit report: {s.name}",
        "",
        f"{s.strategy} sweep, {len(s.rows)} trials ({s.failed} failed, {s.skipped} skipped) on "
        f"{s.device or 'unknown device'}, {s.date}.",
        "",
    ]
    for line in s.disturbances:  # first of all: what the figures below cannot be trusted for
        out += [f"**Disturbed:** {line}.", ""]
    if s.stop_reason:
        out += [f"Stopped early: {s.stop_reason}", ""]
    out += ["## Recommendation", "", *_recommendation(s), *_user_knobs(s)]
    out += ["## Diagnosis", "", *diagnosis_section(s)]
    out += [
        "## Plots",
        "",
        *plots_section(plots),
        "## Environment",
        "",
        *environment_section(env, s),
        *trials_section(s),
    ]
    return "\n".join(out) + "\n"


def _recommendation(s: RunSummary) -> list[str]:
    k, best = s.choice.knee, s.choice.best
    if k is None:
        return [s.choice.reason, ""]
    u = s.unit
    # with a price, output per unit of money leads, at the rate that earns it
    lead = (
        f"{s.per_money(k.rate):,.0f} {u} per unit of money at {k.rate:.1f} {u}/s (cost.per_hour {s.per_hour:g}; "
        if s.per_hour
        else f"{k.rate:.1f} {u}/s ("
    )
    keep = "Keep your settings: " if s.choice.kept else ""
    out = [
        f"**{keep}{k.knobs.describe()}** — {lead}trial {k.number}, window noise {k.noise_cv:.1%}).",
        "",
        s.choice.reason,
        "",
    ] + repeats_line(s)
    if best is not None and best is not k:
        out += [
            f"Best measured: {best.knobs.describe()} at {best.rate:.1f} {u}/s (trial "
            f"{best.number}); the knee reaches {s.choice.ratio:.1%} of it.",
            "",
        ]
    if s.defaults is not None:
        dk, kk = s.defaults.knobs, k.knobs
        same = (
            "same batch"
            if (dk.batch_size, dk.grad_accum) == (kk.batch_size, kk.grad_accum)
            else (f"batch {dk.batch_size}" + (f", accumulation {dk.grad_accum}" if dk.grad_accum > 1 else ""))
        )
        out += [
            f"PyTorch defaults (0 workers, no pinning, {same}): {s.defaults.rate:.1f} {u}/s "
            f"(trial {s.defaults.number}); the recommendation is **{s.gain_text(s.defaults)}** that.",
            "",
        ]
    out += _script(s, k) + epoch_parts(k, s.real_epoch_items)
    if k.headroom is not None:
        out += [f"Memory headroom at the knee: {k.headroom:.1%} of {k.measurement.headroom_basis} memory.", ""]
    out += _costs(s)
    per_batch = k.measurement.items_per_batch_mean
    if u != "samples" and per_batch:
        out += [f"Mean {u} per batch at the knee: {per_batch:,.1f} (batch {k.knobs.batch_size}).", ""]
    flops = flop_summary(s)
    return out + ranks_section(s, k) + ceilings_section(s.rows, k, u) + ([flops, ""] if flops else [])


def repeats_line(s: RunSummary) -> list[str]:
    """The configs measured more than once (``selection.repeats``): each one's runs, and the run-to-run spread they
    show, which the band and the gains' intervals include; then each repeat that did not complete, with its
    reason (it adds nothing to the spread, ``analysis.pooled``)."""
    repeated = [r for r in pooled(s.rows) if len(r.runs) > 1]
    lost = [r for r in s.rows if r.run and not r.ok and r.status != "skipped"]
    lines = (
        [
            "Repeats that did not complete, so they add nothing to the run-to-run spread: "
            + "; ".join(
                f"{r.knobs.describe()} (trial {r.number}, run {r.run}): {r.status}"
                + (f", {r.reason}" if r.reason else "")
                for r in lost
            )
            + ".",
            "",
        ]
        if lost
        else []
    )
    if not repeated:
        return lines
    each = "; ".join(
        f"{r.knobs.describe()} (trial {r.number} and its repeats): "
        + ", ".join(f"{x:,.1f}" for x in r.runs)
        + f" {s.unit}/s, mean {r.rate:,.1f} "
        f"± {r.interval or 0:.1%}"
        for r in repeated
    )
    evidence = s.evidence
    collapsed = [f"{r.knobs.describe()} run {k} at {x:,.1f} {s.unit}/s" for r in pooled(s.rows) for k, x in r.collapsed]
    return [
        f"Measured again in alternation on this machine: {each}. The candidates' run-to-run spread, "
        f"{evidence.candidates.describe()}, is in every interval of a rate and of a gain (each at 95 %)"
        + (
            f"; the script's own settings': {evidence.own.describe()}"
            if any(r.stage == Stage.baseline for r in repeated)
            else ""
        )
        + "."
        + (
            f" Set aside as collapsed (below {rules.COLLAPSED:.0%} of the config's fastest other run) and measured "
            f"again: {'; '.join(collapsed)}."
            if collapsed
            else ""
        ),
        "",
        *lines,
    ]


def epoch_parts(row: TrialRow, real_epoch: int | None = None) -> list[str]:
    """A trial measured in its two parts (script mode): the steady rate inside an epoch, what each epoch boundary
    costs, and the rate over whole epochs, which is its figure; with ``real_epoch`` (``script.epoch_items``), the
    rate over epochs of the script's real length as well. A config measured more than once shows its first
    completed run's parts, and says that its figure is its runs' mean (``analysis.pooled``)."""
    m = row.measurement
    if m.rate_whole_epoch is None or m.rate_in_epoch is None or m.boundary_s is None:
        return []
    real = (
        f" Over your real epochs of {real_epoch:,} {row.unit} (script.epoch_items), the same boundary between "
        f"them: {rules.epoch_rate(real_epoch, m.rate_in_epoch, m.boundary_s):,.0f} {row.unit}/s."
        if real_epoch
        else ""
    )
    figure = (
        "the figure the knee is chosen by"
        if len(row.runs) < 2
        else (
            f"its first completed run's; the knee is chosen by its {len(row.runs)} runs' mean, "
            f"{row.rate:,.0f} {row.unit}/s"
        )
    )
    return [
        f"Over whole epochs: {m.rate_in_epoch:,.0f} {row.unit}/s inside an epoch, {m.boundary_s:.1f} s between "
        f"epochs (the script's evaluation, checkpoint and logging, the loader's restart; {m.epoch_boundaries} "
        f"seen), {m.rate_whole_epoch:,.0f} {row.unit}/s over whole epochs of {m.epoch_items:,.0f} {row.unit}: "
        f"{figure}. The window noise is the steady part's alone." + real,
        "",
    ]


def _script(s: RunSummary, k: TrialRow) -> list[str]:
    """Script mode: how to apply the knee, the loader measured, and the gain over the script's own settings."""
    if not s.script_command:
        return []
    import shlex

    loader = k.measurement.loader_measured or {}
    setting = ", ".join(f"{key}={value}" for key, value in s.set_on_loader.items())
    out = [
        f"Apply it: run `{shlex.join(s.script_command)}`"
        + (
            f" and build the training DataLoader with {setting}"
            f"{where_built(s.loader_site)} (or `**tunekit.load_recommended(path).dataloader_kwargs()`)"
            if setting
            else ""
        )
        + ".",
        "",
        f"The loader measured: DataLoader #{loader.get('index')} the script built ({loader.get('found_by')}), "
        f"dataset {loader.get('dataset')} of {loader.get('length')} samples, batch {loader.get('batch_size')}.",
        "",
    ]
    base = s.script_baseline
    if base is not None and base.ok:
        bl = base.measurement.loader_measured or {}
        out += [
            f"The script's own settings ({bl.get('num_workers')} workers, batch {bl.get('batch_size')}, "
            f"pin_memory={bl.get('pin_memory')}): {base.rate:.1f} {s.unit}/s (trial {base.number})"
            + (
                "; they are the recommendation."
                if s.choice.kept
                else f"; the recommendation is **{s.gain_text(base)}** that."
            ),
            "",
        ]
        if bl.get("batch_size") and bl["batch_size"] != k.knobs.batch_size:
            accum = bl["batch_size"] / k.knobs.batch_size
            keep = (
                f"gradient accumulation over {accum:g} batches keeps the effective batch"
                if accum == int(accum) and accum > 1
                else "scale the learning rate with the batch"
            )
            out += [
                f"The knee changes the batch size from the script's {bl['batch_size']} to {k.knobs.batch_size}: "
                f"that changes the optimisation (learning rate, effective batch); {keep}.",
                "",
            ]
    elif base is not None:
        out += [f"The script's own settings did not complete (trial {base.number}: {base.status}: {base.reason}).", ""]
    return out


def _costs(s: RunSummary) -> list[str]:
    """What the knee costs beside the best config, the knee before the user's knobs and PyTorch's defaults: the
    resources a cheaper config saves, as each trial measured them after its warm-up. Loader workers, CPU cores
    busy and host memory (PSS peak over the windows) count all ranks; pinned and reserved device memory are per
    GPU (the largest rank), peaks since the end of warm-up."""
    k = s.choice.knee
    named = [
        ("knee", k),
        ("best", s.choice.best),
        ("knee before your knobs", s.knee_before_extra),
        ("PyTorch defaults", s.defaults),
    ]
    rows = [(name, r) for name, r in named if r is not None]
    rows = [(name, r) for i, (name, r) in enumerate(rows) if all(r.number != other.number for _, other in rows[:i])]
    if len(rows) < 2:
        return []
    gib = 2**30

    def size(v: Any) -> str:
        return "—" if not v or v < 2**20 else f"{v / gib:.2f}"  # under 1 MiB: the allocator's own, not batches

    money = f" {s.unit} per unit of money |" if s.per_hour else ""
    out = [
        f"| config | trial | {s.unit}/s |{money} loader workers | CPU busy (cores) | host memory (GiB) | pinned "
        "memory per GPU (GiB) | device memory reserved per GPU (GiB) |",
        "|" + " --- |" * (9 if money else 8),
    ]
    for name, r in rows:
        m = r.measurement
        per_money = f" {s.per_money(r.rate):,.0f} |" if money else ""
        out.append(
            f"| {name} | {r.number} | {r.rate:.1f} |{per_money} {r.knobs.num_workers * r.knobs.ranks} | "
            f"{fmt(m.cpu_util_cores)} | {size(m.host_mem_peak_bytes)} | {size(m.pinned_peak_bytes)} | "
            f"{size(m.device_mem_peak_reserved_bytes)} |"
        )
    return [*out, ""]


def _user_knobs(s: RunSummary) -> list[str]:
    """The user-defined knobs: each value's best trial side by side, the result-changing ones marked as not
    chosen, and which config keys the recommendation sets."""
    if not s.extra_knobs:
        return []
    u, knee = s.unit, s.choice.knee
    ref = s.knee_before_extra or knee  # each value side by side at these settings, where it was measured there
    out = [
        "## Your knobs",
        "",
        f"| config key | value | changes the training result | trial | {u}/s | workers | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for knob in s.extra_knobs:
        for value in knob.values:
            runs = [
                r
                for r in s.rows
                if r.ok
                and r.mode == Mode.train
                and r.stage != Stage.scaling
                and dict(r.knobs.extra).get(knob.key, knob.baseline) == value
            ]
            same = [
                r for r in runs if ref is not None and r.knobs == ref.knobs.with_extra(knob.key, value, knob.baseline)
            ]
            best = same[0] if same else (max(runs, key=lambda r: r.rate) if runs else None)
            note = "baseline" if value == knob.baseline else ""
            if knob.changes_result and value != knob.baseline:
                note = "reported, not chosen: it changes what training learns; the choice is yours"
            if knee is not None and best is not None and best.number == knee.number:
                note = "the recommendation" + (f"; {note}" if note else "")
            elif best is not None and not same:
                note = "best of its trials" + (f"; {note}" if note else "")
            out.append(
                f"| `{knob.key}` | `{value}` | {'yes' if knob.changes_result else 'no'} | "
                f"{best.number if best else '—'} | {fmt(best.rate if best else None)} | "
                f"{best.knobs.num_workers if best else '—'} | {note} |"
            )
    out.append("")
    if knee is not None and knee.knobs.extra:
        sets = ", ".join(f"`{k}: {v}`" for k, v in knee.knobs.extra)
        out += [f"The recommendation sets {sets} (recommended.yaml's `config:` section): set the same in your job.", ""]
        out += _loop_closed(s, knee)
    skipped = [r for r in s.rows if r.stage == Stage.extra and r.status == "skipped"]
    if skipped:
        out += [f"Skipped: {skipped[0].reason}.", ""]
    return out


def _loop_closed(s: RunSummary, knee: TrialRow) -> list[str]:
    """What the knobs changed: the knee before them (its verdict, throughput and workers) against the knee now."""
    before = s.knee_before_extra
    if before is None or before.number == knee.number:
        return []
    verdict = s.trial_verdicts.get(before.number)
    change = ", ".join(f"{k.removeprefix('workload.')}={v}" for k, v in knee.knobs.extra)
    workers = (
        f"with {knee.knobs.num_workers} workers instead of {before.knobs.num_workers}"
        if knee.knobs.num_workers != before.knobs.num_workers
        else f"with {knee.knobs.num_workers} workers"
    )
    now = s.trial_verdicts.get(knee.number)
    return [
        f"{verdict.name if verdict else 'the knee'} → {change}: {before.rate:.1f} → {knee.rate:.1f} {s.unit}/s "
        f"({knee.rate / before.rate:.2f}×), {workers} (trial {before.number} → trial {knee.number}); the run's "
        f"verdict is now the new knee's{f', {now.name}' if now else ''}.",
        "",
    ]
