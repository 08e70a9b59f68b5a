"""One trial's verdict: a predicate per verdict (the evidence when it holds, None when it does not), tried in
VERDICTS order (docs/diagnosis.md)."""

from __future__ import annotations

from collections.abc import Callable

from tunekit import rules
from tunekit.analysis import single_gpu_twin
from tunekit.config import Selection
from tunekit.contract import Mode
from tunekit.diagnosis._facts import Evidence, Facts, Trials, facts_of
from tunekit.diagnosis._verdicts import VERDICTS, Verdict, compute_fix, verdict
from tunekit.records import TrialRow

# --- one predicate per verdict: the evidence when it holds, None when it does not ------------------------------


def _on_gpu(row: TrialRow) -> bool:
    return str(row.measurement.device or "").startswith("cuda")


def _shared_host(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    """Other processes kept the CPUs busy during the windows; or, off a GPU, the windows scattered as a shared
    machine's do (GPU advice only where there is a GPU)."""
    share = rules.other_cpu_share(row)
    noisy = not _on_gpu(row) and rules.machine_noise(row) and (row.mode == Mode.compute or f.wait <= rules.STARVED_WAIT)
    if not (rules.busy_host(row) or noisy):
        return None
    ev: Evidence = {"window noise (CV)": row.noise_cv}
    if share is not None:
        ev["CPUs other processes kept busy"] = (
            f"{row.measurement.other_cpu_cores:.1f} of {row.measurement.cpu_count} ({share:.0%})"
        )
    return ev


def _shared_gpu(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    if not _on_gpu(row):
        return None
    throttle = sorted(set((row.measurement.nvml or {}).get("throttle_reasons") or []) - rules.BENIGN_THROTTLE)
    # Noisy windows point at the GPU only when the loop is not waiting on data: a saturated input pipeline (CPU
    # contention among loader workers) makes windows jitter on its own, with the GPU to itself.
    gpu_bound = row.mode == Mode.compute or (row.mode == Mode.train and f.wait <= rules.STARVED_WAIT)
    if not (throttle or (rules.machine_noise(row) and gpu_bound)):
        return None
    ev: Evidence = {"window noise (CV)": row.noise_cv}
    if row.measurement.items_per_batch_cv:
        ev["items per batch, CV across windows"] = row.measurement.items_per_batch_cv
    if row.mode == Mode.train:
        ev["data wait"] = f.wait
    if throttle:
        ev["clock throttle reasons"] = ", ".join(throttle)
    return ev


def _memory_wall(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    limit = trials.selection.min_headroom
    if row.headroom is None or row.headroom >= limit + rules.MEMORY_WALL_MARGIN:
        return None
    ev: Evidence = {"memory headroom": row.headroom, "limit": limit}
    if trials.oom_batches:
        ev["OOM at batch"] = trials.oom_batches[0]
    return ev


def _h2d_copy(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    if row.mode != Mode.train:
        return None
    twin = f.twin
    if twin is not None and twin.gain > rules.trial_margin(trials.selection, row, twin.pinned):
        return {
            "gain with pinning": twin.gain,
            "pinned trial": twin.pinned.number,
            "fastest unpinned trial with as many workers or fewer": twin.unpinned.number,
            "data wait": f.wait,
        }
    # An unpinned step whose stream is never idle yet runs well below the compute ceiling spends the difference on
    # the stream in copies from pageable memory (the host blocks on them while queued compute drains, so its data
    # wait overlaps GPU work). CUDA-event spans wrap the whole step, so they also hold launches that a CPU-starved
    # host makes late: with the CPUs saturated the stream figure is evidence for the data verdict instead.
    if f.stream_full and twin is None and not (row.knobs.num_workers and f.cpus_saturated):
        return {
            "GPU busy (events)": f.busy,
            "of compute ceiling": f.of_ceiling,
            "data wait": f.wait,
            "pinned": "not measured at this batch",
        }
    return None


def _data_evidence(row: TrialRow, f: Facts) -> Evidence:
    ev: Evidence = {"data wait": f.wait}
    if f.of_ceiling is not None:
        ev["of compute ceiling"] = f.of_ceiling
    if f.stream_full:  # the host's wait overlaps GPU work: say so, and what pinning measured against this trial
        ev["GPU busy (events)"] = f.busy
        if f.twin is None:
            ev["pinned"] = "not measured at this batch"
        elif row.rate > 0:
            ev[f"pinned (trial {f.twin.pinned.number}) vs this"] = f"{f.twin.pinned.rate / row.rate - 1:+.1%}"
    if row.noise_cv > rules.NOISY_CV:
        ev["window noise (CV)"] = row.noise_cv
    return ev


def _cpu_preprocessing(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    # with no workers the first fix is to add some, however busy the main process is
    if row.mode != Mode.train or not f.data_bound or not row.knobs.num_workers or not f.cpus_saturated:
        return None
    ev = {**_data_evidence(row, f), "workers": row.knobs.num_workers, "usable CPUs": f.cpus, "CPU busy": f.cpu_busy}
    if not f.trial_saturates and f.workers_compute:  # the machine's load counted too
        ev["machine CPU busy"] = f.system_busy
        ev["workers' share of their cores"] = f.worker_share
    if f.plateau is not None and not f.trial_saturates:
        here, below = f.plateau
        ev["loader ceiling"] = (
            f"{here.rate:.1f} at {here.knobs.num_workers} workers vs {below.rate:.1f} at {below.knobs.num_workers}"
        )
    return ev


def _data_starved(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    # without workers, the fix is to add some, unless the run measured that: then the CPUs are shared
    if row.mode != Mode.train or not f.data_bound or trials.workers_no_faster(row) is not None:
        return None
    ev = {**_data_evidence(row, f), "workers": row.knobs.num_workers}
    if f.cpu_busy is not None:
        ev["CPU busy"] = f.cpu_busy
    cpu, wall = row.measurement.worker_cpu_per_item_s, row.measurement.worker_wall_per_item_s
    if cpu is not None and wall and f.worker_share is not None:
        ev[f"worker CPU vs wall time per {row.item}"] = f"{cpu * 1e3:.2f} vs {wall * 1e3:.2f} ms"
        ev["workers' share of their cores"] = f.worker_share
        if not f.workers_compute:
            ev["workers"] = f"{row.knobs.num_workers} (waiting, not computing)"
    return ev


def _communication_bound(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    if row.mode != Mode.train or row.knobs.ranks < 2:
        return None
    single = single_gpu_twin(trials.rows, row)
    efficiency = rules.scaling_efficiency(row, single) if single is not None else None
    if not rules.communication_bound(row, efficiency):
        return None
    ev: Evidence = {
        "gradient sync share of a step": row.measurement.sync_share,
        "data wait": f.wait,
        "ranks": row.knobs.ranks,
    }
    if efficiency is not None and single is not None:
        ev[f"scaling efficiency vs 1 GPU (trial {single.number})"] = efficiency
    if row.knobs.grad_accum > 1:
        ev["accumulation"] = row.knobs.grad_accum
    return ev


def _gpu_preprocessing(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    # the compute ceiling stages a batch already decoded: at a step that does not wait for data, the time beyond
    # the ceiling's step is the decoding and augmentation the step does on the device
    if row.mode != Mode.train or not row.measurement.input_on_device or f.data_bound:
        return None
    if f.of_ceiling is None or f.of_ceiling >= rules.NEAR_CEILING:
        return None
    ev: Evidence = {
        "of compute ceiling": f.of_ceiling,
        "step time beyond the model's on a ready batch": 1.0 - f.of_ceiling,
        "data wait": f.wait,
    }
    ahead = row.measurement.device_input_wait_frac
    if ahead is not None and row.measurement.input_ahead:
        ev["input work"] = "one batch ahead, beside the step"
        ev["wait on the device-side input work"] = ahead
    if f.busy is not None:
        ev["GPU busy (events)"] = f.busy
    return ev


def _overhead_bound(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    below = f.of_ceiling is None or f.of_ceiling < rules.NEAR_CEILING
    if row.mode == Mode.loader or (row.mode == Mode.train and below):
        return None
    ratio = trials.overhead_ratio(row.knobs.batch_size)
    if ratio is None or ratio <= rules.OVERHEAD_RATIO:
        return None
    ev: Evidence = {"of compute ceiling": f.of_ceiling} if row.mode == Mode.train else {}
    ev[f"per-{row.item} time vs the best batch"] = f"{ratio:.2f}x"
    return ev


def _cpu_contention(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    """With workers: below the compute ceiling, not waiting on data, the CPUs kept busy (the step itself is slowed,
    by launches a CPU-starved process makes late on a GPU, by its arithmetic on a CPU device). Without: waiting on
    its own loading, while the trials with workers kept the CPUs busy and were no faster."""
    if row.mode != Mode.train or row.knobs.ranks > 1:
        return None  # several ranks below the ceiling without waiting: gradient sync is the first suspect
    ev: Evidence = {
        **({"of compute ceiling": f.of_ceiling} if f.of_ceiling is not None else {}),
        "data wait": f.wait,
        "CPU busy": f.cpu_busy,
        "usable CPUs": f.cpus,
    }
    if row.knobs.num_workers:
        if f.data_bound or not f.trial_saturates or f.of_ceiling is None or f.of_ceiling >= rules.NEAR_CEILING:
            return None
        return {**ev, "workers": row.knobs.num_workers}
    peer = trials.workers_no_faster(row)
    if peer is None or not f.data_bound:
        return None
    return {
        **ev,
        "workers": 0,
        f"with workers (best, trial {peer.number})": (
            f"{peer.knobs.num_workers} workers, {peer.rate:.1f} {peer.unit}/s at batch {peer.knobs.batch_size}, "
            f"CPU busy {peer.measurement.cpu_util_frac or 0.0:.0%}: no faster"
        ),
    }


def _compute_bound(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    if row.mode == Mode.compute:
        ev: Evidence = {"data wait": f.wait}
    elif row.mode == Mode.train and f.of_ceiling is not None and f.of_ceiling >= rules.NEAR_CEILING:
        ev = {"of compute ceiling": f.of_ceiling, "data wait": f.wait}
    else:
        return None
    if f.flop_share is not None:  # the fix turns on it (compute_fix), unless its count is uncertain
        ev["of the device's measured matmul peak"] = f.flop_share
        if f.flops_uncertain is not None:
            low, high = rules.FLOP_BACKWARD_BAND
            ev["FLOP count uncertain: its backward counted"] = (
                f"{f.flops_uncertain:.1f}x its forward (expected {low:g}-{high:g}x)"
            )
    return ev


def _unattributed(row: TrialRow, f: Facts, trials: Trials) -> Evidence | None:
    if row.mode != Mode.train:
        return None  # a loader-alone trial measures a ceiling, not the job
    ev: Evidence = {
        "of compute ceiling": f.of_ceiling if f.of_ceiling is not None else "not measured",
        "data wait": f.wait,
    }
    if f.busy is not None:
        ev["GPU busy (events)"] = f.busy
    return ev


PREDICATES: dict[str, Callable[[TrialRow, Facts, Trials], Evidence | None]] = {
    "shared-host": _shared_host,
    "shared-gpu": _shared_gpu,
    "memory-wall": _memory_wall,
    "h2d-copy": _h2d_copy,
    "cpu-preprocessing": _cpu_preprocessing,
    "data-starved": _data_starved,
    "communication-bound": _communication_bound,
    "gpu-preprocessing": _gpu_preprocessing,
    "cpu-contention": _cpu_contention,
    "overhead-bound": _overhead_bound,
    "compute-bound": _compute_bound,
    "unattributed": _unattributed,
}
assert tuple(PREDICATES) == VERDICTS


def classify(row: TrialRow, trials: Trials) -> Verdict | None:
    """The first verdict, in VERDICTS order, whose predicate holds for this trial."""
    facts = facts_of(row, trials)
    for name in VERDICTS:
        evidence = PREDICATES[name](row, facts, trials)
        if evidence is not None:
            return verdict(
                name,
                evidence,
                row.number,
                compute_fix(None if facts.flops_uncertain is not None else facts.flop_share)
                if name == "compute-bound"
                else None,
            )
    return None


def trial_verdicts(rows: list[TrialRow], selection: Selection) -> dict[int, Verdict]:
    """The verdict of each completed trial that has one (every end-to-end trial does), keyed by trial number."""
    trials = Trials(rows, selection)
    out = {}
    for row in rows:
        if row.ok:
            found = classify(row, trials)
            if found is not None:
                out[row.number] = found
    return out
