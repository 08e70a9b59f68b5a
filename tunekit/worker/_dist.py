"""A trial's ranks under torchrun: the process group, what the ranks must agree on, and one measurement from all.

Every rank runs the same measured loop on its own device with its own loader workers. DDP makes the ranks' steps
collective, so every decision that sets how many steps a rank runs (when the warm-up drain stops, when a window
ends, whether the loss diverged) is agreed over a CPU-only gloo group at points every rank reaches at the same step:
no rank can run a step the others do not, and the agreement never syncs a CUDA stream. Rank 0 gathers the ranks'
measurements and merges them (:func:`merge`); docs/distributed.md lists what is summed, averaged or taken at the
worst rank.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

from tunekit import rules
from tunekit.contract import Measurement
from tunekit.contract import process as names

__all__ = ["Ranks", "init", "EndlessDistributedSampler", "merge", "publish", "receive", "SYNC_PROBE_STEPS"]

_SPEC_KEY = "tunekit/spec"
_SPEC_WAIT_S = 300.0

SYNC_PROBE_STEPS = 6
"""Optimizer steps timed with and without gradient synchronisation, on a batch already on the device."""


@dataclass
class Ranks:
    """This process's place among the trial's ranks, and the CPU group the ranks agree over."""

    rank: int
    local_rank: int
    world: int
    backend: str
    control: Any
    """A gloo process group: agreements and the final gather never touch a CUDA stream."""
    progress: int = -1
    """``progress.rank<r>`` in the trial's folder (``TUNEKIT_TRIAL_DIR``), open for :meth:`mark`; -1 without one."""

    def __post_init__(self) -> None:
        folder = os.environ.get(names.TRIAL_DIR)
        if folder and os.path.isdir(folder):
            self.progress = os.open(
                os.path.join(folder, names.progress_file(self.rank)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
            )

    def mark(self, batch: int, received: bool) -> None:
        """Record the batch this rank asks for or holds, overwriting the last: on a timeout the launcher names the
        rank that waits for a batch the others hold (``ending.hung_ranks``). One small write per fetch."""
        if self.progress >= 0:
            os.pwrite(
                self.progress, f"{batch} {'got' if received else 'asked'} {time.time():.3f}".ljust(40).encode(), 0
            )

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on any rank."""
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.control)
        return bool(value.item())

    def max(self, value: int) -> int:
        """The largest of the ranks' ``value`` (on every rank)."""
        out = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.control)
        return int(out.item())

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (on every rank)."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def launched() -> bool:
    """Whether this process is one rank of several started by torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device_name: str, backend: str, timeout_s: float) -> tuple[Ranks, str]:
    """Join the trial's process group; returns the ranks and this rank's device name (its local GPU on CUDA).
    A collective waits at most ``timeout_s`` (the trial's): a rank whose peer died, on another node say, fails
    instead of waiting out the backend's default of 10 to 30 minutes."""
    import datetime

    limit = datetime.timedelta(seconds=timeout_s)
    local = int(os.environ["LOCAL_RANK"])
    cuda = device_name != "cpu" and torch.cuda.is_available()
    if device_name in ("cuda",) and not torch.cuda.is_available():
        raise RuntimeError(f"device {device_name!r} was asked for but CUDA is not available here")
    if cuda:
        count = torch.cuda.device_count()
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if per_node > count:
            raise RuntimeError(
                f"launch.nproc_per_node = {per_node} ranks, but this node has {count} CUDA device(s): one GPU per rank"
            )
        device_name = f"cuda:{local}"
        torch.cuda.set_device(local)
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise RuntimeError("launch.backend nccl needs CUDA devices; use gloo (or auto) on the CPU")
    kwargs: dict[str, Any] = {"backend": backend, "timeout": limit}
    if backend == "nccl":
        kwargs["device_id"] = torch.device(device_name)
    dist.init_process_group(**kwargs)
    control = dist.new_group(backend="gloo", timeout=limit) if backend != "gloo" else dist.group.WORLD
    ranks = Ranks(dist.get_rank(), local, dist.get_world_size(), backend, control)
    return ranks, device_name


class EndlessDistributedSampler(DistributedSampler):
    """DistributedSampler over successive epochs without end: ``set_epoch`` advances the shuffle every pass, as a
    training loop would, and no trial ever reaches an epoch boundary (which restarts the loader's workers)."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=0, drop_last=True)
        if self.num_samples == 0:
            raise ValueError(
                f"the dataset has {len(dataset)} samples, fewer than the {num_replicas} ranks: "  # type: ignore[arg-type]
                "every rank needs at least one"
            )

    def __iter__(self) -> Iterator[int]:
        epoch = 0
        while True:
            self.set_epoch(epoch)
            yield from super().__iter__()
            epoch += 1

    def __len__(self) -> int:
        return 1 << 40


def host() -> str:
    """This node: its host name and node rank (two nodes may share a host, as in tests)."""
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '0')}"


def _store() -> Any:
    """A client of the store torchrun's node 0 hosts for this rendezvous (it lives as long as the trial)."""
    import datetime

    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=_SPEC_WAIT_S),
    )


def publish(spec: dict[str, Any] | None) -> None:
    """Rank 0: hand the trial's spec (None: the sweep is over) to the ranks of the other nodes."""
    import json

    _store().set(_SPEC_KEY, json.dumps(spec))


def receive() -> dict[str, Any] | None:
    """A rank of another node: the trial's spec, as rank 0 published it (None: the sweep is over)."""
    import json

    return json.loads(_store().get(_SPEC_KEY))


# --- merging the ranks' measurements into the trial's -----------------------------------------------------------

_PER_RANK = (
    "rate",
    "data_wait_frac",
    "step_time_s",
    "gpu_busy_frac",
    "noise_cv",
    "headroom",
    "sync_share",
    "pinned_peak_bytes",
    "cpu_util_cores",
    "worker_cpu_per_item_s",
    "device",
    "device_mem_peak_reserved_bytes",
    "nvml_util_gpu_pct",
    "host",
    "host_mem_peak_bytes",
)


def _mean(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _sum(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _max(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0


def merged(
    m: Measurement, ranks: Ranks, node_mem_peak_bytes: int | None, node_processes: int | None
) -> Measurement | None:
    """This rank's measurement with where it ran, gathered from every rank: the trial's merged measurement on rank 0
    (:func:`merge`), None on the others. Both modes' ranks end here."""
    mine = dataclasses.replace(
        m,
        host=host(),
        rank=ranks.rank,
        local_rank=ranks.local_rank,
        world=ranks.world,
        backend=ranks.backend,
        node_mem_peak_bytes=node_mem_peak_bytes or None,
        node_processes=node_processes or None,
    )
    results = ranks.gather(mine.to_dict())
    return Measurement(**merge(results)) if ranks.rank == 0 else None


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement for the whole trial from every rank's (rank order).

    Throughput is global: each window's rates summed over the ranks (the ranks' windows end at the same agreed
    step). The step time is the slowest rank's, data wait and GPU busy the ranks' mean (the worst beside it),
    headroom the smallest, host memory the whole trees of every node, CPU use the sum.
    """
    hosts = {r["host"]: r for r in results if r["local_rank"] == 0}  # each node's CPUs and whole tree, once
    rates = [r["rate"] for r in results]
    out = dict(results[0])
    out.update(_throughput(results))
    out.update(_cpu(results, hosts, out))
    out.update(_memory(results, hosts, out["headroom_basis"]))
    out.update(
        {
            "step_time_s": max(r["step_time_s"] for r in results),
            "data_wait_frac": _mean([r["data_wait_frac"] for r in results]),
            "data_wait_frac_max": _max([r["data_wait_frac"] for r in results]),
            "gpu_busy_frac": _mean([r["gpu_busy_frac"] for r in results]),
            "items_per_batch_mean": _mean([r["items_per_batch_mean"] for r in results]),
            "items_per_batch_cv": _max([r["items_per_batch_cv"] for r in results]),
            "nvml_util_gpu_pct": _mean([r["nvml_util_gpu_pct"] for r in results]),
            "sync_share": _mean([r.get("sync_share") for r in results]),
            "epochs_ended": max(r["epochs_ended"] for r in results),
            "epoch_boundary_in_trial": any(r["epoch_boundary_in_trial"] for r in results),
            "warnings": list(dict.fromkeys(w for r in results for w in r["warnings"])),
            "ranks": len(results),
            "nodes": len(hosts),
            "slowest_rank": min(range(len(rates)), key=rates.__getitem__),
            "rank_spread": (max(rates) - min(rates)) / max(rates) if max(rates) else 0.0,
            "per_rank": [{"rank": i, **{k: r.get(k) for k in _PER_RANK}} for i, r in enumerate(results)],
        }
    )
    out.update(_whole_epoch(results, out["rate"]))
    return out


def _whole_epoch(results: list[dict[str, Any]], steady: float) -> dict[str, Any]:
    """Epoch-aware ranks (script mode): the global steady rate is the windows' (``steady``); an epoch boundary
    costs what the slowest rank's did (the ranks step together, so its evaluation, checkpoint or restart holds every
    rank); a global epoch holds every rank's share; the rate over whole epochs (rules.epoch_rate) is the trial's
    rate. Without a boundary on every rank the figure stays the steady rate."""
    if any(r.get("rate_in_epoch") is None for r in results):
        return {}
    out: dict[str, Any] = {
        "rate_in_epoch": steady,
        "rate_whole_epoch": None,
        "epoch_boundaries": min(r.get("epoch_boundaries") or 0 for r in results),
    }
    costs = [r.get("boundary_s") for r in results]
    items = [r.get("epoch_items") for r in results]
    if any(c is None for c in costs) or any(not i for i in items):
        return {**out, "boundary_s": None}
    slowest = max(range(len(results)), key=costs.__getitem__)
    whole = rules.epoch_rate(sum(items), steady, costs[slowest])
    return {
        **out,
        "boundary_s": costs[slowest],
        "boundaries_s": results[slowest].get("boundaries_s"),
        "boundary_cv": results[slowest].get("boundary_cv"),
        "epoch_items": sum(items),
        "rate_whole_epoch": whole,
        "rate": whole,
    }


def _throughput(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The global windows (each window summed over the ranks, which close their windows together), the global
    throughput (rules.window_rate over them), noise and interval."""
    count = len(results[0]["rate_windows"])
    windows = [sum(r["rate_windows"][i] for r in results) for i in range(count)]
    # a global window holds every rank's items and lasts as long as its slowest rank's
    items = [sum(r["rate_windows"][i] * r["seconds_windows"][i] for r in results) for i in range(count)]
    seconds = [max(r["seconds_windows"][i] for r in results) for i in range(count)]
    rate = rules.window_rate(items, seconds)
    samples = sum(r["measured_items"] for r in results)
    return {
        "rate": rate,
        "rate_windows": windows,
        "seconds_windows": seconds,
        "noise_cv": _cv(windows),
        "noise_range": (max(windows) - min(windows)) / rate if rate else 0.0,
        "rate_interval": rules.rate_interval(items, seconds),
        "measured_items": samples,
        "item_time_s": results[0]["measured_s"] / samples if samples else None,
    }


def _cpu(results: list[dict[str, Any]], hosts: dict[str, dict[str, Any]], out: dict[str, Any]) -> dict[str, Any]:
    """CPU use summed over the ranks against every node's CPUs; the loader workers' CPU and wall time per sample."""
    cpus = sum(int(r["cpu_count"]) for r in hosts.values())
    cores = _sum([r["cpu_util_cores"] for r in results]) or 0.0
    worker_cpu = _sum([r["worker_cpu_s"] for r in results])
    workers = results[0]["params"]["num_workers"] * len(results)
    samples, wall = out["measured_items"], results[0]["measured_s"]
    return {
        "cpu_util_cores": cores,
        "cpu_util_frac": cores / cpus if cpus else None,
        "cpu_count": cpus,
        "system_cpu_pct": _mean([r["system_cpu_pct"] for r in results]),
        "worker_cpu_s": worker_cpu,
        "worker_cpu_per_item_s": worker_cpu / samples if worker_cpu is not None and samples else None,
        "worker_wall_per_item_s": workers * wall / samples if workers and samples else None,
        "workers_total": workers,
        "other_cpu_cores": None,  # each rank's outside holds the other ranks: no figure for the trial's outside
    }


def _memory(results: list[dict[str, Any]], hosts: dict[str, dict[str, Any]], basis: str) -> dict[str, Any]:
    """Device peaks at the worst rank; host memory as every node's whole tree; headroom at the fullest device, or
    on the CPU at the fullest node (the memory that runs out is each node's own)."""
    headroom = min(r["headroom"] for r in results)
    if basis == "host":
        nodes = [
            1.0 - r["node_mem_peak_bytes"] / r["host_mem_total_bytes"]
            for r in hosts.values()
            if r.get("node_mem_peak_bytes") and r.get("host_mem_total_bytes")
        ]
        headroom = min(nodes, default=headroom)
    return {
        "headroom": headroom,
        "device_mem_peak_allocated_bytes": _max([r["device_mem_peak_allocated_bytes"] for r in results]),
        "device_mem_peak_reserved_bytes": _max([r["device_mem_peak_reserved_bytes"] for r in results]),
        "host_mem_peak_bytes": _sum([r["node_mem_peak_bytes"] for r in hosts.values()]),
        "host_mem_total_bytes": _sum([r["host_mem_total_bytes"] for r in hosts.values()]),
        "host_processes": _sum([r["node_processes"] for r in hosts.values()]),
        "pinned_peak_bytes": _max([r.get("pinned_peak_bytes") for r in results]),
    }
