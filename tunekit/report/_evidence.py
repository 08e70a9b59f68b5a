"""report.md's evidence sections: the ranks, the ceilings, the diagnosis and trial warnings, the plots, the
environment and every trial."""

from __future__ import annotations

from typing import Any

from tunekit.contract import Mode
from tunekit.records import TrialRow, compute_ceiling
from tunekit.report._summary import RunSummary
from tunekit.report._tables import fmt, rate_or_none, share_text, si
from tunekit.report.plots import PlotResult


def ranks_section(s: RunSummary, k: TrialRow) -> list[str]:
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


def ceilings_section(rows: tuple[TrialRow, ...], k: TrialRow, u: str) -> list[str]:
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


def diagnosis_section(s: RunSummary) -> list[str]:
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


def plots_section(plots: list[PlotResult]) -> list[str]:
    out: list[str] = []
    for plot in plots:
        if plot.path:
            out += [f"### {plot.title}", "", f"![{plot.title}]({plot.path})", ""]
    skipped = [p for p in plots if not p.path]
    if skipped:
        out += ["Not drawn, for lack of data:", ""] + [f"- {p.title}: {p.reason}." for p in skipped] + [""]
    return out


def environment_section(env: dict[str, Any], s: RunSummary) -> list[str]:
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


def trials_section(s: RunSummary) -> list[str]:
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
