"""Diagnosis: the verdicts' thresholds and the predicates they rest on (data waits, CPU use, memory, the model's
FLOP share, scaling across ranks, communication)."""

from __future__ import annotations

from collections.abc import Iterable

from tunekit.contract import Mode
from tunekit.records import TrialRow, compute_ceiling
from tunekit.rules._environment import busy_host

NEAR_CEILING = 0.90
"""An end-to-end trial at or above this share of its batch's compute ceiling is bound by the model, not the input
pipeline; below it, the input pipeline is the bound (and the plan tries smaller batches)."""


OVERHEAD_RATIO = 1.3
"""Per-sample step time this many times the best batch's: fixed per-step costs dominate (overhead-bound)."""


STARVED_WAIT = 0.20
"""Share of window time the loop blocks on the next batch above which a trial is data-bound."""


NO_WAIT = 0.02
"""Share of window time the loop blocks on the next batch below which more batches in flight cannot help."""


STREAM_FULL = 0.90
"""CUDA-event spans over wall time at or above which the stream has (almost) no idle gap between steps."""


NOISY_CV = 0.10
"""Window CV far above the 1-4 % of a quiet machine: the measurement is disturbed, unless the batches' content
varies as much (see :func:`machine_noise`)."""


CPU_SATURATED = 0.85
"""Share of the trial's usable CPUs its process tree kept busy above which the CPUs are the bound."""


CPU_BUSY = 0.50
"""CPU share above which a loader ceiling that stopped rising with more workers is blamed on the CPUs."""


WORKER_WAITING = 0.30
"""Loader workers that keep less than this share of the cores they could use busy (min(workers, CPUs)) wait (on
I/O, a remote store, a lock) rather than compute: more workers, even beyond the core count, overlap the waits."""


SYNC_SHARE = 0.25
"""Share of a training step (on a batch already on the device) that gradient synchronisation adds over the same
step under DDP's no_sync, above which communication is a bound of its own."""


SCALING_HEALTHY = 0.90
"""Scaling efficiency (N-rank throughput over N x one GPU's, same per-rank config) at or above which adding GPUs
pays off as it should."""


MEMORY_WALL_MARGIN = 0.05
"""Headroom within this of the limit is at the memory wall."""


MATMUL_SHARE_HIGH = 0.5
"""Share of the device's measured matmul peak (model FLOP utilisation, :func:`flop_share`) at or above which a
compute-bound step runs near what the card can do: the next lever is a cheaper model or a bigger card. Below it
the step leaves the matrix units idle for much of its time and kernel work has room (channels_last, a larger batch,
torch.compile, CUDA graphs, fused optimizers). Half: well-tuned large-model training reports 40-60 % of the
datasheet's dense bf16 rate (PaLM: 46 %), the measured peak lies below the datasheet's, and what a step spends
beyond its matrix work (normalisation, activations, the optimizer) counts no FLOPs."""


def of_ceiling(row: TrialRow, ceiling: TrialRow | None) -> float | None:
    """A trial's throughput per rank as a share of a (one-GPU) compute ceiling (None without one)."""
    return row.rate / row.knobs.ranks / ceiling.rate if ceiling is not None and ceiling.rate else None


FLOP_BACKWARD_BAND = (1.5, 2.5)
"""A backward counts about twice its forward's FLOPs in a model of matrix multiplies and convolutions (the input's
and the weights' gradients, each the forward's size; less where a layer needs only one). A count whose backward
over forward lies outside this band is uncertain: a miscounted op (torch's counter took a grouped convolution's
weight gradient for a dense one, ConvNeXt's backward at 200 times its forward), or frozen layers."""


def _counted(row: TrialRow, rows: Iterable[TrialRow]) -> TrialRow | None:
    """The trial whose FLOP count stands for ``row``'s model: its own, else the compute ceiling's at its batch (a
    trial of several ranks, or one recorded before trials counted them)."""
    if row.measurement.flops_per_item:
        return row
    ceiling = compute_ceiling(rows, row.knobs.batch_size)
    return ceiling if ceiling is not None and ceiling.measurement.flops_per_item else None


def flops_per_item(row: TrialRow, rows: Iterable[TrialRow]) -> float | None:
    """The FLOPs of a training step per item of ``unit`` for ``row``'s model (:func:`_counted`'s count)."""
    counted = _counted(row, rows)
    return counted.measurement.flops_per_item if counted is not None else None


def flops_uncertain(row: TrialRow, rows: Iterable[TrialRow]) -> float | None:
    """The backward-over-forward ratio of the count that stands for ``row``'s model when it lies outside
    :data:`FLOP_BACKWARD_BAND` (the count, and any share made of it, are then uncertain), else None."""
    counted = _counted(row, rows)
    ratio = counted.measurement.flops_backward_ratio if counted is not None else None
    low, high = FLOP_BACKWARD_BAND
    return ratio if ratio is not None and not low <= ratio <= high else None


def peak_trial(rows: Iterable[TrialRow], row: TrialRow) -> TrialRow | None:
    """The trial that measured the matmul peak of ``row``'s device (its GPU by UUID; off CUDA the same device and
    name) in the precision ``row`` ran (a user-defined knob may set ``workload.precision``), or None."""
    m = row.measurement
    precision = dict(row.knobs.extra).get("workload.precision")
    for other in rows:
        p = other.measurement
        if not p.matmul_peak_flops or dict(other.knobs.extra).get("workload.precision") != precision:
            continue
        if (
            (p.device_uuid == m.device_uuid)
            if m.device_uuid
            else (p.device, p.device_name) == (m.device, m.device_name)
        ):
            return other
    return None


def flop_share(row: TrialRow, rows: Iterable[TrialRow]) -> float | None:
    """Model FLOP utilisation: the trial's throughput per rank times :func:`flops_per_item` over its device's
    measured matmul peak (:func:`peak_trial`); None without either, and for a loader trial (it runs no model)."""
    if not row.ok or row.mode == Mode.loader:
        return None
    rows = list(rows)
    flops, peak = flops_per_item(row, rows), peak_trial(rows, row)
    if not flops or peak is None:
        return None
    return row.rate / row.knobs.ranks * flops / peak.measurement.matmul_peak_flops


def scaling_efficiency(multi: TrialRow, single: TrialRow) -> float | None:
    """Throughput of ``multi``'s ranks over that many times ``single``'s (the same per-rank config on one GPU)."""
    if not (multi.ok and single.ok and single.rate):
        return None
    return multi.rate / (multi.knobs.ranks * single.rate)


def communication_bound(row: TrialRow, efficiency: float | None) -> bool:
    """A multi-rank trial whose gradient sync takes over SYNC_SHARE of a step while the loop does not wait on data,
    and (when it was measured) scales below SCALING_HEALTHY."""
    share = row.measurement.sync_share
    if row.knobs.ranks < 2 or share is None or share < SYNC_SHARE:
        return False
    return (row.measurement.data_wait_frac or 0.0) <= STARVED_WAIT and (
        efficiency is None or efficiency < SCALING_HEALTHY
    )


def machine_noise(row: TrialRow) -> bool:
    """Window noise the machine made: over NOISY_CV, and not explained by batches whose content varies from window
    to window (variable-length text counted in tokens: the noise must exceed twice the items-per-batch CV)."""
    content = row.measurement.items_per_batch_cv or 0.0
    return row.noise_cv > NOISY_CV and row.noise_cv > 2 * content


def disturbed(row: TrialRow) -> bool:
    """A completed trial whose own figures were disturbed: other processes kept the CPUs busy during its windows
    (``busy_host``), or its windows scattered as the machine made them (``machine_noise``; a loader ceiling's scatter
    is its workers' own contention, not a disturbance). A resumed sweep measures such trials again."""
    return row.ok and (busy_host(row) or (machine_noise(row) and row.mode != Mode.loader))


def keeps_cpus_busy(row: TrialRow) -> bool:
    """Whether a trial's process tree kept over CPU_SATURATED of its usable CPUs busy: no CPU time is left for the
    loader to go faster, whatever the knobs that only rearrange when its batches are made (prefetch)."""
    return (row.measurement.cpu_util_frac or 0.0) > CPU_SATURATED


def worker_core_share(row: TrialRow) -> float | None:
    """The share of the cores the loader workers could use (min(workers, usable CPUs)) that they kept busy over the
    windows: their CPU time per item over their wall time per item, scaled by how oversubscribed they were.
    None when the trial has no workers or did not measure them."""
    cpu, wall = row.measurement.worker_cpu_per_item_s, row.measurement.worker_wall_per_item_s
    workers, cpus = row.knobs.num_workers * row.knobs.ranks, int(row.measurement.cpu_count or 0)
    if cpu is None or not wall or not workers or not cpus:
        return None
    return cpu / wall * workers / min(workers, cpus)


def waits_on_data(wait: float, share: float | None) -> bool:
    """A data-bound trial: the loop blocks on the next batch over STARVED_WAIT of the time and the trial runs below
    NEAR_CEILING of its compute ceiling (or has none to compare with)."""
    return wait > STARVED_WAIT and (share is None or share < NEAR_CEILING)


def input_bound(row: TrialRow, ceiling: TrialRow | None) -> bool:
    """Whether an end-to-end trial runs below :data:`NEAR_CEILING` of its batch's compute ceiling (False without a
    ceiling): the input pipeline, not the model, holds it back. A multi-rank trial must also wait on data: its
    ceiling is one GPU's without gradient sync, so sync alone also keeps it below."""
    share = of_ceiling(row, ceiling)
    if row.knobs.ranks > 1 and (row.measurement.data_wait_frac or 0.0) <= NO_WAIT:
        return False
    return share is not None and share < NEAR_CEILING
