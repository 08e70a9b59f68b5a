"""A run's outputs, rebuilt from its finished trials: trials.csv, recommended.yaml, report.md, console summary.

Compute, then render: :func:`summarize` turns rows into a :class:`RunSummary`; the writers only format it.
``tunekit report RUN_DIR`` calls :func:`rebuild`, which reads the study and re-runs nothing.
"""

from __future__ import annotations

import datetime as _dt
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tunekit.analysis import Knee, TrialRow, defaults_trial, describe_knobs, select_knee, trials_frame
from tunekit.config import Config
from tunekit.contract import read_json, write_text_atomic
from tunekit.diagnosis import Verdict, run_verdicts, trial_verdicts
from tunekit.recommended import recommendation_dict

__all__ = ["RunSummary", "summarize", "write_outputs", "rebuild", "summary_table"]

_SELECTED_STAGES = ("end_to_end", "prefetch", "batch", "compile", "grid")


@dataclass(frozen=True)
class RunSummary:
    """What a run found: the knee over its end-to-end trials, and the PyTorch-defaults baseline."""

    name: str
    strategy: str
    knee: Knee
    defaults: TrialRow | None
    trials: int
    failed: int
    device: str | None
    versions: dict[str, Any]
    date: str
    stop_reason: str = ""
    verdicts: tuple[Verdict, ...] = ()
    trial_verdicts: dict[int, Verdict] | None = None
    per_hour: float | None = None
    warnings: tuple[str, ...] = ()

    def per_dollar(self, samples_per_s: float | None) -> float | None:
        """Samples per unit of money at ``cost.per_hour``, or None without a price."""
        return None if not self.per_hour or samples_per_s is None else samples_per_s * 3600 / self.per_hour

    @property
    def speedup_vs_defaults(self) -> float | None:
        if self.knee.knee is None or self.defaults is None or not self.defaults.samples_per_s:
            return None
        return float(self.knee.knee.samples_per_s or 0) / self.defaults.samples_per_s


def _select(cfg: Config, rows: list[TrialRow]) -> Knee:
    """The knee; with target_effective_batch, only among trials that reach that effective batch."""
    target = cfg.search.target_effective_batch
    if not target:
        return select_knee([r for r in rows if r.stage in _SELECTED_STAGES], cfg.selection)
    accumulation = [r for r in rows if r.stage == "accumulation" and r.ok
                    and (r.headroom is None or r.headroom >= cfg.selection.min_headroom)]
    if accumulation:  # same loader settings, different micro-batch x steps: the fastest wins
        best = max(accumulation, key=lambda r: r.samples_per_s or 0.0)
        return Knee(best, best, 1.0, None,
                    f"Effective batch {target} is reached fastest with micro-batch {best.knobs.batch_size} x "
                    f"{best.knobs.grad_accum} accumulation steps ({best.samples_per_s:.1f} samples/s).",
                    tuple(accumulation))
    reaching = [r for r in rows if r.stage in _SELECTED_STAGES and r.knobs.effective_batch == target]
    if not any(r.ok for r in reaching):
        return Knee(None, None, None, None,
                    f"No recommendation: no completed trial reaches search.target_effective_batch = {target}.")
    return select_knee(reaching, cfg.selection)


def summarize(cfg: Config, rows: list[TrialRow], *, strategy: str, stop_reason: str = "",
              date: str | None = None, env: dict[str, Any] | None = None,
              warnings: tuple[str, ...] = ()) -> RunSummary:
    knee = _select(cfg, rows)
    defaults = defaults_trial(rows, knee.knee) if knee.knee else None
    ref = knee.knee or knee.best or next((r for r in rows if r.ok), None)
    m = ref.measurement if ref else {}
    sel = cfg.selection
    per_trial = trial_verdicts(rows, min_headroom=sel.min_headroom, tolerance=sel.tolerance)
    return RunSummary(
        name=cfg.name, strategy=strategy, knee=knee, defaults=defaults, trials=len(rows),
        failed=sum(1 for r in rows if not r.ok and r.status != "skipped"), device=m.get("device_name"),
        versions=m.get("versions") or {},
        date=date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), stop_reason=stop_reason,
        verdicts=tuple(run_verdicts(rows, knee.knee, min_headroom=sel.min_headroom, tolerance=sel.tolerance, env=env,
                                    per_trial=per_trial)),
        trial_verdicts=per_trial,
        per_hour=cfg.cost.per_hour, warnings=tuple(warnings),
    )


def _evidence(s: RunSummary) -> dict[str, Any]:
    knee, best = s.knee.knee, s.knee.best
    assert knee is not None and best is not None
    m = knee.measurement
    return {
        "samples_per_s": round(float(knee.samples_per_s or 0), 2),
        "best_samples_per_s": round(float(best.samples_per_s or 0), 2),
        "ratio": round(float(s.knee.ratio or 0), 4),
        "best_config": best.knobs.to_dict(),
        "defaults_samples_per_s": round(float(s.defaults.samples_per_s or 0), 2) if s.defaults else None,
        "speedup_vs_defaults": round(s.speedup_vs_defaults, 3) if s.speedup_vs_defaults else None,
        "headroom": round(float(knee.headroom), 4) if knee.headroom is not None else None,
        "headroom_basis": m.get("headroom_basis"),
        "noise_cv": round(knee.noise_cv, 4),
        "within": round(float(s.knee.threshold or 0), 4),
        "data_wait_frac": m.get("data_wait_frac"),
        "gpu_busy_frac": m.get("gpu_busy_frac"),
        "samples_per_dollar": round(s.per_dollar(knee.samples_per_s), 1) if s.per_hour else None,
        "verdict": s.verdicts[0].name if s.verdicts else None,
        "diagnosis": [v.sentence() for v in s.verdicts],
        "reason": s.knee.reason,
        "device": s.device,
        "versions": s.versions,
        "date": s.date,
        "run": {"name": s.name, "strategy": s.strategy, "trials": s.trials, "knee_trial": knee.number},
    }


def write_outputs(run_dir: Path, cfg: Config, rows: list[TrialRow], summary: RunSummary,
                  env: dict[str, Any]) -> None:
    """Write trials.csv, recommended.yaml (removed when there is no recommendation), plots/*.png and report.md,
    each atomically."""
    buf = io.StringIO()
    verdicts = summary.trial_verdicts or {}
    extra = {r.number: {"verdict": verdicts[r.number].name if r.number in verdicts else None,
                        "verdict_evidence": "; ".join(f"{k} {v}" for k, v in verdicts[r.number].evidence.items())
                        if r.number in verdicts else None,
                        "samples_per_dollar": summary.per_dollar(r.samples_per_s)} for r in rows}
    trials_frame(rows, extra).to_csv(buf, index=False)
    write_text_atomic(run_dir / "trials.csv", buf.getvalue())
    rec_path = run_dir / "recommended.yaml"
    if summary.knee.knee is not None:
        data = recommendation_dict(summary.knee.knee.knobs.to_dict(), _evidence(summary))
        header = (f"# tunekit recommendation for {summary.name} on {summary.device} ({summary.date}).\n"
                  "# Load it with: tunekit.load_recommended(path).dataloader_kwargs()\n")
        write_text_atomic(rec_path, header + yaml.safe_dump(data, sort_keys=False))
    else:
        rec_path.unlink(missing_ok=True)
    from tunekit.plots import render_all

    title = f"{summary.name} — {summary.device or 'unknown device'} — {summary.date[:10]}"
    plots = render_all(run_dir, rows, summary.knee, title, cfg.selection.min_headroom)
    write_text_atomic(run_dir / "report.md", _report_md(rows, summary, plots, env))


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


def _recommendation_md(rows: list[TrialRow], s: RunSummary) -> list[str]:
    if s.knee.knee is None:
        return [s.knee.reason, ""]
    k, best = s.knee.knee, s.knee.best
    cost = f", {s.per_dollar(k.samples_per_s):,.0f} samples per unit of money" if s.per_hour else ""
    out = [f"**{describe_knobs(k.knobs)}** — {k.samples_per_s:.1f} samples/s{cost} (trial {k.number}, window noise "
           f"{k.noise_cv:.1%}).", "", s.knee.reason, ""]
    if best is not None and best is not k:
        out += [f"Best measured: {describe_knobs(best.knobs)} at {best.samples_per_s:.1f} samples/s (trial "
                f"{best.number}); the knee reaches {s.knee.ratio:.1%} of it.", ""]
    if s.defaults is not None:
        dk, kk = s.defaults.knobs, s.knee.knee.knobs
        same = "same batch" if (dk.batch_size, dk.grad_accum) == (kk.batch_size, kk.grad_accum) else (
            f"batch {dk.batch_size}" + (f", accumulation {dk.grad_accum}" if dk.grad_accum > 1 else ""))
        out += [f"PyTorch defaults (0 workers, no pinning, {same}): {s.defaults.samples_per_s:.1f} samples/s "
                f"(trial {s.defaults.number}); the recommendation is **{s.speedup_vs_defaults:.2f}×** that.", ""]
    if k.headroom is not None:
        out += [f"Memory headroom at the knee: {k.headroom:.1%} of {k.measurement.get('headroom_basis')} memory.", ""]
    compute = [r for r in rows if r.ok and r.mode == "compute" and r.knobs.batch_size == k.knobs.batch_size]
    loader = [r for r in rows if r.ok and r.mode == "loader" and r.knobs.num_workers == k.knobs.num_workers
              and r.knobs.batch_size == k.knobs.batch_size]
    if compute or loader:
        parts = []
        if compute:
            parts.append(f"compute ceiling {compute[0].samples_per_s:.1f} samples/s (model on a staged batch)")
        if loader:
            parts.append(f"loader ceiling {loader[0].samples_per_s:.1f} samples/s at {k.knobs.num_workers} workers")
        lowest = min(float(r.samples_per_s or 0) for r in compute + loader)
        out += [f"Ceilings at this batch: {'; '.join(parts)}. The knee reaches {k.samples_per_s / lowest:.0%} of the "
                "lower one.", ""]
    return out


def _environment_md(env: dict[str, Any]) -> list[str]:
    if not env:
        return ["No env.json in this run.", ""]
    pk, cpu, mem = env.get("packages") or {}, env.get("cpu") or {}, env.get("memory") or {}
    out = [f"- host: {env.get('hostname')}, {cpu.get('usable', cpu.get('affinity') or cpu.get('logical'))} usable "
           f"CPUs ({cpu.get('model')}), {(mem.get('total_bytes') or 0) / 2**30:.1f} GiB RAM",
           f"- Python {env.get('python')}, torch {pk.get('torch')} (CUDA build {env.get('torch_cuda_build')}), "
           f"torchvision {pk.get('torchvision')}, tunekit {env.get('tunekit')}"]
    nvml = env.get("nvml") or {}
    if nvml.get("available"):
        out.append(f"- NVIDIA driver {nvml.get('driver_version')}, CUDA driver API {nvml.get('cuda_driver_version')}")
    for gpu in env.get("gpus") or []:
        memory = gpu.get("memory") or {}
        out.append(f"- GPU {gpu.get('index')}: {gpu.get('name')}, {(memory.get('total_bytes') or 0) / 2**30:.1f} GiB, "
                   f"other processes at sweep start: {len(gpu.get('processes') or [])}")
    return out + [""]


def _report_md(rows: list[TrialRow], s: RunSummary, plots: list[Any], env: dict[str, Any]) -> str:
    verdicts = s.trial_verdicts or {}
    out = [f"# tunekit report: {s.name}", "",
           f"{s.strategy} sweep, {s.trials} trials ({s.failed} failed, "
           f"{sum(1 for r in rows if r.status == 'skipped')} skipped) on {s.device or 'unknown device'}, {s.date}.",
           ""]
    if s.stop_reason:
        out += [f"Stopped early: {s.stop_reason}", ""]
    out += ["## Recommendation", "", *_recommendation_md(rows, s), "## Diagnosis", ""]
    if s.verdicts:
        out += [f"- **{v.name}**{' (trial ' + str(v.trial) + ')' if v.trial is not None else ''}: "
                f"{v.sentence().split(': ', 1)[1]}" for v in s.verdicts] + [""]
    else:
        out += ["No verdict: the trials show no clear bound.", ""]
    if s.warnings:
        out += ["Environment warnings:", ""] + [f"- {w}" for w in s.warnings] + [""]
    out += ["## Plots", ""]
    for plot in plots:
        if plot.path:
            out += [f"### {plot.title}", "", f"![{plot.title}]({plot.path})", ""]
    skipped = [p for p in plots if not p.path]
    if skipped:
        out += ["Not drawn, for lack of data:", ""] + [f"- {p.title}: {p.reason}." for p in skipped] + [""]
    out += ["## Environment", "", *_environment_md(env)]
    out += ["## Trials", "", "| # | stage | mode | workers | prefetch | pin | batch | accum | compile | status | "
            "samples/s | samples/$ | noise | data wait | NVML util | headroom | verdict |", "|" + " --- |" * 17]
    for r in sorted(rows, key=lambda r: r.number):
        k = r.knobs
        status = r.status if r.ok else f"{r.status}: {r.reason}"
        out.append(f"| {r.number} | {r.stage} | {r.mode} | {k.num_workers} | {k.prefetch_factor or '—'} | "
                   f"{'yes' if k.pin_memory else 'no'} | {k.batch_size} | {k.grad_accum} | {k.compile} | "
                   f"{status.replace('|', '/')} | {_fmt(r.samples_per_s)} | "
                   f"{_fmt(s.per_dollar(r.samples_per_s), ',.0f')} | "
                   f"{_fmt(r.noise_cv, '.1%')} | {_fmt(r.measurement.get('data_wait_frac'), '.1%')} | "
                   f"{_fmt(r.measurement.get('nvml_util_gpu_pct'), '.0f')} | {_fmt(r.headroom, '.1%')} | "
                   f"{verdicts[r.number].name if r.number in verdicts else '—'} |")
    return "\n".join(out) + "\n"


def summary_table(rows: list[TrialRow], summary: RunSummary) -> Any:
    """A rich Table of the trials, knee and best marked, for the console."""
    from rich.table import Table

    table = Table(title=f"{summary.name}: {summary.trials} trials", show_lines=False)
    for col in ("#", "stage", "workers", "pf", "pin", "batch", "accum", "compile", "status", "samples/s", "noise",
                "wait"):
        table.add_column(col, justify="right" if col not in ("stage", "status", "compile") else "left")
    knee, best = summary.knee.knee, summary.knee.best
    for r in sorted(rows, key=lambda r: r.number):
        mark = " ◀ knee" if knee is not None and r.number == knee.number else ""
        mark += " ★ best" if best is not None and r.number == best.number and r is not knee else ""
        k = r.knobs
        table.add_row(str(r.number), r.stage, str(k.num_workers), str(k.prefetch_factor or "-"),
                      "y" if k.pin_memory else "n", str(k.batch_size), str(k.grad_accum), k.compile,
                      (r.status if r.ok else f"{r.status}: {r.reason[:40]}") + mark, _fmt(r.samples_per_s),
                      _fmt(r.noise_cv, ".1%"), _fmt(r.measurement.get("data_wait_frac"), ".0%"))
    return table


def rebuild(run_dir: Path) -> tuple[Config, list[TrialRow], RunSummary]:
    """Rebuild a run's outputs from study.db alone (no trial is re-run, no GPU needed)."""
    from tunekit import config as config_mod
    from tunekit.errors import UsageError
    from tunekit.store import STUDY_FILE, finished_rows, load_study

    if not (run_dir / STUDY_FILE).exists():
        raise UsageError(f"{run_dir}: no {STUDY_FILE} here; give the folder of a tunekit sweep")
    study = load_study(run_dir)
    cfg = config_mod.from_dict(study.user_attrs["config"], source=str(run_dir / STUDY_FILE))
    rows = finished_rows(study)
    meta = read_json(run_dir / "sweep.json") if (run_dir / "sweep.json").exists() else {}
    env = read_json(run_dir / "env.json") if (run_dir / "env.json").exists() else {}
    summary = summarize(cfg, rows, strategy=meta.get("strategy", cfg.strategy), stop_reason=meta.get("stop_reason", ""),
                        date=env.get("date"), env=env,  # the sweep's date, not the rebuild's
                        warnings=tuple(meta.get("warnings_before", []) + meta.get("warnings_after", [])))
    write_outputs(run_dir, cfg, rows, summary, env)
    return cfg, rows, summary
