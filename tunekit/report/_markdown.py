from __future__ import annotations

from typing import Any

from tunekit import rules
from tunekit.analysis import pooled
from tunekit.contract import Mode, Stage
from tunekit.records import TrialRow, compute_ceiling
from tunekit.report._summary import RunSummary, where_built
from tunekit.report._tables import flop_summary, fmt, rate_or_none, share_text, si
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
    out += ["## Recommendation", "", *_recommendation(s), *_user_knobs(s), "## Diagnosis", "", *_diagnosis(s)]
    out += ["## Plots", "", *_plots(plots), "## Environment", "", *_environment(env, s), *_trials(s)]
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
    return out + _ranks(s, k) + _ceilings(s.rows, k, u) + ([flops, ""] if flops else [])


def repeats_line(s: RunSummary) -> list[str]:
    """The configs measured more than once (``selection.repeats``): each one's runs, and the run-to-run spread they
    show, which the band and the gains' intervals include."""
    repeated = [r for r in pooled(s.rows) if len(r.runs) > 1]
    if not repeated:
        return []
    each = "; ".join(
        f"{r.knobs.describe()} (trial {r.number} and its repeats): "
        + ", ".join(f"{x:,.1f}" for x in r.runs)
        + f" {s.unit}/s, mean {r.rate:,.1f} "
        f"± {r.interval or 0:.1%}"
        for r in repeated
    )
    return [
        f"Measured again in alternation on this machine: {each}. Their run-to-run spread, "
        f"{rules.run_spread(repeated):.1%}, is part of the band and of every gain's interval.",
        "",
    ]


def epoch_parts(row: TrialRow, real_epoch: int | None = None) -> list[str]:
    """A trial measured in its two parts (script mode): the steady rate inside an epoch, what each epoch boundary
    costs, and the rate over whole epochs, which is its figure; with ``real_epoch`` (``script.epoch_items``), the
    rate over epochs of the script's real length as well."""
    m = row.measurement
    if m.rate_whole_epoch is None or m.rate_in_epoch is None or m.boundary_s is None:
        return []
    real = (
        f" Over your real epochs of {real_epoch:,} {row.unit} (script.epoch_items), the same boundary between "
        f"them: {rules.epoch_rate(real_epoch, m.rate_in_epoch, m.boundary_s):,.0f} {row.unit}/s."
        if real_epoch
        else ""
    )
    return [
        f"Over whole epochs: {m.rate_in_epoch:,.0f} {row.unit}/s inside an epoch, {m.boundary_s:.1f} s between "
        f"epochs (the script's evaluation, checkpoint and logging, the loader's restart; {m.epoch_boundaries} "
        f"seen), {m.rate_whole_epoch:,.0f} {row.unit}/s over whole epochs of {m.epoch_items:,.0f} {row.unit}: "
        "the figure the knee is chosen by. The window noise is the steady part's alone." + real,
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


def _ranks(s: RunSummary, k: TrialRow) -> list[str]:
    """A multi-rank knee: workers per rank against the CPUs, per-GPU throughput, scaling, sync, stragglers."""
    n = k.knobs.ranks
    if n < 2:
        return []
    m, u = k.measurement, s.unit
    cpus = m.cpu_count
    out = [
        f"Ranks: {k.knobs.num_workers} workers per rank x {n} ranks = {k.knobs.num_workers * n} loader "
        f"workers{f' on {cpus} CPUs' if cpus else ''} ({m.nodes or 1} node(s)); {k.rate / n:.1f} {u}/s "
        f"per GPU."
    ]
    if s.scaling is not None:
        one = s.scaling.single
        out.append(
            f"Scaling efficiency: **{s.scaling.efficiency:.1%}** — {k.rate:.1f} {u}/s on {n} GPUs against "
            f"{n} x {one.rate:.1f} on one GPU with the same per-rank config (trial {one.number})."
        )
    sync, spread = m.sync_share, m.rank_spread
    if sync is not None:
        out.append(f"Gradient sync: {sync:.1%} of a step (same steps with and without DDP's all-reduce).")
    if spread is not None:
        out.append(
            f"Slowest rank: {m.slowest_rank}, {spread:.1%} below the fastest; data wait "
            f"{fmt(m.data_wait_frac, '.1%')} on average, {fmt(m.data_wait_frac_max, '.1%')} on "
            "the worst rank."
        )
    pinned = [
        p.get("pinned_peak_bytes")
        for p in m.per_rank or []  # each rank's figures, by field name
        if p.get("pinned_peak_bytes") and k.knobs.pin_memory
    ]
    host = m.host_mem_peak_bytes
    if host:
        out.append(
            f"Host memory (PSS of every rank and worker): {host / 2**30:.1f} GiB"
            + (f"; pinned memory per rank up to {max(pinned) / 2**30:.2f} GiB." if pinned else ".")
        )
    return [" ".join(out), ""]


def _ceilings(rows: tuple[TrialRow, ...], k: TrialRow, u: str) -> list[str]:
    ceiling = compute_ceiling(rows, k.knobs.batch_size)
    compute = [ceiling] if ceiling is not None else []
    loader = [
        r
        for r in rows
        if r.ok
        and r.mode == Mode.loader
        and r.knobs.num_workers == k.knobs.num_workers
        and r.knobs.batch_size == k.knobs.batch_size
    ]
    if not (compute or loader):
        return []
    parts = []
    if compute:
        parts.append(f"compute ceiling {compute[0].rate:.1f} {u}/s (model on a staged batch)")
    if loader:
        parts.append(f"loader ceiling {loader[0].rate:.1f} {u}/s at {k.knobs.num_workers} workers")
    lowest = min(r.rate for r in compute + loader)
    per_rank = " per rank" if k.knobs.ranks > 1 else ""  # the ceilings are one GPU's and one rank's loader
    return [
        f"Ceilings at this batch: {'; '.join(parts)}. The knee reaches {k.rate / k.knobs.ranks / lowest:.0%} of "
        f"the lower one{per_rank}.",
        "",
    ]


def _diagnosis(s: RunSummary) -> list[str]:
    if s.verdicts:
        out = [
            f"- **{v.name}**{' (trial ' + str(v.trial) + ')' if v.trial is not None else ''}: "
            f"{v.sentence().split(': ', 1)[1]}"
            for v in s.verdicts
        ] + [""]
    else:
        out = ["No verdict: there is no knee to diagnose and the run shows no run-wide bound.", ""]
    if s.warnings:
        out += ["Environment warnings:", ""] + [f"- {w}" for w in s.warnings] + [""]
    trial_notes = _trial_warnings(s.rows)
    if trial_notes:
        out += ["Trial warnings:", ""] + [f"- {w}" for w in trial_notes] + [""]
    return out


def _trial_warnings(rows: tuple[TrialRow, ...]) -> list[str]:
    """What trials flagged about the data (unsharded iterable workers) and epochs that ended inside them."""
    out = []
    for r in rows:
        out += [f"trial {r.number}: {w}" for w in r.measurement.warnings or []]
        if r.measurement.epochs_ended:
            kept = (r.measurement.loader_measured or {}).get("persistent_workers")
            cost = (
                "its workers persist, and each refill of their queues for the next epoch is"
                if kept
                else "each restart of its workers is"
            )
            whole = (
                f"; its windows held whole epochs of {r.measurement.epoch_batches} batches"
                if r.measurement.epoch_batches
                else ""
            )
            out.append(
                f"trial {r.number}: the loader's epoch ended {r.measurement.epochs_ended} time(s) inside "
                f"the trial; {cost} part of the measurement{whole}"
            )
    return out


def _plots(plots: list[PlotResult]) -> list[str]:
    out: list[str] = []
    for plot in plots:
        if plot.path:
            out += [f"### {plot.title}", "", f"![{plot.title}]({plot.path})", ""]
    skipped = [p for p in plots if not p.path]
    if skipped:
        out += ["Not drawn, for lack of data:", ""] + [f"- {p.title}: {p.reason}." for p in skipped] + [""]
    return out


def _environment(env: dict[str, Any], s: RunSummary) -> list[str]:
    peaks = [_peak_line(p) for p in s.peaks]
    if not env:
        return ["No env.json in this run.", *peaks, ""]
    pk, cpu, mem = env.get("packages") or {}, env.get("cpu") or {}, env.get("memory") or {}
    out = [
        f"- host: {env.get('hostname')}, {cpu.get('usable', cpu.get('affinity') or cpu.get('logical'))} usable "
        f"CPUs ({cpu.get('model')}), {(mem.get('total_bytes') or 0) / 2**30:.1f} GiB RAM",
        f"- Python {env.get('python')}, torch {pk.get('torch')} (CUDA build {env.get('torch_cuda_build')}), "
        f"torchvision {pk.get('torchvision')}, tunekit {env.get('tunekit')}",
    ]
    nvml = env.get("nvml") or {}
    if nvml.get("available"):
        out.append(f"- NVIDIA driver {nvml.get('driver_version')}, CUDA driver API {nvml.get('cuda_driver_version')}")
    for gpu in env.get("gpus") or []:
        memory = gpu.get("memory") or {}
        out.append(
            f"- GPU {gpu.get('index')}: {gpu.get('name')}, {(memory.get('total_bytes') or 0) / 2**30:.1f} GiB, "
            f"other processes at sweep start: {len(gpu.get('processes') or [])}"
        )
    for pair in nvml.get("interconnect") or []:
        i, j = pair.get("gpus") or ("?", "?")
        out.append(
            f"- GPUs {i} and {j}: {'NVLink' if pair.get('nvlink') else 'PCIe'} "
            f"({pair.get('pcie_path') or 'path unknown'} without it)"
        )
    return out + peaks + [""]


def _peak_line(peak: dict[str, Any]) -> str:
    """One matmul probe of the run: the measured figure, the datasheet's beside it."""
    where = f"{peak.get('device_name')} ({peak.get('device')}), measured in trial {peak.get('trial')}"
    if peak.get("flops") is None:
        return f"- matmul peak in {peak.get('precision')}: not measured on {where}: {peak.get('reason')}"
    sheet = peak.get("datasheet_flops")
    return (
        f"- matmul peak in {peak.get('precision')}: {si(peak['flops'], 'FLOP/s')} sustained on {where}; datasheet "
        + (si(sheet, "FLOP/s") if sheet else "not listed for this device")
    )


def _trials(s: RunSummary) -> list[str]:
    if any(r.knobs.ranks > 1 for r in s.rows):  # multi-GPU runs: workers are per rank, and ranks a column
        return _trials_ranks(s)
    out = [
        "## Trials",
        "",
        "| # | stage | mode | workers | prefetch | pin | batch | accum | compile | status | "
        f"{s.unit}/s | {s.unit}/$ | of matmul peak | noise | data wait | NVML util | headroom | verdict |",
        "|" + " --- |" * 18,
    ]
    for r in sorted(s.rows, key=lambda r: r.number):
        k = r.knobs
        status = r.status if r.ok else f"{r.status}: {r.reason}"
        verdict = s.trial_verdicts.get(r.number)
        out.append(
            f"| {r.number} | {r.stage} | {r.mode} | {k.num_workers} | {k.prefetch_factor or '—'} | "
            f"{'yes' if k.pin_memory else 'no'} | {k.batch_size} | {k.grad_accum} | {k.compile} | "
            f"{status.replace('|', '/')} | {fmt(rate_or_none(r))} | "
            f"{fmt(s.per_money(rate_or_none(r)), ',.0f')} | {share_text(s.flop_share(r))} | "
            f"{fmt(r.noise_cv, '.1%')} | {fmt(r.measurement.data_wait_frac, '.1%')} | "
            f"{fmt(r.measurement.nvml_util_gpu_pct, '.0f')} | {fmt(r.headroom, '.1%')} | "
            f"{verdict.name if verdict else '—'} |"
        )
    return out


def _trials_ranks(s: RunSummary) -> list[str]:
    out = [
        "## Trials",
        "",
        "| # | stage | mode | ranks | workers per rank | prefetch | pin | batch | accum | "
        f"compile | status | {s.unit}/s | {s.unit}/s per GPU | of matmul peak | noise | data wait | sync | "
        "headroom | verdict |",
        "|" + " --- |" * 19,
    ]
    for r in sorted(s.rows, key=lambda r: r.number):
        k = r.knobs
        status = r.status if r.ok else f"{r.status}: {r.reason}"
        verdict = s.trial_verdicts.get(r.number)
        rate = rate_or_none(r)
        out.append(
            f"| {r.number} | {r.stage} | {r.mode} | {k.ranks} | {k.num_workers} | {k.prefetch_factor or '—'} | "
            f"{'yes' if k.pin_memory else 'no'} | {k.batch_size} | {k.grad_accum} | {k.compile} | "
            f"{status.replace('|', '/')} | {fmt(rate)} | {fmt(None if rate is None else rate / k.ranks)} | "
            f"{share_text(s.flop_share(r))} | {fmt(r.noise_cv, '.1%')} | "
            f"{fmt(r.measurement.data_wait_frac, '.1%')} | {fmt(r.measurement.sync_share, '.1%')} | "
            f"{fmt(r.headroom, '.1%')} | {verdict.name if verdict else '—'} |"
        )
    return out
