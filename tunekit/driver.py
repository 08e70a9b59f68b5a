"""The sweep driver: plan -> launch -> record, until the plan is done or the budget is spent; then the outputs.

Never imports torch and never creates a CUDA context (it must not hold GPU memory that would distort headroom,
and a broken CUDA state must die with its trial). Interrupting a sweep (Ctrl-C, SIGTERM, SIGHUP) kills the
running trial's process tree, records it as interrupted and still writes the outputs of the finished trials.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tunekit import fleet, plan, report, rules, store
from tunekit._files import read_json_or, write_json_atomic, write_text_atomic
from tunekit.config import Config, from_dict
from tunekit.contract import Measurement, Mode, TrialSpec, process, skipped_measurement
from tunekit.env import machine_fingerprint, matmul_peaks, probe_cuda, snapshot, sweep_warnings
from tunekit.launch import lock_run, release_nodes, run_task, run_trial, start_fork_server
from tunekit.records import TrialRow
from tunekit.report import Progress, make_console, warn

__all__ = [
    "SweepResult",
    "run_sweep",
    "rebuild",
    "probe_cuda",
    "interrupts_as_keyboard_interrupt",
]


@dataclass(frozen=True)
class SweepResult:
    run_dir: Path
    summary: report.RunSummary
    interrupted: bool


class _Budget:
    def __init__(self, minutes: float, max_trials: int):
        self.deadline = time.monotonic() + minutes * 60
        self.minutes = minutes
        self.max_trials = max_trials
        self.durations: list[float] = []

    def stop_reason(self, trials_run: int, reserve: int = 0) -> str | None:
        """Why the sweep must stop before another trial, keeping room for ``reserve`` more after it; None to go on."""
        if trials_run + reserve >= self.max_trials:
            return f"budget.max_trials = {self.max_trials} reached"
        expected = statistics.median(self.durations) if self.durations else 0.0
        if time.monotonic() + expected * (1 + reserve) > self.deadline:
            return f"budget.minutes = {self.minutes:g} would be exceeded by another trial (~{expected:.0f} s each)"
        return None

    def room_for_last(self, trials_run: int) -> bool:
        """Whether one last trial may still start: below ``max_trials`` and before the deadline (it may run past
        it, as any trial started in time may)."""
        return trials_run < self.max_trials and time.monotonic() < self.deadline


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, so a killed command still kills its running trial. For a
    process's main thread (the CLI): signal handlers cannot be installed from any other."""
    previous = {sig: signal.signal(sig, _sigterm_as_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class _RunningSweep:
    """One sweep in progress: its config, folder, store, the finished trials and how it ends."""

    cfg: Config
    run_dir: Path
    strategy: str
    runs: store.RunStore
    rows: list[TrialRow]
    cuda: bool
    console: Any
    stop_reason: str = ""
    interrupted: bool = False
    started: float = 0.0
    """time.monotonic() when this invocation began (the wall time sweep.json records)."""
    dataset_s: float = 0.0
    """Seconds this invocation spent preparing the dataset."""
    earlier: list[dict[str, Any]] = field(default_factory=list)
    """The invocations before this one of a resumed sweep (sweep.json's record of them)."""
    prepared: bool = False

    def prepare(self) -> None:
        """Start the fork server and build the dataset, once, before the first trial this invocation launches (a
        resumed sweep with nothing left to run does neither). The server's imports run beside the preparation."""
        if self.prepared:
            return
        self.prepared = True
        if self.cfg.script is not None:  # the script builds its own data, in each trial
            return
        t0 = time.monotonic()
        start_fork_server(self.cfg)
        try:
            _prepare_dataset(self.cfg, self.console)
        finally:
            self.dataset_s = time.monotonic() - t0


def run_sweep(
    cfg: Config,
    run_dir: Path,
    *,
    strategy: str,
    budget_minutes: float,
    resume: bool,
    quiet: bool = False,
    seed: Sequence[Measurement] = (),
    storage: str | None = None,
    join: bool = False,
) -> SweepResult:
    """Run (or resume) a sweep into ``run_dir`` and write its outputs. A KeyboardInterrupt (Ctrl-C, or SIGTERM and
    SIGHUP under :func:`interrupts_as_keyboard_interrupt`, which the CLI's main thread installs) ends every phase's
    child processes and still writes the outputs of the finished trials. ``seed``: finished trials measured
    elsewhere (a retune's reused ceilings, its check trial), recorded first when the run holds no trial yet; the
    plan then never asks for them again. ``storage``: the URL (with its password) of a shared database holding the
    run's studies, whose trials this node then takes with the others (``fleet``); ``join``: the run exists there,
    swept from another machine of the same type."""
    with lock_run(run_dir):
        return _locked_sweep(
            cfg,
            run_dir,
            strategy=strategy,
            budget_minutes=budget_minutes,
            resume=resume,
            quiet=quiet,
            seed=seed,
            storage=storage,
            join=join,
        )


def _locked_sweep(
    cfg: Config,
    run_dir: Path,
    *,
    strategy: str,
    budget_minutes: float,
    resume: bool,
    quiet: bool,
    seed: Sequence[Measurement] = (),
    storage: str | None = None,
    join: bool = False,
) -> SweepResult:
    started = time.monotonic()
    console = make_console(quiet)
    env = snapshot()
    machine = machine_fingerprint(env)
    runs = store.open_run(run_dir, cfg, resume=resume, strategy=strategy, storage=storage, join=join, machine=machine)
    fleet.check_machine(runs, machine)
    again = _seed_and_recover(runs, cfg, seed, console) if not join else []
    write_text_atomic(run_dir / "config.resolved.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    write_json_atomic(run_dir / "env.json", env)
    before = sweep_warnings(cfg, env)
    for line in before:
        warn(console, line)
    sweep = _RunningSweep(
        cfg,
        run_dir,
        strategy,
        runs,
        runs.rows(),
        probe_cuda(cfg.device),
        console,
        started=started,
        earlier=_invocations(run_dir) if resume else [],
    )
    _run_until_done(sweep, _Budget(budget_minutes, cfg.budget.max_trials))
    if again:
        _keep_unmeasured(sweep, again)
    return _finish(sweep, env, before)


def _run_until_done(sweep: _RunningSweep, budget: _Budget) -> None:
    """The sweep's trials, on this node alone or beside the others of a shared run, until the plan is done, the
    budget spent or an interrupt (then the outputs are still written, for the finished trials)."""
    cfg, console = sweep.cfg, sweep.console
    try:
        if sweep.runs.shared:
            fleet.node_trials(sweep, budget, lambda req, number: _measure(sweep, req, number))
        else:
            _run_trials(sweep, budget)
        if cfg.launch.nnodes > 1 and not release_nodes(cfg):  # their tunekit node loops end here
            warn(console, "the other nodes did not answer the release; their node loops stop after --idle-timeout")
    except KeyboardInterrupt:
        sweep.interrupted, sweep.stop_reason = True, "interrupted; rerun the same command to resume"
        console.print(
            "interrupted: what was running (the dataset's preparation or a trial) was stopped with its processes; "
            "writing outputs for the finished trials (the other nodes keep waiting for the resumed sweep)"
        )


def _seed_and_recover(runs: store.RunStore, cfg: Config, seed: Sequence[Measurement], console: Any) -> list[TrialRow]:
    """Before the first trial: the seed recorded (into a run without trials), trials a dead sweep left running
    closed, and (``trial.remeasure_disturbed``) the disturbed ones set aside to be measured again. Returns the
    trials set aside."""
    seeded = len(seed) if seed and not runs.rows() else 0
    for measurement in seed[:seeded]:  # the trial's own stage, mode and knobs; the run's next number
        knobs = TrialRow.from_measurement(measurement).knobs.to_dict()
        trial, number = runs.start(cfg, measurement.stage, measurement.mode, knobs)
        runs.finish(trial, measurement.mode, replace(measurement, number=number))
    recovered = runs.recover_running()
    if recovered:
        console.print(f"resuming: trial(s) {recovered} were running when the last sweep stopped; they run again")
    again = [r for r in runs.rows() if rules.disturbed(r)] if cfg.trial.remeasure_disturbed and not seeded else []
    if again:
        runs.set_aside([r.number for r in again])
        console.print(
            f"resuming: trial(s) {[r.number for r in again]} were disturbed (other processes kept the CPUs "
            f"busy, or their windows scattered over {rules.NOISY_CV:.0%}); they are measured again"
        )
    if seeded:
        console.print(f"recorded first: {seeded} finished trial(s) measured before this sweep (each says where)")
    elif kept := runs.rows():
        console.print(f"resuming: {len(kept)} finished trial(s) in {runs.where} are kept")
    return again


def _keep_unmeasured(sweep: _RunningSweep, again: list[TrialRow]) -> None:
    """The disturbed trials this invocation set aside but did not measure again (the budget or an interrupt came
    first) are kept as they were measured, so the outputs still hold them; the next resume measures them again."""
    measured = {r.key for r in sweep.runs.rows()}
    kept = [r.number for r in again if r.key not in measured]
    if kept:
        sweep.runs.restore(kept)
        sweep.rows = sweep.runs.rows()


def _run_trials(sweep: _RunningSweep, budget: _Budget) -> None:
    """Ask the plan, run one trial, record it; until the plan is done or the budget stops the sweep."""
    estimate = plan.estimate_total(sweep.cfg, sweep.rows, strategy=sweep.strategy, cuda=sweep.cuda)
    with Progress(sweep.console, estimate, len(sweep.rows)) as bar:
        while True:
            requests = plan.next_requests(sweep.cfg, sweep.rows, strategy=sweep.strategy, cuda=sweep.cuda)
            if not requests:
                return
            req = requests[0]  # the plan may depend on this result: run one, then ask again
            last = False
            if req.skip is None:
                run = sum(1 for r in sweep.rows if r.status != "skipped")
                # the report's baseline, owed once the batch is chosen: the budget keeps one trial's room for it;
                # when the budget ends the sweep first, the baseline is its last trial, started while the deadline
                # has not passed (a trial longer than the median can eat the room kept)
                owed = plan.baseline(sweep.cfg, sweep.rows, strategy=sweep.strategy, cuda=sweep.cuda)
                reserve = 1 if owed is not None and owed.key != req.key else 0
                sweep.stop_reason = budget.stop_reason(run, reserve) or ""
                if sweep.stop_reason:
                    if owed is None or not budget.room_for_last(run):
                        return
                    req, last = owed, True
            if req.skip is None:
                sweep.prepare()
            bar.starting(req)
            row = _run_one(sweep, req)
            sweep.rows.append(row)
            if req.skip is None:
                budget.durations.append(float(row.measurement.launcher_wall_s or 0.0))
            bar.finished(row, plan.estimate_total(sweep.cfg, sweep.rows, strategy=sweep.strategy, cuda=sweep.cuda))
            if row.measurement.asked:
                warn(sweep.console, _ran_otherwise(row))
            if last:
                return


def _ran_otherwise(row: TrialRow) -> str:
    """One line for a trial whose script ran other loader knobs than the trial set (``Measurement.asked``)."""
    asked = row.measurement.asked or {}
    ran = row.knobs.to_dict()
    knobs = ", ".join(f"{k}={v} (ran {ran.get(k)})" for k, v in asked.items())
    hint = (
        "; a loader built with a batch sampler (HF Trainer's, Lightning's) takes its batch from the script: "
        "fill {batch_size} into the script's own flag (--per_device_train_batch_size, --batch-size)"
        if "batch_size" in asked
        else ""
    )
    return (
        f"trial {row.number} asked {knobs}, but the script's DataLoader did not take it: the script sets it "
        f"itself or ignores the flag; the trial is recorded as it ran and not asked again{hint}"
    )


def _run_one(sweep: _RunningSweep, req: plan.Request) -> TrialRow:
    trial, number = sweep.runs.start(sweep.cfg, req.stage, req.mode, req.knobs.to_dict(), run=req.run)
    try:
        measurement = _measure(sweep, req, number)
    except BaseException:
        sweep.runs.interrupt(trial, req.mode)
        raise
    sweep.runs.finish(trial, req.mode, measurement)
    return TrialRow.from_measurement(replace(measurement, number=number))


def _measure(sweep: _RunningSweep, req: plan.Request, number: int) -> Measurement:
    """Run ``req`` as trial ``number`` (a skipped request: its record, without running anything)."""
    cfg = sweep.cfg
    spec = TrialSpec(
        number=number,
        stage=req.stage,
        mode=req.mode,
        knobs=req.knobs,
        config=cfg.to_dict(),
        needed=plan.needed_rate(cfg, sweep.rows, req),
        probe_peak=_asks_peak(sweep, req),
        run=req.run,
    )
    if req.skip is not None:
        return skipped_measurement(spec, req.skip, req.bound)
    return run_trial(spec, sweep.run_dir / "trials" / str(number), cfg.trial.timeout_s)


def _asks_peak(sweep: _RunningSweep, req: plan.Request) -> bool:
    """Whether this trial measures the device's matmul peak: once per sweep, in its first one-rank trial that runs
    the model (a staged sweep's first compute trial), and in the next ones until one recorded a figure (a trial
    that failed, or a probe that did). A script's trials run the user's own process: no probe there."""
    if sweep.cfg.script is not None or req.mode == Mode.loader or req.knobs.ranks > 1:
        return False
    return not any(r.measurement.matmul_peak_flops for r in sweep.rows)


def _finish(sweep: _RunningSweep, env: dict[str, Any], before: list[str]) -> SweepResult:
    """Warnings after the sweep, sweep.json, the outputs, and the knee on the study. An interrupt while they are
    written (they take a second) is the sweep's interrupt: they are written once more, whole, and the sweep ends
    as interrupted; a second interrupt ends it there (each output is atomic, and they are all written or none)."""
    after = [w for w in sweep_warnings(sweep.cfg, snapshot(), sweep.rows) if w not in before]
    for line in after:
        warn(sweep.console, line, "warning (after the sweep):")
    try:
        return _write_outputs(sweep, env, before, after)
    except KeyboardInterrupt:
        sweep.interrupted, sweep.stop_reason = True, "interrupted; rerun the same command to resume"
        sweep.console.print("interrupted while writing the outputs: writing them once more, whole")
        return _write_outputs(sweep, env, before, after)


def _write_outputs(sweep: _RunningSweep, env: dict[str, Any], before: list[str], after: list[str]) -> SweepResult:
    env = {**env, "matmul_peak": matmul_peaks(sweep.rows)}  # the device's measured peak beside the machine's facts
    write_json_atomic(sweep.run_dir / "env.json", env)
    meta = {
        "strategy": sweep.strategy,
        "stop_reason": sweep.stop_reason,
        "interrupted": sweep.interrupted,
        "warnings_before": before,
        "warnings_after": after,
        "invocations": [
            *sweep.earlier,
            {
                "date": env.get("date"),
                "wall_s": round(time.monotonic() - sweep.started, 1),
                "dataset_s": round(sweep.dataset_s, 3),
                "trials": len(sweep.rows),
                "interrupted": sweep.interrupted,
            },
        ],
    }
    write_json_atomic(sweep.run_dir / "sweep.json", meta)
    summary = report.summarize(
        sweep.cfg,
        sweep.rows,
        strategy=sweep.strategy,
        stop_reason=sweep.stop_reason,
        env=env,
        warnings=tuple(before + after),
    )
    report.write_outputs(sweep.run_dir, summary, env)
    knee = summary.choice.knee
    sweep.runs.record_knee(
        None
        if knee is None
        else {
            "trial": knee.number,
            "knobs": knee.knobs.to_dict(),
            "rate": knee.rate,
            "unit": knee.unit,
            "best_trial": summary.choice.best.number if summary.choice.best else None,
            "reason": summary.choice.reason,
        }
    )
    return SweepResult(sweep.run_dir, summary, sweep.interrupted)


def _invocations(run_dir: Path) -> list[dict[str, Any]]:
    """The invocations a run folder's sweep.json records (read before a resumed sweep overwrites it; a sweep that
    starts afresh keeps none): each one's wall time (outputs excluded), its dataset preparation, and the trials
    recorded by its end."""
    path = run_dir / "sweep.json"
    try:
        return list(read_json_or(path, {}).get("invocations", []))
    except (OSError, ValueError, AttributeError):
        return []


def rebuild(run_dir: Path, storage: str | None = None) -> report.RunSummary:
    """Rebuild a run's outputs from its study alone: study.db, or the database its config.resolved.yaml names (or
    ``storage``, its URL with the password). No trial is re-run, no GPU needed, the study is not written."""
    runs = store.load_run(run_dir, storage)
    cfg = from_dict(runs.config, source=runs.where)
    meta, env = read_json_or(run_dir / "sweep.json", {}), read_json_or(run_dir / "env.json", {})
    summary = report.summarize(
        cfg,
        runs.rows(),
        strategy=meta.get("strategy", cfg.strategy),
        stop_reason=meta.get("stop_reason", ""),
        date=env.get("date"),
        env=env,
        warnings=tuple(meta.get("warnings_before", []) + meta.get("warnings_after", [])),
    )
    report.write_outputs(run_dir, summary, env)  # the sweep's date above, not the rebuild's
    return summary


def _prepare_dataset(cfg: Config, console: Any) -> None:
    """Build the dataset once (and any cache it makes) before the first trial, in a subprocess."""
    wl = {"dataset": cfg.workload.dataset, "dataset_args": cfg.workload.dataset_args}
    t0 = time.monotonic()
    # forked by the fork server (its imports paid once), else a fresh interpreter; an interrupt ends it
    rc, out = run_task(cfg, [process.PREPARE, json.dumps(wl)], max(600.0, cfg.trial.timeout_s))
    lines = [line for line in out.strip().splitlines() if line.strip()]
    if rc is None:
        console.print("warning: preparing the dataset timed out; the first trial will finish it")
        return
    if rc != 0:  # the trials will fail and say why; the sweep goes on
        console.print(f"warning: building the dataset failed: {(lines or ['no output'])[-1]}")
        return
    size = lines[-1] if lines else "?"
    said = "an IterableDataset" if size == "an iterable of" else f"{size} samples"
    console.print(f"dataset ready: {said} ({time.monotonic() - t0:.1f} s)")
