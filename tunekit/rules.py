"""Every rule the sweep decides by, defined once with its named thresholds.

The plan, the analysis, the diagnosis, the environment warnings and the benchmarks import these; none re-derives
them.
docs/rules.md explains each with the measurements behind it.

Two kinds of noise appear here and nowhere else:

* the **run's band**, ``max(tolerance, run noise, run-to-run spread)``: how far below the best a config may fall
  and still count as "within noise" of it. The run noise is the median window CV of the comparable trials at or
  above their median throughput, where the knee and the best compete: one erratic trial widens the band neither for
  itself nor for the rest once that half holds three trials, and the steady, data-starved low end does not narrow
  it. The spread is what the repeats of the configs a decision rests on measured between runs.
* a **trial's margin**, ``max(tolerance, the trials' own window CVs)``: how much one or two single measurements may
  be off, used where one trial is compared with another (a ceiling's upper bound, pinned against unpinned).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import mean, median
from typing import Any

from tunekit.config import Selection
from tunekit.contract import Mode, Stage
from tunekit.records import TrialRow, compute_ceiling

__all__ = [
    "KNEE_STAGES", "MIN_POINTS", "NEAR_CEILING", "OVERHEAD_RATIO", "STARVED_WAIT", "NO_WAIT", "STREAM_FULL", "NOISY_CV",
    "changes_result",
    "CPU_SATURATED", "CPU_BUSY", "WORKER_WAITING", "MEMORY_WALL_MARGIN", "HOST_MEMORY_WARN", "SHM_WARN",
    "HOT_GPU_C", "BENIGN_THROTTLE", "fits", "past_memory_limit", "run_noise", "run_spread", "runs_interval", "band",
    "gain_margin",
    "gain_interval", "needed",
    "trial_margin",
    "can_reach", "knee_stages", "of_ceiling", "SYNC_SHARE", "SCALING_HEALTHY", "scaling_efficiency",
    "communication_bound", "rate_interval", "window_rate", "epoch_rate", "settling", "window_stop", "input_bound",
    "worker_core_share", "waits_on_data", "machine_noise", "disturbed", "keeps_cpus_busy", "BUSY_HOST",
    "DISTURBED_BAND",
    "other_cpu_share", "busy_host", "MATMUL_SHARE_HIGH", "FLOP_BACKWARD_BAND", "flops_uncertain", "flops_per_item",
    "peak_trial", "flop_share",
    "SAME_MEMORY", "MACHINE_HARDWARE", "MACHINE_SOFTWARE", "machine_changes", "check_margin", "rate_check",
]

# --- selection -----------------------------------------------------------------------------------------------

KNEE_STAGES: tuple[Stage, ...] = tuple(s for s in Stage if s.knee)
"""The stages whose trials run end to end and may be chosen as the knee (``Stage.knee``), in the order the staged
plan runs them (the enum's)."""

MIN_POINTS = 2
"""Completed candidates a knee needs: with one point there is nothing to compare."""


def knee_stages(before: Stage | None = None) -> tuple[Stage, ...]:
    """The knee stages that run before ``before`` (all of them for None): the trials a stage refines."""
    return KNEE_STAGES if before is None else KNEE_STAGES[: KNEE_STAGES.index(before)]


def changes_result(row: TrialRow) -> bool:
    """Whether the trial set a user-defined knob whose values may change what training learns (``search.extra``,
    ``changes_result: true``) away from its baseline: it is measured and reported, never chosen."""
    return bool(row.measurement.changes_result)


def fits(row: TrialRow, selection: Selection) -> bool:
    """Whether a trial left at least ``selection.min_headroom`` of its memory free (unknown headroom fits)."""
    return row.headroom is None or row.headroom >= selection.min_headroom


def past_memory_limit(row: TrialRow, selection: Selection) -> bool:
    """A batch that ran out of memory, or fit only under the headroom limit: beyond the memory boundary (the
    compute stage goes on to smaller batches)."""
    return row.status == "oom" or (row.ok and not fits(row, selection))


def run_noise(rows: Iterable[TrialRow]) -> float:
    """The run noise of comparable trials: the median window CV of those at or above their median throughput."""
    rows = list(rows)
    if not rows:
        return 0.0
    middle = median(r.rate for r in rows)
    return float(median(r.noise_cv for r in rows if r.rate >= middle))


def run_spread(rows: Iterable[TrialRow]) -> float:
    """The run-to-run spread the repeats measured: the pooled relative standard deviation of the runs of every
    config measured more than once (``TrialRow.runs``: each run's rate, the config's runs alternating with the other
    repeated configs' on the same machine); 0 when no config was."""
    groups = [r.runs for r in rows if len(r.runs) > 1]
    df = sum(len(g) - 1 for g in groups)
    if not df:
        return 0.0
    squares = sum(sum((x / mean(g) - 1.0) ** 2 for x in g) for g in groups)
    return math.sqrt(squares / df)


def runs_interval(runs: int, spread: float, df: int) -> float:
    """Relative half-width of the 95 % interval of the mean of ``runs`` runs of a config, from the run-to-run
    ``spread`` pooled over ``df`` degrees of freedom (Student's t)."""
    t = _T975[df - 1] if 0 < df <= len(_T975) else 1.96
    return t * spread / math.sqrt(runs) if df > 0 else math.inf


def band(rows: Iterable[TrialRow], selection: Selection, spread: float | None = None) -> float:
    """The run's band: max(tolerance, run noise of ``rows``, the run-to-run spread: ``spread`` when given (measured
    over every repeated config of the run, the script's own settings too), else their repeats')."""
    rows = list(rows)
    return max(selection.tolerance, run_noise(rows), run_spread(rows) if spread is None else spread)


def gain_margin(band: float, *rows: TrialRow) -> float:
    """How much one config must beat another by to be faster beyond doubt: the run's band, or the sum of the two
    rates' interval half-widths (``TrialRow.interval``: the windows', or the repeated runs'; each at most 100 %)
    when wider."""
    intervals = sum(min(1.0, r.interval or 0.0) for r in rows)
    return max(band, intervals)


def gain_interval(a: TrialRow, b: TrialRow) -> tuple[float, float] | None:
    """The 95 % interval of ``a``'s rate over ``b``'s, from their rates' relative half-widths (``TrialRow.interval``:
    the windows', or the repeated runs'; combined in quadrature); None when either is unknown."""
    ia, ib = a.interval, b.interval
    if ia is None or ib is None or not math.isfinite(ia) or not math.isfinite(ib) or not b.rate:
        return None
    ratio, half = a.rate / b.rate, math.hypot(ia, ib)
    return ratio * max(0.0, 1.0 - half), ratio * (1.0 + half)


def needed(best: TrialRow, allowed: float) -> float:
    """The throughput a config must reach to be within ``allowed`` of ``best``."""
    return best.rate * (1.0 - allowed)


def trial_margin(selection: Selection, *rows: TrialRow) -> float:
    """How much single measurements may be off: max(tolerance, each trial's window CV)."""
    return max([selection.tolerance, *(r.noise_cv for r in rows)])


def can_reach(ceiling: TrialRow, target: float, selection: Selection, ranks: int = 1) -> bool:
    """Whether a config of ``ranks`` ranks bounded by ``ceiling`` (a loader-alone or compute-alone trial of one)
    could still reach ``target``: the ceiling, ``ranks`` times over, plus its own margin is at least the target."""
    return ceiling.rate * ranks * (1.0 + trial_margin(selection, ceiling)) >= target


# --- measurement ---------------------------------------------------------------------------------------------

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
"""Student's t, two-sided 95 %, for 1 ... 15 degrees of freedom (1.96 beyond)."""


def window_rate(items: Sequence[float], seconds: Sequence[float]) -> float:
    """A trial's throughput: its windows' items over their time. The windows are contiguous and close at the end
    of a loader round, so their lengths differ: a round that finishes early joins the next in one long, fast window
    while slow rounds stay windows of their own, and a median of window rates leans towards the slow rounds (by up
    to 9 % on H200 trials of 16 CPU-decoding workers). The ratio of sums weighs every second once."""
    total = sum(seconds)
    return sum(items) / total if total > 0 else 0.0


def epoch_rate(epoch_items: float, steady: float, boundary_s: float) -> float:
    """The rate over whole epochs of ``epoch_items`` each: the epoch's items at the ``steady`` rate inside an epoch,
    plus ``boundary_s`` between epochs (evaluation, checkpoint, logging, the loader's restart)."""
    return epoch_items / (epoch_items / steady + boundary_s)


def rate_interval(items: Sequence[float], seconds: Sequence[float]) -> float:
    """Relative half-width of the 95 % confidence interval of :func:`window_rate` (the ratio estimator's standard
    error over the windows; for windows of equal length, the t-interval of their mean rate); inf below two
    windows."""
    n = len(items)
    if n < 2 or sum(seconds) <= 0:
        return float("inf")
    rate = window_rate(items, seconds)
    if rate <= 0:
        return float("inf")
    spread = sum((s - rate * t) ** 2 for s, t in zip(items, seconds, strict=True)) / (n - 1)
    se = (spread / n) ** 0.5 / (sum(seconds) / n)
    t = _T975[n - 2] if n - 2 < len(_T975) else 1.96
    return t * se / rate


def settling(rates: list[float], min_windows: int, precision: float) -> int:
    """Leading windows still settling (left out of the measurement). The cut is the marginal standard error rule's
    (MSER, White 1997: the cut d minimising the kept windows' squared deviations over (n - d)^2, d at most half the
    windows and leaving at least ``min_windows``), so a ramp of several windows goes as well as one slow first
    window. It is then moved back until the windows it leaves out lie all on one side of the kept windows' mean (a
    ramp, not noise on both sides) and the last of them farther than ``precision`` from it."""
    n = len(rates)
    cuts = range(min(n - min_windows, n // 2) + 1)
    if len(cuts) < 2:
        return 0

    def mser(d: int) -> float:
        kept = rates[d:]
        mean = sum(kept) / len(kept)
        return sum((r - mean) ** 2 for r in kept) / len(kept) ** 2

    drop = min(cuts, key=mser)
    while drop:
        mean = sum(rates[drop:]) / (n - drop)
        one_side = len({r > mean for r in rates[:drop]}) == 1
        if one_side and abs(rates[drop - 1] - mean) > precision * mean:
            break
        drop -= 1
    return drop


def window_stop(items: Sequence[float], seconds: Sequence[float], min_windows: int, max_windows: int,
                precision: float | None, needed: float | None = None) -> str | None:
    """Why a trial stops measuring after these windows (items and seconds of each), or None to measure another:
    ``fixed`` (no precision asked, ``min_windows`` done), ``below_band`` (the settled windows' interval lies wholly
    below ``needed``, the rate that would bring the trial within the band of the best so far: more windows cannot
    make it the knee; judged from two windows on, the t-interval of so few being wide enough to hold only a clear
    miss), ``precise`` (``min_windows`` done and the settled windows' interval within ``precision``),
    ``max_windows``."""
    n = len(items)
    if precision is None:
        return "fixed" if n >= min_windows else None
    if n < 2:
        return None
    drop = settling([s / t if t > 0 else 0.0 for s, t in zip(items, seconds, strict=True)], min_windows, precision)
    kept, kept_s = items[drop:], seconds[drop:]
    interval = rate_interval(kept, kept_s)
    if needed is not None and window_rate(kept, kept_s) * (1.0 + interval) < needed:
        return "below_band"
    if n < min_windows:
        return None
    if interval <= precision:
        return "precise"
    return "max_windows" if n >= max_windows else None


# --- diagnosis -----------------------------------------------------------------------------------------------

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

# --- environment ---------------------------------------------------------------------------------------------

BUSY_HOST = 0.5
"""Share of the usable CPUs that processes outside a trial may keep busy before its figures count as disturbed
(a warning on the trial, and its verdict ``shared-host``): half, so that a CI agent's or an editor's background
work does not trip it, while another job on the machine (1.7 of 2 CPUs) does."""

DISTURBED_BAND = 0.10
"""A run's noise band wider than this says first, in the console, report.md and recommended.yaml, that the figures
are disturbed and the pick uncertain (a quiet machine's windows spread 1-4 %)."""


def other_cpu_share(row: TrialRow) -> float | None:
    """The share of the trial's usable CPUs that other processes kept busy during its windows, or None."""
    m = row.measurement
    if m.other_cpu_cores is None or not m.cpu_count:
        return None
    return m.other_cpu_cores / m.cpu_count


def busy_host(row: TrialRow) -> bool:
    """Other processes kept more than BUSY_HOST of the trial's usable CPUs busy."""
    share = other_cpu_share(row)
    return share is not None and share > BUSY_HOST


HOST_MEMORY_WARN = 0.80
"""Share of the machine's RAM a trial's process tree may use before the sweep warns."""

SHM_WARN = 0.80
"""Share of /dev/shm the loader's in-flight batches may need before the sweep warns."""

HOT_GPU_C = 85
"""GPU temperature (C) at which the sweep warns."""

BENIGN_THROTTLE = frozenset({"gpu_idle", "sw_power_cap", "applications_clocks_setting"})
"""NVML clock-event reasons that do not disturb a measurement."""


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
        if (p.device_uuid == m.device_uuid) if m.device_uuid else (p.device, p.device_name) == (m.device,
                                                                                                 m.device_name):
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
        efficiency is None or efficiency < SCALING_HEALTHY)


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


# --- check: a committed recommendation against a fresh trial of it (tunekit check) -----------------------------

MACHINE_HARDWARE: tuple[str, ...] = ("device", "gpu", "gpus", "cpu", "cpus", "memory_bytes")
"""The keys of a machine fingerprint (``env.machine_fingerprint``) that make another machine: the device the trial
ran on, the GPU model(s) and count, the CPU model and usable count, the host memory. The host name is not one: the
runners of a CI pool, or the VMs of one type, are one machine to a recommendation."""

MACHINE_SOFTWARE: tuple[str, ...] = ("torch", "cuda", "driver", "python")
"""The keys of a fingerprint that the same machine may change (an upgrade): compared, and named, not refused."""

SAME_MEMORY = 0.05
"""Host memory that differs by at most this share is the same (a VM type's RAM varies by the firmware's reserve;
another machine type differs by far more)."""


def machine_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]
                    ) -> tuple[list[tuple[str, Any, Any]], list[tuple[str, Any, Any]]]:
    """What differs between the machine a recommendation was tuned on and this one, as ``(key, recorded, current)``:
    the hardware (:data:`MACHINE_HARDWARE`: another machine, on which the recorded figure does not apply) and the
    software (:data:`MACHINE_SOFTWARE`: the same machine upgraded). A key that either side does not know (None, or
    missing from an older recommendation) is not compared; host memory within :data:`SAME_MEMORY` is the same."""
    def differs(key: str) -> bool:
        old, new = recorded.get(key), current.get(key)
        if old is None or new is None:
            return False
        if key == "memory_bytes":
            return abs(float(new) - float(old)) > SAME_MEMORY * max(float(old), 1.0)
        return old != new

    return ([(k, recorded.get(k), current.get(k)) for k in MACHINE_HARDWARE if differs(k)],
            [(k, recorded.get(k), current.get(k)) for k in MACHINE_SOFTWARE if differs(k)])


def check_margin(band: float, recorded_noise: float | None, recorded_interval: float | None, noise: float | None,
                 interval: float | None) -> float:
    """How far a fresh trial of the committed config may lie from the recorded figure and still hold: the widest of
    the recorded band (``max(tolerance, the run's noise)``), either trial's own window CV (as ``trial_margin``
    widens a comparison of single trials) and the two trials' 95 % intervals combined (``sqrt(a² + b²)``, the
    interval of their ratio; an older recommendation records no interval, and then only this trial's counts)."""
    intervals = [i for i in (recorded_interval, interval) if i is not None]
    combined = math.sqrt(sum(i * i for i in intervals)) if intervals else 0.0
    return max(band, recorded_noise or 0.0, noise or 0.0, combined)


def rate_check(recorded: float, rate: float, margin: float) -> str:
    """``regressed`` when ``rate`` lies more than ``margin`` below the recorded figure, ``faster`` when more than
    ``margin`` above it (the recommendation still holds; a cheaper config may now do), else ``holds``."""
    change = rate / recorded - 1.0
    if change < -margin:
        return "regressed"
    return "faster" if change > margin else "holds"
