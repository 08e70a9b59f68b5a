"""One trial, measured in this process: set up, meter the built-in step on the loader's batches, assemble the
measurement (docs/measurement.md).

* The meter (``_meter``) owns what a measurement is: the first step timed apart, the pipeline fill set aside, the
  warm-up steps, the windows and their stops. This module only connects it to the trial's loader and step.
* Device peak memory counters are reset after warm-up; peaks, not means, are reported.
* The sampler draws from one endless epoch, so no epoch boundary (worker restart) falls inside the trial.
* The loader's workers stop as soon as the windows end (killed, not asked to finish the batch in hand).
* After the windows, once the memory peaks are read: the model's FLOPs per item are counted on one more batch, and
  the spec's ``probe_peak`` measures the device's matmul peak (``_flops``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import IterableDataset

from tunekit.contract import Measurement, TrialSpec
from tunekit.worker import _dist
from tunekit.worker._modes import trial_mode
from tunekit.worker._record import Observed, device_memory, measurement, reset_peaks
from tunekit.worker.factory._flops import count_flops, matmul_peak
from tunekit.worker.factory._probes import sync_share, warn_if_ranks_read_the_same
from tunekit.worker.factory._setup import Setup, set_up
from tunekit.worker.factory._step import Diverged, check_loss, trial_step
from tunekit.worker.meter import LoaderBatches, Meter, MeterSettings, Reading, epoch_batches
from tunekit.worker.meter._monitor import Monitor, TreeCpu, fork_server_pid, nvml_sampler

__all__ = ["measure", "Diverged"]


@dataclass
class _Metered(Observed):
    """What the trial's loop measured, and what the built-in step adds."""

    loop_s: float = 0.0
    """Making the loader's iterator (its workers fork) and the step (a compute trial stages its batch)."""
    flops: dict[str, Any] = field(default_factory=dict)
    """``flops_per_item`` and ``flops_reason``."""


def _epochs_end(spec: TrialSpec, setup: Setup) -> int | None:
    """Batches per epoch when the loader's epochs end inside trials (the workload's own sampler or loader; tunekit's
    sampler is endless, rule 6); None otherwise, and in compute mode (one staged batch)."""
    workload = setup.cfg.workload
    if not setup.mode.epoch_aware or not (workload.sampler or workload.loader):
        return None
    return epoch_batches(setup.loader)


def _settings(spec: TrialSpec, setup: Setup, queued: int) -> MeterSettings:
    t, knobs = setup.cfg.trial, spec.knobs
    workers = setup.loader_knobs.num_workers
    fill = setup.mode.fill(workers, knobs.prefetch_factor, queued)
    # epochs that end inside a trial (the loader's restart or refill) are measured apart from the steady rate, as
    # a script's are (docs/measurement.md, rule 4), and waited for within a third of the timeout
    epochs = _epochs_end(spec, setup)
    return MeterSettings.from_trial(
        t,
        compiling=knobs.compile != "none",
        grad_accum=knobs.grad_accum,
        round_batches=max(1, workers),
        fill=fill,
        needed=spec.needed / knobs.ranks if spec.needed is not None else None,  # each rank's share
        baseline=spec.baseline,
        epoch_batches=epochs,
        boundary_wait_s=t.timeout_s / 3 if epochs else 0.0,
    )


def _loader_batches(spec: TrialSpec, setup: Setup) -> tuple[LoaderBatches, bool]:
    """The loader's batches as the meter reads them, and whether the ranks shard their data themselves (a stream,
    their own sampler or loader): then they are checked not to all read the same."""
    workers = setup.loader_knobs.num_workers
    iterable = isinstance(setup.built.dataset, IterableDataset)
    workload = setup.cfg.workload
    self_sharded = setup.ranks is not None and (iterable or bool(workload.sampler or workload.loader))
    loader = LoaderBatches(
        setup.loader,
        workers if iterable and workers >= 2 and not setup.mode.staged else 0,
        check_ranks=self_sharded,
    )
    return loader, self_sharded


def _run(spec: TrialSpec, setup: Setup, monitor: Monitor) -> _Metered:
    """The built-in step of the trial's mode, metered on the loader's batches; then a multi-rank trial's probes."""
    t_loop = time.perf_counter()
    cfg, device, ranks = setup.cfg, setup.device, setup.ranks
    loader, self_sharded = _loader_batches(spec, setup)
    step = None
    try:
        step = trial_step(setup.built, spec, setup.mode, cfg, loader)
        out = _Metered(Reading(), loop_s=time.perf_counter() - t_loop)

        def measuring() -> None:  # between warm-up and the first window: nothing else, or the loader refills
            if self_sharded:
                warn_if_ranks_read_the_same(ranks, loader)
            out.warmup_memory = reset_peaks(device)
            monitor.measuring = True

        settings = _settings(spec, setup, step.queued)
        meter = Meter(
            step.batches,
            settings,
            device=device,
            count=step.count,
            cpu=TreeCpu(),
            ranks=ranks,
            ready=step.ready,
            epochs=lambda: loader.epochs_ended,
            device_wait=step.device_wait,
            window_done=lambda: check_loss(step, ranks.any if ranks is not None else bool),
            measuring=measuring,
            epoch_aware=settings.epoch_batches is not None,
        )
        for batch in meter:
            step.run(batch)
        out.reading = meter.reading
        monitor.sample_now()
        monitor.measuring = False
        out.memory = device_memory(device)
        if ranks is not None and setup.built.ddp is not None:
            out.sync_share = sync_share(step, setup.built, device, ranks)
        out.epochs_ended, out.warnings = loader.epochs_ended, loader.warnings
        # after the epochs are read: the count's one more batch may end an epoch the windows did not
        out.flops = count_flops(step, setup.built, cfg.workload.step_updates)
        return out
    finally:
        # Stop the loader workers now: the step's closures (and a traceback) would keep them alive.
        if step is not None:
            step.close()
        loader.close()


def measure(spec: TrialSpec) -> Measurement | None:
    """Run one trial in this process and return its measurement (status ok). Errors propagate to the caller.
    A rank of a multi-rank trial returns the merged measurement of every rank on rank 0, and None elsewhere. The
    record takes only the fields it defines: a field written here and missing there fails every trial."""
    t_start = time.perf_counter()
    setup = set_up(spec, trial_mode(spec.mode))
    device, ranks = setup.device, setup.ranks
    node_root = os.getppid() if ranks is not None and ranks.local_rank == 0 else None  # torchrun: the node's tree
    monitor = Monitor(nvml_sampler(device), node_root=node_root, forked_from=fork_server_pid()).start()
    try:
        metered = _run(spec, setup, monitor)
        peak = matmul_peak(device, setup.cfg.workload.precision) if spec.probe_peak and ranks is None else {}
    finally:
        monitor.stop()
    t_done = time.perf_counter()
    times = {
        "loop_setup_s": setup.loader_s + metered.loop_s,
        "teardown_s": t_done - metered.reading.windows_end,
        "trial_s": t_done - t_start,
    }
    out = measurement(spec, setup, metered, monitor, times)
    out = dataclasses.replace(out, **metered.flops, **peak)
    if ranks is None:
        return out
    result = _dist.merged(out, ranks, monitor.node_pss_peak, monitor.node_processes)
    ranks.close()
    return result
