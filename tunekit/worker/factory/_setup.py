"""A trial's set-up: its config with the user-defined knobs set, its ranks, its device, the workload and loader."""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from tunekit.config import Config, extra_knobs, from_dict, set_dotted
from tunekit.contract import Knobs, TrialSpec
from tunekit.contract import process as names
from tunekit.worker import _dist
from tunekit.worker._modes import TrialMode
from tunekit.worker.factory._build import Built, build, make_loader, pick_device

__all__ = ["Setup", "set_up"]


@dataclass
class Setup:
    """A trial's workload, ready to measure, and what building it cost."""

    mode: TrialMode
    """What the trial measures (built, stepped and recorded as its mode says)."""
    cfg: Config
    device: torch.device
    built: Built
    loader_knobs: Knobs
    """The knobs the loader runs with (a compute trial's loader has no workers)."""
    loader: Any
    startup_s: float
    cuda_init_s: float
    ranks: _dist.Ranks | None
    loader_s: float = 0.0
    """Making the DataLoader (its workers start with its iterator, in the loop's set-up)."""


def set_up(spec: TrialSpec, mode: TrialMode) -> Setup:
    """Join the trial's ranks (if several), pick and initialise the device, build the workload and its loader, as
    ``mode`` builds them."""
    # Interpreter start plus imports (torch above all), or the fork from the fork server: part of every trial's
    # cost, outside its measurement; counted from the launcher's clock (a process's create time can be off by a
    # second in containers).
    started = os.environ.get(names.STARTED_AT)
    startup_s = max(0.0, time.time() - (float(started) if started else psutil.Process().create_time()))
    cfg = _trial_config(spec)
    torch.manual_seed(0)
    t_init = time.perf_counter()
    ranks, device_name = None, cfg.device
    if _dist.launched():  # one rank of several: its own GPU, in the trial's process group
        ranks, device_name = _dist.init(cfg.device, cfg.launch.backend, cfg.trial.timeout_s)
    device = pick_device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # creates the context now, so build_s holds only the workload
    cuda_init_s = time.perf_counter() - t_init
    built = build(cfg, spec.knobs, device, distributed=ranks is not None and mode.end_to_end)
    if spec.knobs.threads is not None:  # after the build: the knob has the last word over the workload's own
        torch.set_num_threads(spec.knobs.threads)
    knobs = mode.loader_knobs(spec.knobs)
    t_loader = time.perf_counter()
    loader = make_loader(built.dataset, knobs, device, cfg, None if ranks is None else (ranks.rank, ranks.world))
    loader_s = time.perf_counter() - t_loader
    return Setup(mode, cfg, device, built, knobs, loader, startup_s, cuda_init_s, ranks, loader_s)


def _trial_config(spec: TrialSpec) -> Config:
    """The config this trial runs: every user-defined knob (search.extra) set, at the trial's value or its
    baseline."""
    cfg = from_dict(spec.config, check_imports=False)
    knobs = extra_knobs(cfg)
    if not knobs:
        return cfg
    raw = copy.deepcopy(spec.config)
    chosen = dict(spec.knobs.extra)
    for knob in knobs:
        set_dotted(raw, knob.key, chosen.get(knob.key, knob.baseline))
    return from_dict(raw, check_imports=False)
