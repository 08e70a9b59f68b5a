"""Why the GPU is not producing: verdicts with their evidence and the first fix, and environment warnings.

This automates the symptom -> cause -> fix tables of the field's troubleshooting guides (../shared/seeds/): look at
samples/s against the ceilings, at where the loop waits, at memory, and only then at utilization. Every verdict
names the numbers behind it; a trial with no finding gets none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tunekit.analysis import TrialRow, defaults_trial

__all__ = ["VERDICTS", "FIXES", "Verdict", "trial_verdicts", "run_verdicts", "environment_warnings", "STARVED_WAIT",
           "NEAR_CEILING", "STREAM_FULL"]

VERDICTS: tuple[str, ...] = ("shared-gpu", "memory-wall", "cpu-preprocessing", "data-starved", "h2d-copy",
                             "overhead-bound", "compute-bound")
"""The fixed vocabulary, in precedence order: when several hold for one trial, the first is reported."""

FIXES: dict[str, str] = {
    "data-starved": "raise num_workers (up to the usable cores) and prefetch_factor, keep workers persistent, and "
                    "pair pin_memory with non_blocking copies",
    "cpu-preprocessing": "decoding and augmentation are the bound: decode and augment on the GPU "
                         "(torchvision.io.decode_jpeg on the device, NVIDIA DALI), use pillow-simd, lower the input "
                         "resolution, or cache decoded samples",
    "overhead-bound": "launches and fixed per-step costs dominate: use a larger batch, CUDA graphs via "
                      "torch.compile(mode='reduce-overhead'), or kernel fusion via torch.compile",
    "memory-wall": "cap the batch below the OOM boundary and reach the effective batch with gradient accumulation "
                   "(search.target_effective_batch); bf16 or activation checkpointing free more",
    "h2d-copy": "host-to-device copies block compute: set pin_memory=True and copy with .to(device, "
                "non_blocking=True)",
    "compute-bound": "the input pipeline keeps up: speed up the model itself (torch.compile, bf16, channels_last, "
                     "fused optimizers) or use a faster GPU",
    "shared-gpu": "the measurement is disturbed: check nvidia-smi for other processes, clock throttling (power, "
                  "thermal), and rerun on an idle GPU",
}

_BENIGN_THROTTLE = {"gpu_idle", "sw_power_cap", "applications_clocks_setting"}
_NOISY_CV = 0.10  # window noise far above the ~1-4 % of a quiet machine
STARVED_WAIT = 0.20
NEAR_CEILING = 0.90
STREAM_FULL = 0.90  # CUDA-event spans over wall time: the stream has (almost) no idle gap between steps


@dataclass(frozen=True)
class Verdict:
    """One finding: its name (from VERDICTS), the numbers behind it, and the first fix."""

    name: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    trial: int | None = None

    def sentence(self) -> str:
        facts = ", ".join(f"{k} {_show(v)}" for k, v in self.evidence.items())
        return f"{self.name}: {facts}. First fix: {self.fix}."


def _show(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.1%}" if 0 <= v <= 1.5 else f"{v:.1f}"
    return str(v)



class _Context:
    def __init__(self, rows: list[TrialRow], min_headroom: float, tolerance: float):
        self.rows = rows
        self.min_headroom = min_headroom
        self.tolerance = tolerance
        self.compute = {r.knobs.batch_size: r for r in rows if r.ok and r.mode == "compute"}
        self.loader = {(r.knobs.batch_size, r.knobs.num_workers): r for r in rows if r.ok and r.mode == "loader"}
        self.oom_batches = sorted({r.knobs.batch_size for r in rows if r.status == "oom"})
        per_sample = {b: 1.0 / r.rate for b, r in self.compute.items() if r.rate > 0}
        self.per_sample = per_sample
        self.best_per_sample = min(per_sample.values()) if per_sample else None

    def pinned_gain(self, row: TrialRow) -> tuple[TrialRow, float, TrialRow] | None:
        """For an unpinned trial: the fastest pinned trial of the same batch, accumulation and compile mode with no
        more workers, and its gain over the fastest unpinned one of those (this trial included). When pinning
        beats every unpinned config with as many workers or fewer, the copy is the bound; when fewer workers
        alone do as well, it is not (oversubscribed CPUs, say)."""
        if row.knobs.pin_memory or row.mode != "train":
            return None
        k = row.knobs
        peers = [o for o in self.rows if o.ok and o.mode == row.mode and o.knobs.num_workers <= k.num_workers
                 and o.knobs.batch_size == k.batch_size and o.knobs.compile == k.compile
                 and o.knobs.grad_accum == k.grad_accum]
        pinned = [o for o in peers if o.knobs.pin_memory]
        unpinned = [o for o in peers if not o.knobs.pin_memory]  # holds this trial itself
        if not pinned:
            return None
        best, base = max(pinned, key=lambda o: o.rate), max(unpinned, key=lambda o: o.rate)
        return (best, best.rate / base.rate - 1.0, base) if base.rate > 0 else None


def _classify(row: TrialRow, ctx: _Context) -> Verdict | None:
    m, k = row.measurement, row.knobs
    throttle = sorted(set((m.get("nvml") or {}).get("throttle_reasons") or []) - _BENIGN_THROTTLE)
    wait = float(m.get("data_wait_frac") or 0.0)
    # Noisy windows point at the GPU only when the loop is not waiting on data: a saturated input pipeline (CPU
    # contention among loader workers) makes windows jitter on its own, with the GPU to itself.
    gpu_bound = row.mode == "compute" or (row.mode == "train" and wait <= STARVED_WAIT)
    noisy_gpu = row.noise_cv > _NOISY_CV and gpu_bound
    if noisy_gpu or throttle:
        ev: dict[str, Any] = {"window noise (CV)": row.noise_cv}
        if row.mode == "train":
            ev["data wait"] = wait
        if throttle:
            ev["clock throttle reasons"] = ", ".join(throttle)
        return Verdict("shared-gpu", ev, FIXES["shared-gpu"], row.number)
    if row.headroom is not None and row.headroom < ctx.min_headroom + 0.05:
        ev = {"memory headroom": row.headroom, "limit": ctx.min_headroom}
        if ctx.oom_batches:
            ev["OOM at batch"] = ctx.oom_batches[0]
        return Verdict("memory-wall", ev, FIXES["memory-wall"], row.number)
    if row.mode == "compute":
        if ctx.best_per_sample and k.batch_size in ctx.per_sample:
            ratio = ctx.per_sample[k.batch_size] / ctx.best_per_sample
            if ratio > 1.3:
                return Verdict("overhead-bound", {"per-sample time vs the best batch": f"{ratio:.2f}x"},
                               FIXES["overhead-bound"], row.number)
        return Verdict("compute-bound", {"data wait": float(m.get("data_wait_frac") or 0.0)},
                       FIXES["compute-bound"], row.number)
    if row.mode != "train":
        return None
    ceiling = ctx.compute.get(k.batch_size)
    of_ceiling = row.rate / ceiling.rate if ceiling is not None and ceiling.rate else None
    cpus = int(m.get("cpu_count") or 0)
    twin = ctx.pinned_gain(row)
    if twin is not None and twin[1] > max(ctx.tolerance, row.noise_cv, twin[0].noise_cv):
        return Verdict("h2d-copy", {"gain with pinning": twin[1], "pinned trial": twin[0].number,
                                    "fastest unpinned trial with as many workers or fewer": twin[2].number,
                                    "data wait": wait}, FIXES["h2d-copy"], row.number)
    # An unpinned step whose stream is never idle yet runs well below the compute ceiling spends the difference
    # on the stream in copies from pageable memory (slow, and the host blocks on them while queued compute drains,
    # so its data wait overlaps GPU work instead of idling the GPU).
    # (CUDA-event spans wrap the whole step, so they also hold launches a CPU-starved host makes late: with the
    # CPUs saturated, the stream figure is evidence for the data verdict, not a copy verdict of its own.)
    busy = m.get("gpu_busy_frac")
    stream_full = (not k.pin_memory and busy is not None and float(busy) >= STREAM_FULL
                   and of_ceiling is not None and of_ceiling < NEAR_CEILING)
    cpu_frac = m.get("cpu_util_frac")
    cpu_saturated = bool(cpus and k.num_workers and (k.num_workers >= cpus
                                                     or (cpu_frac is not None and cpu_frac > 0.85)))
    if stream_full and twin is None and not cpu_saturated:  # pinning not measured here: the first thing to try
        return Verdict("h2d-copy", {"GPU busy (events)": float(busy), "of compute ceiling": of_ceiling,
                                    "data wait": wait, "pinned": "not measured at this batch"},
                       FIXES["h2d-copy"], row.number)
    if wait > STARVED_WAIT and (of_ceiling is None or of_ceiling < NEAR_CEILING):
        ev = {"data wait": wait}
        if of_ceiling is not None:
            ev["of compute ceiling"] = of_ceiling
        if stream_full:  # the host's wait overlaps GPU work: say so, and what pinning measured against this trial
            ev["GPU busy (events)"] = float(busy)
            if twin is None:
                ev["pinned"] = "not measured at this batch"
            elif row.rate > 0:
                ev[f"pinned (trial {twin[0].number}) vs this"] = f"{twin[0].rate / row.rate - 1:+.1%}"
        if row.noise_cv > _NOISY_CV:
            ev["window noise (CV)"] = row.noise_cv
        # with no workers the first fix is to add some, however busy the main process is
        if cpu_saturated:
            ev.update({"workers": k.num_workers, "usable CPUs": cpus})
            if cpu_frac is not None:
                ev["CPU busy"] = float(cpu_frac)
            return Verdict("cpu-preprocessing", ev, FIXES["cpu-preprocessing"], row.number)
        ev["workers"] = k.num_workers
        return Verdict("data-starved", ev, FIXES["data-starved"], row.number)
    if of_ceiling is not None and of_ceiling >= NEAR_CEILING:
        if ctx.best_per_sample and k.batch_size in ctx.per_sample:
            ratio = ctx.per_sample[k.batch_size] / ctx.best_per_sample
            if ratio > 1.3:
                return Verdict("overhead-bound", {"of compute ceiling": of_ceiling,
                                                  "per-sample time vs the best batch": f"{ratio:.2f}x"},
                               FIXES["overhead-bound"], row.number)
        return Verdict("compute-bound", {"of compute ceiling": of_ceiling, "data wait": wait},
                       FIXES["compute-bound"], row.number)
    return None


def trial_verdicts(rows: list[TrialRow], *, min_headroom: float, tolerance: float) -> dict[int, Verdict]:
    """The verdict of each trial that has one, keyed by trial number."""
    ctx = _Context(rows, min_headroom, tolerance)
    out = {}
    for row in rows:
        if row.ok:
            verdict = _classify(row, ctx)
            if verdict is not None:
                out[row.number] = verdict
    return out


def run_verdicts(rows: list[TrialRow], knee: TrialRow | None, *, min_headroom: float, tolerance: float,
                 env: dict[str, Any] | None = None, per_trial: dict[int, Verdict] | None = None) -> list[Verdict]:
    """The run's verdicts, the primary one first: the knee's own, then what the rest of the run shows.
    ``per_trial`` is :func:`trial_verdicts` of the same rows, when the caller has it already."""
    ctx = _Context(rows, min_headroom, tolerance)
    if per_trial is None:
        per_trial = trial_verdicts(rows, min_headroom=min_headroom, tolerance=tolerance)
    found: list[Verdict] = []
    if knee is not None and knee.number in per_trial:
        found.append(per_trial[knee.number])
    # why the PyTorch defaults were slow, when that differs from the knee's story (e.g. h2d-copy on cheap data)
    defaults = defaults_trial(rows, knee) if knee is not None else None
    if defaults is not None and defaults.number in per_trial and defaults.number != knee.number:
        found.append(per_trial[defaults.number])
    used = {str(r.measurement.get("device_uuid")).lower() for r in rows if r.measurement.get("device_uuid")}
    gpus = [g for g in ((env or {}).get("gpus") or [])
            if not used or str(g.get("uuid") or "").lower().removeprefix("gpu-") in used]  # only the GPU we used
    others = [g for g in gpus if g.get("processes")]
    if others:
        procs = sum(len(g["processes"]) for g in others)
        found.append(Verdict("shared-gpu", {"other processes on the GPU at sweep start": procs},
                             FIXES["shared-gpu"]))
    if ctx.oom_batches:
        fitting = [b for b in ctx.compute if b < ctx.oom_batches[0]]
        found.append(Verdict("memory-wall", {"OOM at batch": ctx.oom_batches[0],
                                             "largest batch that fits": max(fitting) if fitting else None},
                             FIXES["memory-wall"]))
    batch = knee.knobs.batch_size if knee is not None else None
    ceiling = ctx.compute.get(batch)
    # a data-bound knee is not held back by per-step overhead: a larger batch was measured slower end to end
    data_bound = knee is not None and ceiling is not None and knee.rate < NEAR_CEILING * ceiling.rate
    if ctx.best_per_sample and batch in ctx.per_sample and len(ctx.per_sample) >= 2 and not data_bound:
        ratio = ctx.per_sample[batch] / ctx.best_per_sample
        if ratio > 1.3:  # the chosen batch still pays a fixed cost that a larger one would amortise
            found.append(Verdict("overhead-bound", {f"per-sample time at batch {batch} vs the best batch":
                                                    f"{ratio:.2f}x"}, FIXES["overhead-bound"]))
    seen: set[str] = set()
    return [v for v in found if not (v.name in seen or seen.add(v.name))]


def environment_warnings(env: dict[str, Any], *, max_workers: int = 0, batch_bytes: int | None = None,
                         prefetch: int = 2) -> list[str]:
    """Plain-language warnings about the machine a sweep runs on (from an env snapshot)."""
    out: list[str] = []
    cpu = env.get("cpu") or {}
    cpus = cpu.get("affinity") or cpu.get("logical") or 0
    if max_workers and cpus and max_workers > cpus:
        out.append(f"search.num_workers goes up to {max_workers}, above the {cpus} usable CPUs: workers beyond "
                   "the core count compete for them")
    shm = env.get("shm") or {}
    if batch_bytes and max_workers and shm.get("total_bytes"):
        need = max_workers * prefetch * batch_bytes
        if need > 0.8 * shm["total_bytes"]:
            out.append(f"/dev/shm holds {shm['total_bytes'] / 2**30:.1f} GiB but {max_workers} workers x prefetch "
                       f"{prefetch} x {batch_bytes / 2**20:.0f} MiB batches need about {need / 2**30:.1f} GiB")
    build, driver = env.get("torch_cuda_build"), (env.get("nvml") or {}).get("cuda_driver_version")
    if build and driver and _version(build) > _version(driver):
        out.append(f"torch is built for CUDA {build} but the driver supports CUDA {driver}: update the driver")
    for gpu in env.get("gpus") or []:
        name = f"GPU {gpu.get('index')} ({gpu.get('name')})"
        procs = gpu.get("processes") or []
        if procs:
            listed = ", ".join(f"{p.get('name') or '?'} (pid {p.get('pid')})" for p in procs[:3])
            out.append(f"{name} has {len(procs)} other process(es): {listed}; they share its time and memory")
        reasons = sorted(set(gpu.get("throttle_reasons") or []) - _BENIGN_THROTTLE)
        if reasons:
            out.append(f"{name} clocks are throttled: {', '.join(reasons)}")
        temp = gpu.get("temperature_c")
        if temp is not None and temp >= 85:
            out.append(f"{name} is at {temp} C")
        pcie = gpu.get("pcie") or {}
        if pcie.get("width") and pcie.get("width_max") and pcie["width"] < pcie["width_max"]:
            out.append(f"{name} PCIe link runs x{pcie['width']} of x{pcie['width_max']}: host-to-device copies "
                       "are slower")
    return out


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(text).split(".")[:2])
    except ValueError:
        return (0,)
