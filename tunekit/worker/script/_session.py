"""Script mode, inside the user's own training process: the training DataLoader found, the trial's knobs set on
it, and the meter run on its batches while the script's own loop trains them.

The bootstrap (``_bootstrap/sitecustomize.py``) calls :func:`install` at interpreter start when the launcher set
``TUNEKIT_SCRIPT_SPEC`` (the trial's spec.json) and ``TUNEKIT_SCRIPT_MEASUREMENT`` (where measurement.json goes).
From then on every ``DataLoader`` the script builds is counted, and the first one iterated for training is
measured: with ``script.loader: auto`` the first iterated with autograd enabled (evaluation runs under
``no_grad`` or ``inference_mode``), else the first iterated again that has given the most batches, with
``script.loader: N`` the N-th built. The script's loop then gets its
batches through the meter; an epoch of the loader that ends inside the trial ends for the script too (its own work
between epochs is measured, as in its own runs), is counted, and its worker restart paid; the script's next
``iter()`` of the loader goes on with the meter. At the batch request after the last window the
measurement is written and the process ends (``os._exit``): the script's remaining epochs, evaluation and
checkpoints never run.

Under torchrun every rank's training loader is measured this way: the ranks agree on the meter's decisions over a
gloo group of their own (made once the script has joined its process group, before its training loader's first
batch) and rank 0 writes the merged measurement (``_dist.merge``); torchrun's own process trains nothing and is
left alone.

Modes: ``train`` measures the script's own step; ``compute`` feeds it the loader's first batch again and again, the
loader stopped (the script's step on a ready batch, pinned on a GPU: a ceiling has the fastest copy); ``loader`` drains
the loader in the bootstrap alone (with the host-to-device copy on a GPU) before the script's loop gets any batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
import time
import traceback
import weakref
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.pin_memory import pin_memory

from tunekit._files import write_json_atomic
from tunekit.command import LOADER_KNOBS, placeholders, set_on_loader
from tunekit.config import from_dict
from tunekit.contract import Measurement, TrialSpec, failed_measurement
from tunekit.contract import process as names
from tunekit.launch import classify_error
from tunekit.worker import _dist
from tunekit.worker._modes import trial_mode
from tunekit.worker._record import Observed, assemble, device_memory, reset_peaks
from tunekit.worker.meter import (
    BOUNDARY_WAIT,
    LoaderBatches,
    Meter,
    MeterSettings,
    epoch_batches,
)
from tunekit.worker.meter._monitor import Monitor, TreeCpu, fork_server_pid, nvml_sampler
from tunekit.worker.script._loader import Items, apply_knobs, copy_to_device, loader_length
from tunekit.worker.script._marks import Marks

__all__ = ["Session"]

_original_iter = DataLoader.__iter__


class _Own:
    """The training loader as the adapter iterates it: the DataLoader's own iterator, not the metered one."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.persistent_workers = loader.persistent_workers

    def __iter__(self) -> Any:
        return _original_iter(self.loader)


class Session:
    """This process's trial: the spec, the loaders the script built, the one measured."""

    def __init__(self, spec: TrialSpec, out_path: str):
        self.spec, self.out_path = spec, out_path
        self.mode = trial_mode(spec.mode)
        self.cfg = from_dict(spec.config, check_imports=False)
        script = self.cfg.script
        assert script is not None
        self.which = script.loader
        self.count_path = script.count
        self.unit = script.unit
        self.command = script.command
        self.inject = set(set_on_loader(script.command))
        """The knobs set on the training DataLoader itself (the command has no placeholder for them)."""
        self.started = time.time()
        self.pid = os.getpid()
        self.world, self.rank = int(os.environ.get("WORLD_SIZE") or 1), int(os.environ.get("RANK") or 0)
        self.ranks: _dist.Ranks | None = None
        self.built: list[weakref.ref[DataLoader]] = []
        self.sites: list[dict[str, str]] = []
        """Where each loader was built, in build order (`_built_at`)."""
        self.yielded: dict[int, int] = {}
        """Batches each passed-through loader gave (by its build index), for the failure messages."""
        self.training: DataLoader | None = None
        self.stream: Any = None
        self.loader: LoaderBatches | None = None
        self.monitor: Monitor | None = None
        self.meter: Meter | None = None
        self.facts: dict[str, Any] = {}
        self.handed_out = 0
        self.done = False
        self.items: Items | None = None
        self.own: _Own | None = None
        self.rebuilt = 0
        """Training loaders the script built anew (each epoch, say) that the measurement went on with."""
        self.marks = Marks(os.path.join(os.path.dirname(out_path), names.SCRIPT_MARKS) if self.rank == 0 else None)

    # -- which loader ---------------------------------------------------------------------------------------

    def index(self, loader: DataLoader) -> int:
        """The loader's build order, 1-based (0: built before the bootstrap, or not a DataLoader it saw)."""
        return next((i for i, ref in enumerate(self.built, 1) if ref() is loader), 0)

    def site(self, loader: DataLoader) -> dict[str, str]:
        """Where the script built ``loader`` (`_built_at`); empty when it was built before the bootstrap."""
        index = self.index(loader)
        return self.sites[index - 1] if index else {}

    def found_by(self, loader: DataLoader) -> str | None:
        """Why ``loader``, iterated now, is the training loader; None when it is not. With ``auto``: the first
        iterated with autograd enabled; failing that, a loader iterated again (its next epoch) that has given the
        most batches so far (a loop that trains under no_grad, once no loader has autograd enabled)."""
        if self.which != "auto":
            return f"script.loader = {self.which}" if self.index(loader) == int(self.which) else None
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            return "autograd enabled"
        given = self.yielded.get(self.index(loader), 0)
        if given and given == max(self.yielded.values()):
            return f"the most batches ({given} in its first pass; none iterated with autograd enabled)"
        return None

    # -- the measured loader --------------------------------------------------------------------------------

    def start(self, loader: DataLoader, found_by: str) -> Any:
        """Set the knobs on the training loader and meter its batches; the iterator the script's loop gets."""
        self.training = loader
        self.marks.put(iterated=1)
        t_start = time.time()
        self.facts = {"build_s": max(0.0, t_start - self.started)}
        params = apply_knobs(loader, self.spec, set() if self.spec.stage == "baseline" else self.inject)
        self.facts["params"] = params
        self.facts["loader_measured"] = self._loader_facts(loader, found_by, params)
        device = _device()
        self.facts["device"] = device
        if self.world > 1:
            self.ranks = _join_ranks(self.cfg.trial.timeout_s)
        self.own = _Own(loader)
        self.loader = LoaderBatches(self.own)
        self.items = Items(self.count_path, params["batch_size"])
        count = self.items
        batches, ready = self.loader, self.loader.ready
        fill = self.mode.fill(params["num_workers"], params["prefetch_factor"])
        epoch = epoch_batches(loader)
        if self.mode.staged:  # the script's step on one ready batch: the loader stands aside
            first = next(self.loader)
            self.loader.close()
            if device.type == "cuda":  # as ready as a loader can make it: pinned, so its copy is the fastest one
                first = pin_memory(first)
            batches, ready, epoch = itertools.repeat(first), (lambda: 0), None
        node_root = os.getppid() if self.ranks is not None and self.ranks.local_rank == 0 else None  # torchrun
        self.monitor = Monitor(nvml_sampler(device), node_root=node_root, forked_from=fork_server_pid()).start()
        aware = self.mode.epoch_aware
        settings = self._settings(params["num_workers"], fill, epoch, aware)
        self.meter = Meter(
            batches,
            settings,
            device=device,
            count=count,
            cpu=TreeCpu(),
            ranks=self.ranks,
            ready=ready,
            epochs=lambda: self.loader.epochs_ended if self.loader is not None else 0,
            measuring=lambda: self._measuring(device),
            epoch_aware=aware,
        )
        if not self.mode.trains:  # the loader alone: drained here, before the script's loop gets a batch
            for batch in self.meter:
                copy_to_device(batch, device, params["pin_memory"])
            self.finish()
        self.stream = _Stream(self, self.meter)
        return self.stream

    def _loader_facts(self, loader: DataLoader, found_by: str, params: dict[str, Any]) -> dict[str, Any]:
        """``loader_measured``: the training loader as the script built it and the knobs left it, and where it was
        built (``persistent_workers`` moves here out of ``params``)."""
        return {
            "index": self.index(loader),
            "found_by": found_by,
            "dataset": type(loader.dataset).__name__,
            "length": loader_length(loader.dataset),
            "batch_size": params["batch_size"],
            "num_workers": params["num_workers"],
            "pin_memory": params["pin_memory"],
            "prefetch_factor": params["prefetch_factor"],
            "persistent_workers": params.pop("persistent_workers"),
            **self.site(loader),
        }

    def _settings(self, workers: int, fill: int, epoch: int | None, aware: bool) -> MeterSettings:
        """The meter's settings. The script's own loop trains (and the loader alone restarts): its epoch boundaries
        (evaluation, checkpoints, the loader's restart or refill) are measured apart from the steady rate inside an
        epoch (``aware``), and waited for when an epoch ends soon enough: within a third of the trial's timeout and
        BOUNDARY_WAIT times the windows' time; the script's own settings, which every gain is measured against, wait
        the whole third."""
        trial = self.cfg.trial
        needed = self.spec.needed / self.world if self.spec.needed is not None else None  # each rank's share
        return MeterSettings.from_trial(
            trial,
            round_batches=max(1, workers),
            fill=fill,
            needed=needed,
            baseline=self.spec.baseline,
            epoch_batches=epoch,
            boundary_wait_s=trial.timeout_s / 3 if aware else 0.0,
            boundary_patience=math.inf if self.spec.stage == "baseline" else BOUNDARY_WAIT,
        )

    def _asked(self, params: dict[str, Any]) -> dict[str, Any]:
        """The loader knobs this trial set (filled into the command or set on the loader) that the loader does not
        run with, as asked: the script hard-codes them, or ignores the flag."""
        if self.spec.stage == "baseline":  # the script's own settings: nothing asked
            return {}
        set_here = self.inject | (placeholders(self.command) & set(LOADER_KNOBS))
        ran = {"num_workers": params["num_workers"], "batch_size": params["batch_size"]}
        if params["num_workers"] > 0 and self.spec.knobs.num_workers > 0:  # prefetch means nothing without workers
            ran["prefetch_factor"] = params["prefetch_factor"]
        if torch.cuda.is_available():  # on the CPU a pinned trial runs unpinned by design
            ran["pin_memory"] = params["pin_memory"]
        knobs = self.spec.knobs
        if knobs.threads:  # filled into the command, or set in this process at its start
            ran["threads"] = params["threads"]
            set_here.add("threads")
        asked = {**knobs.to_dict(), "prefetch_factor": knobs.prefetch_factor or 2}  # None: the default, 2
        return {k: asked[k] for k, v in ran.items() if k in set_here and asked[k] != v}

    def same_role(self, loader: DataLoader) -> bool:
        """Whether ``loader``, iterated while another is measured, is the script's training loader built anew (a
        loop that builds its DataLoader each epoch): over the same dataset, or one of the same class and length."""
        old = self.training
        if old is None or self.stream is None or not self.mode.end_to_end:
            return False
        if loader.dataset is old.dataset:
            return True
        return (
            type(loader.dataset) is type(old.dataset)
            and loader_length(loader.dataset) == loader_length(old.dataset)
            and loader_length(loader.dataset) is not None
        )

    def follow(self, loader: DataLoader) -> Any:
        """Go on with the measurement on the training loader built anew: the trial's knobs set on it, its next epoch
        read from it (the current one goes on from the loader that began it); the iterator the script's loop gets."""
        assert self.own is not None
        apply_knobs(loader, self.spec, set() if self.spec.stage == "baseline" else self.inject)
        self.own.loader, self.own.persistent_workers = loader, loader.persistent_workers
        self.training, self.rebuilt = loader, self.rebuilt + 1
        self.facts["loader_measured"]["rebuilt"] = self.rebuilt
        return self.stream

    def _measuring(self, device: torch.device) -> None:
        self.facts["warmup_memory"] = reset_peaks(device)
        if self.monitor is not None:
            self.monitor.measuring = True

    def finish(self) -> None:
        """The windows are done: write the measurement and end the process, its loader workers first."""
        assert self.meter is not None and self.monitor is not None and self.loader is not None
        self.done = True
        reading, device = self.meter.reading, self.facts["device"]
        monitor = self.monitor
        monitor.sample_now()
        monitor.measuring = False
        memory = device_memory(device)
        self.loader.close()
        monitor.stop()
        started_at = float(os.environ.get(names.STARTED_AT) or self.started)
        times = {
            "startup_s": max(0.0, self.started - started_at),
            "cuda_init_s": 0.0,
            "build_s": self.facts["build_s"],
            "loop_setup_s": 0.0,
            "teardown_s": time.perf_counter() - reading.windows_end,
            "trial_s": time.time() - self.started,
        }
        params = self._ran_with()
        dataset = self.training.dataset if self.training is not None else None  # not `if loader`: its len()
        loader = self.loader
        seen = Observed(reading, self.facts.get("warmup_memory", {}), memory, loader.epochs_ended, loader.warnings)
        out = assemble(
            self.spec,
            self.mode,
            seen,
            monitor,
            device=device,
            dataset=dataset,
            workers=params["num_workers"],
            unit=self.unit,
            times=times,
            params=params,
        )
        out = dataclasses.replace(out, loader_measured=self.facts["loader_measured"], asked=self.facts["asked"] or None)
        self._write(out, monitor)
        sys.stdout.flush()
        sys.stderr.write(f"tunekit: trial {self.spec.number} measured; the script ends here\n")
        sys.stderr.flush()
        os._exit(0)

    def _ran_with(self) -> dict[str, Any]:
        """The knobs the trial ran with: the batch the loop received (not the loader's ``batch_size``, None for a
        batch sampler's loader: HF Trainer's, Lightning's), the threads the process ran (the script may set its own
        after tunekit's), over the spec's; records what was asked and not run (``facts["asked"]``)."""
        if self.items is not None and self.items.first is not None:
            self.facts["params"]["batch_size"] = self.facts["loader_measured"]["batch_size"] = self.items.first
        if self.spec.knobs.threads:
            self.facts["params"]["threads"] = torch.get_num_threads()
        self.facts["asked"] = self._asked(self.facts["params"])
        return {**self.spec.knobs.to_dict(), **self.facts["params"]}

    def _write(self, out: Measurement, monitor: Monitor) -> None:
        """measurement.json: this process's, or under torchrun every rank's merged, written by rank 0."""
        if self.ranks is not None:
            out = _dist.merged(out, self.ranks, monitor.node_pss_peak, monitor.node_processes)
        if out is not None:
            write_json_atomic(self.out_path, out.to_dict())

    # -- the script ending on its own ---------------------------------------------------------------------

    def failure(self, exc: BaseException | None = None) -> None:
        """Write why the trial has no measurement when the script ends before its windows are done (in the script's
        own process: a child it forked and that exits through the interpreter inherits this hook too)."""
        if self.done or os.path.exists(self.out_path) or os.getpid() != self.pid:
            return
        self.done = True
        if exc is not None:
            text = "".join(traceback.format_exception(exc))
            status, reason = classify_error(f"{type(exc).__name__}: {exc}\n{text}")
            extra = {"exception": type(exc).__name__}
        else:
            status, reason, extra = "crashed", self._why_no_measurement(), {}
        if self.loader is not None:
            self.loader.close()
        path = self.out_path
        if self.world > 1:  # beside the trial's measurement, with the time: the first rank to fail is the cause
            path = os.path.join(os.path.dirname(path), names.rank_failure_file(self.rank))
            extra["failed_at"] = time.time()
            reason = f"rank {self.rank}: {reason}"
        write_json_atomic(path, failed_measurement(self.spec, status, reason, **extra).to_dict())

    def _why_no_measurement(self) -> str:
        if self.training is not None:
            return (
                f"the script's loop ended after {self.handed_out} batch(es) of the training loader, before the "
                "windows were done: give it more batches (more epochs or steps), or shorter trial.window_s / "
                "trial.measure_windows"
            )
        if not self.built:
            return "the script ended without building a torch DataLoader: script mode measures the training loader"
        seen = ", ".join(f"#{i} ({n} batches)" for i, n in sorted(self.yielded.items())) or "none iterated"
        which = (
            "none was iterated with autograd enabled (evaluation runs under no_grad); name it with "
            "script.loader: N (the N-th DataLoader the script builds)"
            if self.which == "auto"
            else f"script.loader = {self.which} was never iterated"
        )
        return f"the script ended without training on a DataLoader: it built {len(self.built)} ({seen}); {which}"


class _Stream:
    """What the script's loop iterates: the meter's batches, each epoch ending for the script where the training
    loader's does. The script's own work between epochs (evaluation, a checkpoint, a log line) then runs inside the
    measurement, as in its own runs, and its next ``iter()`` of the loader goes on with the meter: the first batch
    of the new epoch, which the meter already took, waits here for it."""

    def __init__(self, session: Session, meter: Meter):
        self.session, self.batches = session, iter(meter)
        self.held: tuple[Any] | None = None
        self.epoch = 0

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        session = self.session
        if self.held is not None:
            (batch,), self.held = self.held, None
        else:
            try:
                batch = next(self.batches)
            except StopIteration:  # the windows are done
                session.finish()
                raise
            ended = session.loader.epochs_ended if session.loader is not None else 0
            if ended != self.epoch:  # the batch opens the loader's next epoch: the script's epoch ends first
                self.epoch, self.held = ended, (batch,)
                raise StopIteration
        session.handed_out += 1
        session.marks.put(batches=session.handed_out)
        return batch


def _join_ranks(timeout_s: float) -> _dist.Ranks:
    """This rank's place among the script's ranks, with a gloo group for the meter's agreements."""
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(
            "the script iterated its training DataLoader under torchrun before joining a process "
            "group: script mode needs torch.distributed.init_process_group() called first"
        )
    backend = str(dist.get_backend())
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return _dist.Ranks(dist.get_rank(), int(os.environ.get("LOCAL_RANK") or 0), dist.get_world_size(), backend, control)


def _device() -> torch.device:
    """The script's training device: its current CUDA device once it has initialised CUDA, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
