"""What one trial's verdict is judged on: the run's trials as the predicates read them (:class:`Trials`: the
ceilings, the best, the pinned twins) and one trial's facts (:class:`Facts`, :func:`facts_of`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from tunekit import rules
from tunekit.config import Selection
from tunekit.contract import Mode, Stage
from tunekit.records import TrialRow, compute_ceiling

Evidence = dict[str, Any]


class PinnedGain(NamedTuple):
    """Pinning measured against an unpinned trial's peers (same batch, accumulation and compile mode, no more
    workers): the fastest pinned peer, the fastest unpinned one (the trial itself included), and the gain."""

    pinned: TrialRow
    unpinned: TrialRow
    gain: float


class Trials:
    """What the per-trial rules read from the whole run: the ceilings, the OOM batches, per-sample step times."""

    def __init__(self, rows: list[TrialRow], selection: Selection):
        self.rows = rows
        self.selection = selection
        self.compute = {b: c for b in {r.knobs.batch_size for r in rows} if (c := compute_ceiling(rows, b))}
        self.oom_batches = sorted({r.knobs.batch_size for r in rows if r.status == "oom"})
        self.per_sample = {b: 1.0 / r.rate for b, r in self.compute.items() if r.rate > 0}

    def overhead_ratio(self, batch: int) -> float | None:
        """Per-sample step time at ``batch`` over the best batch's (compute ceilings), or None."""
        if batch not in self.per_sample:
            return None
        return self.per_sample[batch] / min(self.per_sample.values())

    def pinned_gain(self, row: TrialRow) -> PinnedGain | None:
        """For an unpinned end-to-end trial: when pinning beats every unpinned config with as many workers or fewer,
        the copy is the bound; when fewer workers alone do as well, it is not (oversubscribed CPUs, say)."""
        if row.knobs.pin_memory or row.mode != Mode.train:
            return None
        k = row.knobs
        peers = [
            o
            for o in self.rows
            if o.ok
            and o.mode == row.mode
            and o.knobs.num_workers <= k.num_workers
            and o.knobs.ranks == k.ranks
            and o.knobs.batch_size == k.batch_size
            and o.knobs.compile == k.compile
            and o.knobs.grad_accum == k.grad_accum
            and o.knobs.extra == k.extra
        ]
        pinned = [o for o in peers if o.knobs.pin_memory]
        unpinned = [o for o in peers if not o.knobs.pin_memory]  # holds this trial itself
        if not pinned:
            return None
        best, base = max(pinned, key=lambda o: o.rate), max(unpinned, key=lambda o: o.rate)
        return PinnedGain(best, base, best.rate / base.rate - 1.0) if base.rate > 0 else None

    def workers_no_faster(self, row: TrialRow) -> TrialRow | None:
        """For an end-to-end trial without loader workers: the fastest trial of the same pipeline with workers (any
        batch), when it kept the CPUs busy (rules.keeps_cpus_busy) and was no faster beyond both trials' margin:
        adding workers, the data verdict's fix, was measured and did not help. None otherwise."""
        if row.mode != Mode.train or row.knobs.num_workers:
            return None
        k = row.knobs
        with_workers = [
            o
            for o in self.rows
            if o.ok
            and o.mode == Mode.train
            and o.stage != Stage.scaling
            and o.knobs.num_workers > 0
            and o.knobs.ranks == k.ranks
            and o.knobs.compile == k.compile
            and o.knobs.extra == k.extra
            and o.knobs.threads == k.threads
        ]
        if not with_workers:
            return None
        best = max(with_workers, key=lambda o: o.rate)
        if not rules.keeps_cpus_busy(best):
            return None
        return best if best.rate <= row.rate * (1.0 + rules.trial_margin(self.selection, row, best)) else None

    def loader_plateau(self, row: TrialRow) -> tuple[TrialRow, TrialRow] | None:
        """The loader ceilings at this trial's worker count and the next smaller one measured (same batch), when
        the larger count is not faster beyond their margin: more workers stopped helping."""
        ceilings = sorted(
            (
                r
                for r in self.rows
                if r.ok
                and r.mode == Mode.loader
                and r.knobs.extra == row.knobs.extra
                and r.knobs.batch_size == row.knobs.batch_size
                and 0 < r.knobs.num_workers
                and r.knobs.num_workers <= row.knobs.num_workers
            ),
            key=lambda r: r.knobs.num_workers,
        )
        if len(ceilings) < 2 or ceilings[-1].knobs.num_workers != row.knobs.num_workers:
            return None
        here, below = ceilings[-1], ceilings[-2]
        return (
            (here, below) if here.rate <= below.rate * (1 + rules.trial_margin(self.selection, here, below)) else None
        )


@dataclass(frozen=True)
class Facts:
    """One trial's figures, computed once for all its predicates."""

    wait: float
    """Share of window time the loop blocked on the next batch."""
    of_ceiling: float | None
    """Throughput as a share of the compute ceiling at the trial's batch."""
    busy: float | None
    """CUDA-event spans over wall time (GPU runs only)."""
    stream_full: bool
    """An unpinned step whose stream is never idle yet runs below the compute ceiling."""
    cpu_busy: float | None
    """Share of the usable CPUs the trial's process tree kept busy."""
    trial_saturates: bool
    """The trial's process tree kept the CPUs busy over CPU_SATURATED (rules.keeps_cpus_busy)."""
    system_busy: float | None
    """Share of the machine's CPUs busy over the windows, every process included."""
    worker_share: float | None
    """Share of the cores the loader workers could use that they kept busy (rules.worker_core_share)."""
    cpus: int
    twin: PinnedGain | None
    plateau: tuple[TrialRow, TrialRow] | None
    flop_share: float | None = None
    """Model FLOP utilisation: the share of the device's measured matmul peak the trial's model ran at
    (rules.flop_share)."""
    flops_uncertain: float | None = None
    """The FLOP count's backward over its forward when outside rules.FLOP_BACKWARD_BAND: the share is uncertain,
    and no fix turns on it (rules.flops_uncertain)."""

    @property
    def data_bound(self) -> bool:
        return rules.waits_on_data(self.wait, self.of_ceiling)

    @property
    def workers_compute(self) -> bool:
        return self.worker_share is not None and self.worker_share >= rules.WORKER_WAITING

    @property
    def cpus_saturated(self) -> bool:
        """The CPUs are the bound: the trial keeps them busy over CPU_SATURATED; or the machine is that busy (other
        processes too) while the workers compute; or the trial keeps them over CPU_BUSY and more workers stopped
        helping."""
        return (
            self.trial_saturates
            or ((self.system_busy or 0.0) > rules.CPU_SATURATED and self.workers_compute)
            or (self.plateau is not None and (self.cpu_busy or 0.0) > rules.CPU_BUSY)
        )


def facts_of(row: TrialRow, trials: Trials) -> Facts:
    k = row.knobs
    ceiling = trials.compute.get(k.batch_size)
    share = rules.of_ceiling(row, ceiling)
    m = row.measurement
    busy = m.gpu_busy_frac
    return Facts(
        wait=m.data_wait_frac or 0.0,
        of_ceiling=share,
        busy=busy,
        # a step that decodes on the device keeps its stream busy with that work, not with pageable copies
        stream_full=(
            not k.pin_memory
            and busy is not None
            and busy >= rules.STREAM_FULL
            and rules.input_bound(row, ceiling)
            and not m.input_on_device
        ),
        cpu_busy=m.cpu_util_frac,
        trial_saturates=rules.keeps_cpus_busy(row),
        system_busy=None if m.system_cpu_pct is None else m.system_cpu_pct / 100,
        worker_share=rules.worker_core_share(row),
        cpus=int(m.cpu_count or 0),
        twin=trials.pinned_gain(row),
        plateau=trials.loader_plateau(row) if k.num_workers and row.mode == Mode.train else None,
        flop_share=rules.flop_share(row, trials.rows),
        flops_uncertain=rules.flops_uncertain(row, trials.rows),
    )
