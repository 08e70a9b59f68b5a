"""The sweep driver: plan -> launch -> record, until the plan is done or the budget is spent.

Never imports torch and never creates a CUDA context (it must not hold GPU memory that would distort headroom,
and a broken CUDA state must die with its trial). Interrupting a sweep (Ctrl-C, SIGTERM) kills the running trial's
process tree, records it as interrupted and still writes the outputs of the finished trials.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tunekit import plan, report, store
from tunekit.analysis import TrialRow, describe_knobs
from tunekit.config import Config
from tunekit.contract import TrialSpec, failed_measurement, write_json_atomic, write_text_atomic
from tunekit.launcher import run_trial

__all__ = ["SweepResult", "run_sweep", "probe_cuda", "make_console"]


@dataclass(frozen=True)
class SweepResult:
    run_dir: Path
    rows: list[TrialRow]
    summary: report.RunSummary
    interrupted: bool
    ran: int


def make_console(quiet: bool = False) -> Any:
    """A stderr console; without a terminal (CI logs) it is wide enough for the trial table."""
    from rich.console import Console

    console = Console(stderr=True, quiet=quiet)
    if not console.is_terminal:
        console = Console(stderr=True, quiet=quiet, width=160)
    return console


def probe_cuda(device: str) -> bool:
    """Whether trials will run on CUDA, asked of a short-lived subprocess (this process never imports torch)."""
    if device == "cpu":
        return False
    code = "import torch; print(torch.cuda.is_available())"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return out.stdout.strip() == "True"


class _Budget:
    def __init__(self, minutes: float, max_trials: int):
        self.deadline = time.monotonic() + minutes * 60
        self.minutes = minutes
        self.max_trials = max_trials
        self.durations: list[float] = []

    def stop_reason(self, total_trials: int) -> str | None:
        if total_trials >= self.max_trials:
            return f"budget.max_trials = {self.max_trials} reached"
        expected = statistics.median(self.durations) if self.durations else 0.0
        if time.monotonic() + expected > self.deadline:
            return (f"budget.minutes = {self.minutes:g} would be exceeded by another trial "
                    f"(~{expected:.0f} s each)")
        return None


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, so a killed command still kills its running trial."""
    previous = {sig: signal.signal(sig, _sigterm_as_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_sweep(cfg: Config, run_dir: Path, *, strategy: str, budget_minutes: float, resume: bool,
              quiet: bool = False) -> SweepResult:
    """Run (or resume) a sweep into ``run_dir`` and write its outputs."""
    console = make_console(quiet)
    run_dir.mkdir(parents=True, exist_ok=True)
    study = store.open_study(run_dir, cfg, resume=resume)
    recovered = store.recover_running(study, run_dir)
    if recovered:
        console.print(f"resuming: trial(s) {recovered} were running when the last sweep stopped; they run again")
    write_text_atomic(run_dir / "config.resolved.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    from tunekit.envinfo import snapshot

    env = snapshot()
    write_json_atomic(run_dir / "env.json", env)
    warnings_before = _warnings(cfg, env)
    for line in warnings_before:
        console.print(f"[yellow]warning:[/] {line}")
    cuda = probe_cuda(cfg.device)
    _prepare_dataset(cfg, console)
    rows = store.finished_rows(study)
    if rows:
        console.print(f"resuming: {len(rows)} finished trial(s) in {run_dir / store.STUDY_FILE} are kept")
    budget = _Budget(budget_minutes, cfg.budget.max_trials)
    interrupted, stop_reason, ran = False, "", 0
    total = plan.estimate_total(cfg, rows, strategy=strategy, cuda=cuda)
    try:
        with interrupts_as_keyboard_interrupt(), _Progress(console, total, len(rows)) as bar:
            while not stop_reason:
                requests = plan.next_requests(cfg, rows, strategy=strategy, cuda=cuda)
                if not requests:
                    break
                req = requests[0]  # the plan may depend on this result: run one, then ask again
                if req.skip is None:
                    stop_reason = budget.stop_reason(sum(1 for r in rows if r.status != "skipped")) or ""
                    if stop_reason:
                        break
                    ran += 1
                bar.starting(req)
                row = _run_one(study, cfg, run_dir, req)
                rows.append(row)
                if req.skip is None:
                    budget.durations.append(float(row.measurement.get("launcher_wall_s") or 0.0))
                bar.finished(row, plan.estimate_total(cfg, rows, strategy=strategy, cuda=cuda))
    except KeyboardInterrupt:
        interrupted, stop_reason = True, "interrupted; rerun the same command to resume"
        console.print("interrupted: the running trial was stopped; writing outputs for the finished trials")
    warnings_after = [w for w in _warnings(cfg, snapshot(), rows) if w not in warnings_before]
    for line in warnings_after:
        console.print(f"[yellow]warning (after the sweep):[/] {line}")
    write_json_atomic(run_dir / "sweep.json", {"strategy": strategy, "stop_reason": stop_reason,
                                               "interrupted": interrupted, "warnings_before": warnings_before,
                                               "warnings_after": warnings_after})
    summary = report.summarize(cfg, rows, strategy=strategy, stop_reason=stop_reason, env=env,
                               warnings=tuple(warnings_before + warnings_after))
    report.write_outputs(run_dir, cfg, rows, summary, env)
    return SweepResult(run_dir, rows, summary, interrupted, ran)


def _prepare_dataset(cfg: Config, console: Any) -> None:
    """Build the dataset once (and any cache it makes) before the first trial, in a subprocess."""
    wl = {"dataset": cfg.workload.dataset, "dataset_args": cfg.workload.dataset_args}
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "tunekit.workloads.prepare", json.dumps(wl)],
                              capture_output=True, text=True, timeout=max(600.0, cfg.trial.timeout_s))
    except subprocess.TimeoutExpired:
        console.print("warning: preparing the dataset timed out; the first trial will finish it")
        return
    if proc.returncode != 0:  # the trials will fail and say why; the sweep goes on
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        console.print(f"warning: building the dataset failed: {tail}")
        return
    console.print(f"dataset ready: {proc.stdout.strip()} samples ({time.monotonic() - t0:.1f} s)", highlight=False)


def _warnings(cfg: Config, env: dict[str, Any], rows: list[TrialRow] | None = None) -> list[str]:
    from tunekit.diagnosis import environment_warnings

    s = cfg.search
    crop = cfg.workload.dataset_args.get("crop")
    batch_bytes = 3 * int(crop) ** 2 * 4 * max(s.batch_size) if isinstance(crop, int) else None
    out = environment_warnings(env, max_workers=max(s.num_workers), batch_bytes=batch_bytes,
                               prefetch=max(s.prefetch_factor))
    for row in rows or []:
        m = row.measurement
        peak, total = m.get("host_mem_peak_bytes"), m.get("host_mem_total_bytes")
        if row.ok and peak and total and peak > 0.8 * total:
            out.append(f"trial {row.number} used {peak / 2**30:.1f} of {total / 2**30:.1f} GiB of host memory "
                       f"({row.knobs.num_workers} workers): close to the machine's RAM")
    return out


def _run_one(study: Any, cfg: Config, run_dir: Path, req: plan.Request) -> TrialRow:
    trial = store.start_trial(study, cfg, req.stage, req.mode, req.knobs.to_dict())
    spec = TrialSpec(number=trial.number, stage=req.stage, mode=req.mode, knobs=req.knobs, config=cfg.to_dict())
    if req.skip is not None:
        measurement = failed_measurement(spec, "skipped", req.skip)
        store.finish_trial(study, trial, measurement)
        return TrialRow.from_measurement({**measurement, "number": trial.number})
    try:
        measurement = run_trial(spec, run_dir / "trials" / str(trial.number), cfg.trial.timeout_s)
    except BaseException:
        store.interrupt_trial(study, trial)
        raise
    store.finish_trial(study, trial, measurement)
    return TrialRow.from_measurement({**measurement, "number": trial.number})


class _Progress:
    """A live bar (trials done / planned, elapsed, ETA, current stage and knobs, last samples/s) plus one log
    line per finished trial, so logs without a terminal still show progress."""

    def __init__(self, console: Any, total: int, done: int):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.fields[stage]:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[current]}"),
            TextColumn("[dim]{task.fields[last]}"), console=console, transient=False,
        )
        self.task = self.progress.add_task("sweep", total=total, completed=done, stage="", current="", last="")

    def __enter__(self) -> _Progress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def starting(self, req: plan.Request) -> None:
        self.progress.update(self.task, stage=req.stage, current=f"{req.mode}: {describe_knobs(req.knobs)}")

    def finished(self, row: TrialRow, total: int) -> None:
        last = f"last {row.samples_per_s:.1f}/s" if row.ok else f"last {row.status}"
        self.progress.update(self.task, advance=1, total=total, last=last)
        result = f"{row.samples_per_s:.1f} samples/s" if row.ok else f"{row.status}: {row.reason}"
        self.progress.console.print(f"trial {row.number} [{row.stage}/{row.mode}] {describe_knobs(row.knobs)}: "
                                    f"{result}", highlight=False)
