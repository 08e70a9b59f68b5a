"""Background sampling inside a trial: host memory of the whole process tree, and NVML on CUDA devices.

One daemon thread samples; the training loop only flips the phase at window edges. Host memory is read as PSS
(proportional set size) so that pages shared between the main process and forked loader workers count once; a trial
forked by the fork server also counts the server's share of the pages the two still share.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psutil

from tunekit.contract import process as names

__all__ = ["Monitor", "TreeCpu", "CpuUse", "nvml_sampler", "fork_server_pid"]


def fork_server_pid() -> int | None:
    """The fork server's pid when it forked this process (it sets ``TUNEKIT_FORKED_FROM`` in the child; a process
    the trial starts inherits the variable but not the parent), else None."""
    pid = int(os.environ.get(names.FORKED_FROM) or 0)
    return pid if pid and pid == os.getppid() else None


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return [root]


def _tree_memory(root: psutil.Process) -> tuple[int, int, int]:
    """(pss, rss, process count) summed over the process and all its descendants."""
    pss = rss = n = 0
    for proc in _tree(root):
        try:
            info = proc.memory_full_info()
        except (psutil.Error, OSError):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
        n += 1
    return pss, rss, n


def _tree_rss(root: psutil.Process) -> tuple[int, frozenset[int]]:
    """(rss, pids) of the process and all its descendants, the RSS summed: each process's resident-set counter
    (/proc/<pid>/statm), which costs microseconds and takes no lock of the process's memory map."""
    rss, pids = 0, set()
    for proc in _tree(root):
        try:
            rss += proc.memory_info().rss
        except (psutil.Error, OSError):
            continue
        pids.add(proc.pid)
    return rss, frozenset(pids)


def _shared_share(proc: psutil.Process | None) -> int:
    """The fork server's share of the pages it still shares with the trial forked from it (its PSS less its USS):
    PSS splits those pages between the two, and a trial started in a fresh interpreter would hold them alone."""
    if proc is None:
        return 0
    try:
        info = proc.memory_full_info()
    except (psutil.Error, OSError):
        return 0
    return max(0, getattr(info, "pss", 0) - getattr(info, "uss", 0))


@dataclass
class _Series:
    values: list[float] = field(default_factory=list)

    def add(self, value: float | None) -> None:
        if value is not None:
            self.values.append(float(value))

    def summary(self) -> dict[str, float | None]:
        if not self.values:
            return {"mean": None, "max": None, "min": None}
        return {"mean": statistics.fmean(self.values), "max": max(self.values), "min": min(self.values)}


class Monitor:
    """Samples host memory (every ``host_period_s``) and NVML (every ``nvml_period_s``) in a daemon thread.

    Only samples taken while :attr:`measuring` is True count for the measured figures; host memory peaks are also
    kept over the whole trial. PSS is read from smaps_rollup, which walks every mapping of every process under the
    process's memory-map lock: about 18 ms of CPU for a CUDA training process on an H200, and a step sampled so once
    a second measured 3.6 % slower there. So while measuring, PSS is read every ``pss_period_s`` only; the samples
    between read each process's RSS counter and add the change in the tree's RSS sum to the last PSS read. After
    the windows, :meth:`sample_now` reads PSS once more.
    """

    def __init__(
        self,
        nvml: Any | None,
        host_period_s: float = 1.0,
        nvml_period_s: float = 0.2,
        node_root: int | None = None,
        forked_from: int | None = None,
        pss_period_s: float = 10.0,
    ):
        self._nvml = nvml
        self._server = psutil.Process(forked_from) if forked_from else None
        # a rank of a multi-GPU trial may also sample the node's whole tree (torchrun, every rank, every worker)
        self._node = psutil.Process(node_root) if node_root else None
        self.node_pss_peak = 0
        self.node_processes = 0
        self._host_period_s, self._pss_period_s = host_period_s, pss_period_s
        # (pss, rss, pids) of the tree and of the node at their last PSS read
        self._last_read: dict[str, tuple[int, int, frozenset[int]]] = {}
        self._nvml_period_s = nvml_period_s if nvml is not None else host_period_s
        self._root = psutil.Process(os.getpid())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tunekit-monitor", daemon=True)
        self.measuring = False
        self.host_pss_peak = 0
        self.host_rss_peak = 0
        self.host_pss_peak_measured = 0
        self.max_processes = 0
        self._nvml_series: dict[str, _Series] = {}
        self.throttle_reasons: set[str] = set()
        self.nvml_samples = 0

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._nvml is not None:
            self._nvml.close()

    def _run(self) -> None:
        next_host = next_pss = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_host:
                pss = not self.measuring or now >= next_pss
                self._sample_host(pss)
                next_host = now + self._host_period_s
                next_pss = now + self._pss_period_s if pss else next_pss
            if self._nvml is not None and self.measuring:
                self._sample_nvml()
            self._stop.wait(self._nvml_period_s)

    def _memory(self, root: psutil.Process, which: str, pss: bool) -> tuple[int | None, int, int]:
        """(pss, rss, processes) of the tree under ``root``: PSS read, or estimated as the last PSS read plus the
        change in the RSS sum since (pages that became resident since are the process's own, until it forks). The
        estimate holds only while the tree's processes are those of the last read: a forked loader worker's RSS
        counts every page it shares with its parent, which PSS splits between them (estimated, two workers forked
        after the last read made a rank's figure twice its PSS). Once they changed, pss is None until the next read:
        the sample is left out, rather than PSS read at every worker restart (each epoch's, without persistent
        workers), which would cost the step what ``pss_period_s`` saves."""
        rss_before, pids = _tree_rss(root)
        last = self._last_read.get(which)
        if not pss and last is not None:
            estimate = max(0, last[0] + rss_before - last[1]) if last[2] == pids else None
            return estimate, rss_before, len(pids)
        # the RSS before the read is kept: pages that become resident while smaps_rollup is walked count once more
        # in the estimates after it, rather than not at all
        value, rss, n = _tree_memory(root)
        value += _shared_share(self._server) if which == "tree" else 0
        self._last_read[which] = (value, rss_before, pids)
        return value, rss, n

    def _sample_host(self, read_pss: bool = True) -> None:
        pss, rss, n = self._memory(self._root, "tree", read_pss)
        self.host_rss_peak = max(self.host_rss_peak, rss)
        self.max_processes = max(self.max_processes, n)
        if pss is not None:
            self.host_pss_peak = max(self.host_pss_peak, pss)
            if self.measuring:
                self.host_pss_peak_measured = max(self.host_pss_peak_measured, pss)
        if self._node is not None:
            node_pss, _, n = self._memory(self._node, "node", read_pss)
            self.node_pss_peak = max(self.node_pss_peak, node_pss or 0)
            self.node_processes = max(self.node_processes, n)

    def _sample_nvml(self) -> None:
        try:
            sample = self._nvml.sample()
        except Exception:  # noqa: BLE001 - a failed sample is a missing point, not a failed trial
            return
        self.nvml_samples += 1
        for key, value in sample.items():
            if key == "throttle_reasons":
                self.throttle_reasons.update(value or [])
            elif isinstance(value, (int, float)) or value is None:
                self._nvml_series.setdefault(key, _Series()).add(value)

    def sample_now(self) -> None:
        """Read the host memory (PSS) now, after the windows, so short trials still get one."""
        self._sample_host(read_pss=True)

    def nvml_summary(self) -> dict[str, Any] | None:
        if self._nvml is None:
            return None
        out: dict[str, Any] = {"samples": self.nvml_samples, "throttle_reasons": sorted(self.throttle_reasons)}
        for key, series in self._nvml_series.items():
            out[key] = series.summary()
        return out


class CpuUse(NamedTuple):
    """CPU time a trial's process tree used over one window."""

    main_s: float
    """The main process: the training loop, its intra-op threads, the pin-memory thread."""
    workers_s: float
    """The DataLoader workers (and anything they started)."""
    system_pct: float
    """System-wide CPU utilisation in percent, every process on the machine included."""
    usable_busy: float = 0.0
    """Busy cores among the CPUs this process may run on (its affinity), every process included."""


class TreeCpu:
    """CPU seconds used by a process tree between two calls, read at window edges only."""

    def __init__(self) -> None:
        self._root = psutil.Process(os.getpid())
        self._start: dict[int, float] = {}
        self._percpu = psutil.cpu_times(percpu=True)
        psutil.cpu_percent(interval=None)

    def _times(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for proc in _tree(self._root):
            try:
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
            except psutil.Error:
                continue
        return out

    def begin(self) -> None:
        self._start = self._times()
        psutil.cpu_percent(interval=None)
        self._percpu = psutil.cpu_times(percpu=True)

    def end(self) -> CpuUse:
        """The CPU time used since :meth:`begin`, the main process apart from the rest of the tree."""
        system = psutil.cpu_percent(interval=None)
        now = self._times()
        used = {pid: max(0.0, now[pid] - self._start.get(pid, 0.0)) for pid in now}
        main = used.pop(self._root.pid, 0.0)
        return CpuUse(main, sum(used.values()), system, self._usable_busy())

    def _usable_busy(self) -> float:
        """Busy cores among this process's usable CPUs since :meth:`begin` (idle and iowait time are not busy)."""
        before, after = self._percpu, psutil.cpu_times(percpu=True)
        try:
            usable = sorted(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            usable = list(range(len(after)))
        busy = 0.0
        for cpu in usable:
            if cpu >= len(after) or cpu >= len(before):
                continue
            total = sum(after[cpu]) - sum(before[cpu])
            idle = (after[cpu].idle - before[cpu].idle) + (
                getattr(after[cpu], "iowait", 0.0) - getattr(before[cpu], "iowait", 0.0)
            )
            busy += max(0.0, total - idle) / total if total > 0 else 0.0
        return busy


def nvml_sampler(device: Any) -> Any | None:
    """The NVML sampler of a CUDA device (found by its UUID), or None off CUDA or without NVML."""
    if device.type != "cuda":
        return None
    try:
        import torch

        from tunekit.env import NvmlSampler

        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return NvmlSampler.for_uuid(uuid, fallback_index=device.index or 0)
    except Exception:  # noqa: BLE001 - NVML missing means no NVML figures, not a failed trial
        return None
