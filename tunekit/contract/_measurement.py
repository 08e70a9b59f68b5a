"""measurement.json as a typed record: the statuses, the measurement, its versions, and the records of failed and
skipped trials."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tunekit.contract._words import Mode

STATUSES: tuple[str, ...] = ("ok", "oom", "timeout", "crashed", "illegal_access", "bad_output", "diverged", "skipped")
"""How a trial ended: ok (measured), a failure (oom ... diverged: a NaN or Inf loss), or skipped (the plan showed
it could not be the knee, so it never ran)."""


MEASUREMENT_VERSION = 2
"""The version of measurement.json this record reads and writes. Version 1 (files without ``version``: every run
recorded before it) named throughput ``samples_per_s`` whatever the unit; :meth:`Measurement.from_dict` maps it."""

_V1_NAMES: dict[str, str] = {
    "samples_per_s": "rate",
    "samples_per_s_windows": "rate_windows",
    "measured_samples": "measured_items",
    "sample_time_s": "item_time_s",
    "worker_cpu_per_sample_s": "worker_cpu_per_item_s",
    "worker_wall_per_sample_s": "worker_wall_per_item_s",
}
"""Version 1's names of the fields version 2 renamed (they counted items of ``unit``, tokens too, as samples)."""


@dataclass(kw_only=True)
class Measurement:
    """measurement.json as a record: one trial's outcome and figures (docs/measurement.md, docs/distributed.md).

    A completed trial (status ``ok``) fills the figures; a failed or skipped one holds its identity, status and
    reason, the rest None. Throughput counts items of ``unit`` (samples, or tokens for text): every ``rate`` and
    ``*_item*`` field is in that unit. Shares are fractions from 0 to 1; times are seconds; memory is bytes.
    """

    version: int = MEASUREMENT_VERSION
    """The measurement.json version (:data:`MEASUREMENT_VERSION`); files without one are version 1."""

    # --- identity and outcome -------------------------------------------------------------------------------
    status: str
    """How the trial ended: one of :data:`STATUSES`."""
    reason: str = ""
    """One line saying why, for every status but ``ok`` (empty then)."""
    number: int = -1
    """Run-wide trial number (the ``trials/<n>/`` folder); -1 when unknown."""
    stage: str = ""
    """The plan stage that asked for the trial (``single`` for ``tunekit trial``): a :class:`Stage`'s word, kept as
    the file holds it (``records.TrialRow`` parses it)."""
    mode: str = Mode.train.value
    """``train`` (end to end), ``compute`` (model on a batch staged on the device) or ``loader`` (the loader
    alone): a :class:`Mode`'s word."""
    run: int = 0
    """0 for a config's first measurement, k for its k-th repeat (``TrialSpec.run``)."""
    params: dict[str, Any] = field(default_factory=dict)
    """The knobs as run (``Knobs.to_dict()``), plus ``non_blocking`` (equal to ``pin_memory``) when measured."""
    skip_bound: float | None = None
    """A skipped trial: the throughput the plan showed it cannot exceed (a loader ceiling, or a count with fewer
    workers... that fell out of the band), ``unit``/s."""
    skip_bound_trial: int | None = None
    """The trial that shows ``skip_bound``."""
    changes_result: list[str] | None = None
    """Config keys of the user-defined knobs set away from their baseline that may change what training learns
    (``search.extra``, ``changes_result: true``): such a trial is never a knee candidate."""

    # --- throughput, windows and noise ----------------------------------------------------------------------
    rate: float | None = None
    """Throughput, items of ``unit`` per second (all ranks): the kept windows' items over their time
    (``rules.window_rate``). None for a trial that was not measured."""
    rate_windows: list[float] | None = None
    """Each kept window's throughput, items of ``unit`` per second."""
    seconds_windows: list[float] | None = None
    """Each kept window's wall time, s."""
    steps_windows: list[int] | None = None
    """Each kept window's optimizer steps."""
    noise_cv: float | None = None
    """Sample standard deviation of the window rates over their mean (a share; 0 with one window)."""
    noise_range: float | None = None
    """(max − min) of the window rates over ``rate`` (a share)."""
    step_time_s: float | None = None
    """Window time per optimizer step, s (the slowest rank's in a multi-rank trial)."""
    item_time_s: float | None = None
    """Window time per item of ``unit``, s."""
    measured_s: float | None = None
    """Wall time of the kept windows together, s."""
    measured_steps: int | None = None
    """Optimizer steps in the kept windows."""
    measured_items: float | None = None
    """Items of ``unit`` in the kept windows (all ranks)."""
    items_per_batch_mean: float | None = None
    """Items of ``unit`` per micro-batch over the windows (the mean tokens per batch for text)."""
    items_per_batch_cv: float | None = None
    """CV across windows of the items per micro-batch (a share; 0 for fixed-size batches): the noise the batches'
    content brings, which ``rules.machine_noise`` discounts."""

    # --- where the loop waits, CPU use ----------------------------------------------------------------------
    data_wait_frac: float | None = None
    """Share (0–1) of window time spent blocked on the next batch (the ranks' mean in a multi-rank trial)."""
    device_input_wait_frac: float | None = None
    """Share (0–1) of window time the step waited while the dataset's own ``batch_to_device`` thread moved the
    next batch (0 without ``input_ahead``); ``data_wait_frac`` holds only the rest."""
    gpu_busy_frac: float | None = None
    """Share (0–1) of window time inside the CUDA-event spans around each micro-batch's work, capped at 1; None
    off CUDA."""
    cpu_util_cores: float | None = None
    """CPU seconds of the trial's whole process tree over window time: cores kept busy."""
    cpu_util_frac: float | None = None
    """``cpu_util_cores / cpu_count``: share (0–1) of the usable CPUs the trial kept busy."""
    system_cpu_pct: float | None = None
    """Machine-wide CPU utilisation (every process, every CPU), percent, mean over the windows."""
    other_cpu_cores: float | None = None
    """CPU cores that processes outside the trial's tree kept busy during the windows, on average: the busy cores
    among the trial's usable CPUs (its affinity) less the trial's own ``cpu_util_cores``; None for a multi-rank
    trial (its ranks are each other's outside) and in older files."""
    worker_cpu_s: float | None = None
    """CPU seconds of the processes below the main one (the loader workers) over the windows; None without
    workers."""
    worker_cpu_per_item_s: float | None = None
    """``worker_cpu_s / measured_items``: loader-worker CPU seconds per item of ``unit``, s."""
    worker_wall_per_item_s: float | None = None
    """``num_workers × measured_s / measured_items`` (all ranks' workers): worker wall time available per
    delivered item of ``unit``, s."""

    # --- warm-up, compile, start-up and build ---------------------------------------------------------------
    warmup_s: float | None = None
    """The whole warm-up, first batch and settling windows included, s."""
    warmup_batches: int | None = None
    """Micro-batches the warm-up consumed (set aside and trained)."""
    warmup_set_aside: int | None = None
    """Batches prepared during start-up, taken from the loader's queues without a step."""
    batch_bytes: int | None = None
    """Bytes of the first batch's tensors: what a loader worker passes through /dev/shm per batch, bytes."""
    first_batch_wait_s: float | None = None
    """Fetch time of the first batch, s."""
    first_step_s: float | None = None
    """The first batch fetched and worked, s."""
    compile_s: float | None = None
    """``first_step_s − first_batch_wait_s`` when compiling, else 0, s."""
    startup_s: float | None = None
    """From the launcher starting the trial to the start of set-up (interpreter and imports, or the fork), s."""
    cuda_init_s: float | None = None
    """Device selection and CUDA context creation, s."""
    build_s: float | None = None
    """Dataset, model, optimizer, loss and torch.compile wrapper built, s."""
    loop_setup_s: float | None = None
    """The DataLoader made and its iterator (and workers) started, up to the warm-up, s."""
    teardown_s: float | None = None
    """From the end of the last window to the end of ``trial_s`` (memory read, sync probe, workers stopped), s."""
    trial_s: float | None = None
    """The worker's ``measure()`` from set-up to the end of the teardown (start-up excluded), s."""

    # --- the data -------------------------------------------------------------------------------------------
    unit: str | None = None
    """What throughput counts (``workload.unit``): ``samples``, ``tokens``, …; None for an unmeasured trial."""
    epoch_boundary_in_trial: bool | None = None
    """Whether the loader's epoch ended inside the trial."""
    epochs_ended: int | None = None
    """How often the loader's epoch ended inside the trial (its worker restarts are part of the measurement)."""
    epoch_batches: int | None = None
    """The loader's batches per epoch when every window held whole epochs (an epoch took at most two windows' time);
    None when the windows held whole loader rounds."""
    rate_in_epoch: float | None = None
    """Script mode (train): the steady rate inside an epoch, ``unit``/s: the windows, every epoch boundary left out;
    ``rate`` is the rate over whole epochs when a boundary was seen and the epoch's length is known."""
    boundary_s: float | None = None
    """Script mode (train): what one epoch boundary costs, s (the mean of those the trial saw): from the request
    that crossed the training loader's epoch end to the script's loop getting the next epoch's first batch (its
    evaluation, checkpoint, logging, the loader's restart); None when the trial saw none. With two or more seen, the
    first is left out: it pays what only the script's first epoch end does."""
    boundary_cv: float | None = None
    """Coefficient of variation of the epoch boundaries' seconds (two or more kept)."""
    boundaries_s: list[float] | None = None
    """Script mode (train): what each epoch boundary the trial saw cost, s, in order (``boundary_s`` leaves the
    first out when there are two or more: it pays the script's one-time costs)."""
    epoch_boundaries: int | None = None
    """Script mode (train): the epoch boundaries the trial saw after its first batch."""
    epoch_items: float | None = None
    """Script mode (train): one epoch's items (the loader's batches per epoch times the items a measured batch
    held); None for a loader without a length."""
    rate_whole_epoch: float | None = None
    """Script mode (train): ``epoch_items / (epoch_items / rate_in_epoch + boundary_s)``, ``unit``/s, the trial's
    ``rate`` when set; None without a boundary seen or an epoch length."""
    warnings: list[str] | None = None
    """What the trial noticed about the data (unsharded iterable workers, identical rank shards), one line each."""
    dataset_len: int | None = None
    """``len(dataset)`` in samples; None for a dataset without a length."""
    dataset_passes: float | None = None
    """Micro-batches consumed × batch / ``dataset_len``: passes over the dataset; None without a length."""
    input_on_device: bool | None = None
    """A ``train`` trial whose dataset moved each batch with its own ``batch_to_device`` (GPU decode)."""
    input_ahead: bool | None = None
    """That move ran one batch ahead, in a thread on a CUDA stream of its own."""
    loader_measured: dict[str, Any] | None = None
    """Script mode: the training DataLoader the trial measured, as the script built it and the knobs left it:
    ``index`` (its build order, from 1), ``found_by``, ``dataset`` (class name), ``length`` (samples),
    ``batch_size``, ``num_workers``, ``pin_memory``, ``prefetch_factor``; None for a factory workload."""

    asked: dict[str, Any] | None = None
    """Script mode: the knobs this trial set that the script's training DataLoader did not run with, as the trial
    asked for them (what it ran with is in ``params``): the script hard-codes the value, or ignores the flag
    filled in. None when it ran what was asked."""

    # --- host memory, CPUs ----------------------------------------------------------------------------------
    host_mem_peak_bytes: int | None = None
    """Peak PSS of the trial's process tree during the windows, bytes (every node's tree summed, multi-rank)."""
    host_mem_peak_trial_bytes: int | None = None
    """Peak PSS of the tree over the whole trial, warm-up included, bytes."""
    host_mem_rss_sum_peak_bytes: int | None = None
    """Peak of the summed RSS of the tree (shared pages counted in every process), bytes."""
    host_mem_total_bytes: int | None = None
    """The machine's RAM, bytes (summed over the nodes, multi-rank)."""
    host_processes: int | None = None
    """Most processes seen in the tree."""
    cpu_count: int | None = None
    """Usable CPUs of the trial (the smallest of affinity, CFS quota and SLURM's allotment, `config.cpu_budget`;
    summed over the nodes)."""
    torch_threads: int | None = None
    """``torch.get_num_threads()`` of the training process as measured."""

    # --- device and memory ----------------------------------------------------------------------------------
    device: str | None = None
    """The torch device, e.g. ``cuda:0`` or ``cpu``."""
    device_uuid: str | None = None
    """The GPU's UUID; None on the CPU."""
    device_name: str | None = None
    """e.g. ``NVIDIA H200``, or ``CPU: <model>``."""
    versions: dict[str, Any] | None = None
    """``python``, ``torch``, ``torchvision``, ``cuda``, ``cudnn``, ``tunekit`` as measured."""
    device_mem_total_bytes: int | None = None
    """The device's total memory (``cudaMemGetInfo``), bytes; None on the CPU."""
    device_mem_peak_allocated_bytes: int | None = None
    """The caching allocator's peak allocated over the windows (this process; the largest rank), bytes."""
    device_mem_peak_reserved_bytes: int | None = None
    """The caching allocator's peak reserved over the windows (this process; the largest rank), bytes."""
    device_mem_warmup_peak_reserved_bytes: int | None = None
    """Peak reserved up to the end of warm-up (compilation included), bytes."""
    headroom: float | None = None
    """Share (0–1) of memory left free at the peak: ``1 − peak reserved / total`` on a GPU, host memory on the
    CPU (the smallest rank's or node's)."""
    headroom_basis: str | None = None
    """Which memory ``headroom`` is of: ``device`` or ``host``."""
    nvml: dict[str, Any] | None = None
    """NVML samples over the windows: ``samples`` (polls), ``throttle_reasons`` and ``{mean, max, min}`` of
    ``utilization_gpu_pct``, ``utilization_mem_pct``, ``memory_used_bytes``, ``sm_clock_mhz``, ``power_w``,
    ``temperature_c``; None without NVML."""
    nvml_util_gpu_pct: float | None = None
    """Mean NVML GPU utilization over the windows, percent (the whole device, every process)."""
    nvml_mem_used_peak_bytes: int | None = None
    """Peak NVML memory used (the whole device, every process), bytes."""
    sync_share: float | None = None
    """Share (0–1) of an optimizer step that DDP's gradient sync adds and computation does not hide (the ranks'
    mean); None unless the trial ran several ranks."""
    pinned_peak_bytes: int | None = None
    """Peak of the pinned host allocator since warm-up (``torch.cuda.host_memory_stats``; the largest rank),
    bytes; None on the CPU."""

    # --- model FLOPs and the device's matmul peak -----------------------------------------------------------
    flops_per_item: float | None = None
    """Floating-point operations of one micro-batch's forward and backward per item of ``unit``, counted once
    after the windows with ``torch.utils.flop_counter.FlopCounterMode`` (the optimizer step left out); None where
    not counted (``flops_reason`` says why)."""
    flops_reason: str | None = None
    """Why ``flops_per_item`` is None, one line (a loader trial, several ranks, counting failed or found no matrix
    work); None when it was counted, and in script mode (the step is the script's own loop)."""
    flops_backward_ratio: float | None = None
    """The counted backward's FLOPs over the forward's (about 2 for matrix multiplies and convolutions; outside
    rules.FLOP_BACKWARD_BAND the count is uncertain); None when not counted, or counted with the workload's own
    update step whole."""
    matmul_peak_flops: float | None = None
    """The device's sustained rate of a large matrix multiply in the workload's precision, FLOP/s, measured after
    the windows by the one trial of the sweep whose spec asked for it (``TrialSpec.probe_peak``); None on the
    others."""
    matmul_peak_precision: str | None = None
    """What that probe multiplied in: ``bf16``, ``fp16``, ``tf32`` (fp32 with TF32 matmuls allowed, on CUDA) or
    ``fp32``."""
    matmul_peak_reason: str | None = None
    """Why a probe that was asked for gave no figure, one line (out of memory, say); None otherwise."""

    # --- why the trial stopped measuring --------------------------------------------------------------------
    stop_reason: str | None = None
    """``fixed``, ``precise``, ``below_band`` or ``max_windows`` (``rules.window_stop``)."""
    windows_measured: int | None = None
    """Windows measured, the settling ones included."""
    settling_windows: list[float] | None = None
    """The rates of the leading windows left out as still settling, items of ``unit`` per second."""
    settling_s: float | None = None
    """Wall time of those settling windows (counted in ``warmup_s``), s."""
    rate_interval: float | None = None
    """Relative half-width of the 95 % interval of ``rate`` (a share of it)."""

    # --- the launcher's -------------------------------------------------------------------------------------
    returncode: int | None = None
    """The trial process's exit code (negative: killed by that signal)."""
    launcher_wall_s: float | None = None
    """The trial's process from start (or fork) to reaped, kill included, s."""
    pid: int | None = None
    """The trial process's pid."""
    started_by: str | None = None
    """``fork server``, ``interpreter`` or ``torchrun`` (the trial's starter, ``launch.starter_for``)."""
    fork_server_refused: str | None = None
    """Why the fork server refused, on a single-process trial that therefore started a fresh interpreter."""

    # --- a failure ------------------------------------------------------------------------------------------
    exception: str | None = None
    """The exception class, when the worker classified the failure itself."""
    failed_at: float | None = None
    """When a rank of a multi-rank trial failed (``time.time()``, s since the epoch)."""

    # --- a multi-rank trial (docs/distributed.md) -----------------------------------------------------------
    host: str | None = None
    """Host name of rank 0 (each rank's is in ``per_rank``)."""
    rank: int | None = None
    """Global rank whose fields the merge started from (0)."""
    local_rank: int | None = None
    """That rank's rank on its node."""
    world: int | None = None
    """Ranks of the trial's process group (``WORLD_SIZE``)."""
    backend: str | None = None
    """The torch.distributed backend: ``nccl`` or ``gloo``."""
    node_mem_peak_bytes: int | None = None
    """Rank 0's node: peak PSS of its whole tree (torchrun, every rank, every worker), bytes."""
    node_processes: int | None = None
    """Rank 0's node: most processes seen in that tree."""
    workers_total: int | None = None
    """Loader workers of all ranks together."""
    data_wait_frac_max: float | None = None
    """The worst rank's ``data_wait_frac``, a share (0–1)."""
    ranks: int | None = None
    """Ranks merged."""
    nodes: int | None = None
    """Nodes the ranks ran on."""
    slowest_rank: int | None = None
    """The rank with the lowest throughput."""
    rank_spread: float | None = None
    """(fastest − slowest rank's rate) / fastest, a share (0–1)."""
    per_rank: list[dict[str, Any]] | None = None
    """Each rank's own figures, in rank order: ``rank``, ``rate`` (items of ``unit``/s), ``data_wait_frac``,
    ``step_time_s``, ``gpu_busy_frac``, ``noise_cv``, ``headroom``, ``sync_share``, ``pinned_peak_bytes``,
    ``cpu_util_cores``, ``worker_cpu_per_item_s``, ``device``, ``device_mem_peak_reserved_bytes``,
    ``nvml_util_gpu_pct``, ``host``, ``host_mem_peak_bytes``, under the names of the fields above."""

    other: dict[str, Any] = field(default_factory=dict)
    """Keys of the file this record does not define (from older or newer writers), kept so that :meth:`to_dict`
    writes back everything recorded. No stage reads them."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """The record of a measurement.json dict, any version: the one adapter for files on disk and study.db.

        A dict without ``version`` is version 1: its renamed fields (``samples_per_s`` …) are mapped to today's
        names, in ``per_rank`` too. Keys the record does not define go to :attr:`other`.

        Raises:
            ValueError: ``data`` is of a newer version than this record, or lacks ``status``.
        """
        version = int(data.get("version") or 1)
        if version > MEASUREMENT_VERSION:
            raise ValueError(f"measurement.json version {version} is newer than this tunekit's ({MEASUREMENT_VERSION})")
        if "status" not in data:
            raise ValueError("a measurement without a status")
        items = {k: v for k, v in data.items() if k not in ("version", "other")}
        if version == 1:
            items = _renamed_v1(items)
        names = _FIELD_NAMES
        known = {k: v for k, v in items.items() if k in names}
        record = cls(**known, other={k: v for k, v in items.items() if k not in names})
        record.held = frozenset(known)
        return record

    held = None  # not a field (no annotation): from_dict sets it on the instance
    """frozenset of the fields the file held (:meth:`from_dict`), None for a record made in this process (it
    holds every field): trials.csv has a column for what some trial of the run recorded, so older runs rebuild
    with their columns."""

    def to_dict(self) -> dict[str, Any]:
        """measurement.json as written: every field (None ones included) under version 2's names, ``version``
        first, then the :attr:`other` keys as they came."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "other"}
        data["version"] = MEASUREMENT_VERSION
        data["stage"], data["mode"] = str(self.stage), str(self.mode)  # a Stage or Mode as its plain word
        return {**data, **{k: v for k, v in self.other.items() if k not in data}}


def _renamed_v1(items: dict[str, Any]) -> dict[str, Any]:
    """A version-1 measurement's keys under version 2's names (``per_rank`` entries too)."""
    out = {_V1_NAMES.get(k, k): v for k, v in items.items()}
    if isinstance(out.get("per_rank"), list):
        out["per_rank"] = [
            {_V1_NAMES.get(k, k): v for k, v in p.items()} if isinstance(p, dict) else p for p in out["per_rank"]
        ]
    return out


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Measurement)) - {"version", "other"}
