"""Classify how a trial ended from the error text it left. Pure text: used by the worker and the launcher."""

from __future__ import annotations

import re
import signal

__all__ = ["classify_error", "silent_ranks"]

# Real messages from torch, CUDA and the C allocator; each maps a failure to a status.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "illegal_access",
        re.compile(
            r"illegal memory access|illegal instruction was encountered|"
            r"misaligned address|CUDA_ERROR_ILLEGAL_ADDRESS",
            re.I,
        ),
    ),
    (
        "oom",
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
            r"CUDNN_STATUS_(?:ALLOC_FAILED|NOT_ENOUGH_WORKSPACE)|CUDA error: out of memory|"
            r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)|"
            r"\bMemoryError\b|Cannot allocate memory|"
            r"HIP out of memory|out of memory on device",
            re.I,
        ),
    ),
]

_NO_FORK = re.compile(
    r"BlockingIOError[^\n]*|Resource temporarily unavailable[^\n]*|"
    r"can't start new thread[^\n]*",
    re.I,
)

_NODES_MISSING = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")

_NO_SHM = re.compile(
    r"[^\n]*(?:insufficient shared memory|unable to write to file </torch_[^\n]*No space left|"
    r"unable to allocate shared memory)[^\n]*",
    re.I,
)

# torch says it two ways, by which of its checks saw the death first: its SIGCHLD handler names the signal
# ("(pid 4242) is killed by signal: Killed."), a failed queue read only the pids ("(pid(s) 4242, 4243) exited
# unexpectedly"); either can come first for the same SIGKILL
_LOADER_DIED = re.compile(
    r"DataLoader worker \(pid(?:\(s\))?\s*[\d, ]+\) (?:is killed by signal: [\w ]+|"
    r"exited unexpectedly[^\n]*)",
    re.I,
)


def classify_error(text: str) -> tuple[str, str]:
    """Return ``(status, reason)`` for a failed trial's error text (an exception message or a log tail).

    Status is one of oom, illegal_access or crashed; the reason is one line a user can act on.
    """
    for status, pattern in _PATTERNS:
        match = pattern.search(text)
        if match:
            return status, _line_around(text, match.start())
    alone = _NODES_MISSING.search(text)
    if alone:
        waited, joined, world = alone.groups()
        return "crashed", (
            f"the other nodes did not join the rendezvous: after {waited} s (launch.join_timeout_s) "
            f"{joined} of {world} nodes had joined; start `tunekit node CONFIG --node-rank K` on each "
            "other node (K = 1 … nnodes − 1) and check that launch.rdzv_endpoint reaches this one"
        )
    shm = _NO_SHM.search(text)
    if shm:
        return "crashed", (
            "the DataLoader workers ran out of shared memory (/dev/shm), through which they pass "
            f"batches ({shm.group(0).strip()[:160]}): enlarge it (docker run --shm-size=8g, a "
            "Kubernetes emptyDir of medium Memory) or lower num_workers x prefetch_factor x batch"
        )
    fork = _NO_FORK.search(text)
    if fork:
        return "crashed", (
            f"the system refused another process or thread ({fork.group(0).strip()[:200]}): lower "
            "num_workers, or raise the process limit (ulimit -u, the container's pids limit)"
        )
    loader = _LOADER_DIED.search(text)
    if loader:
        died = loader.group(0).rstrip(". ")
        # SIGKILL, or a death whose cause torch did not read (no signal, no exit code): from outside, and a kill
        # no one sent by hand is the kernel's OOM killer
        if re.search(r"killed by signal: Killed", died, re.I) or died.endswith("exited unexpectedly"):
            return "crashed", (
                f"a DataLoader worker died: {died} (a kill no one sent by hand is the kernel's "
                "OOM killer: host memory ran out; fewer workers, a smaller prefetch_factor or batch)"
            )
        return "crashed", f"a DataLoader worker died: {died}"
    caught = re.search(r"Caught (\w+) in DataLoader worker process (\d+)", text)
    if caught:
        detail = _last_exception_line(text)
        return "crashed", f"the dataset raised in DataLoader worker {caught.group(2)}: {detail}"
    return "crashed", _last_exception_line(text) or "the trial failed without a message"


def _line_around(text: str, pos: int, limit: int = 300) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end != -1 else len(text)].strip()[:limit]


def _last_exception_line(text: str, limit: int = 300) -> str:
    """The last line that looks like ``SomeError: message`` (what a traceback ends with)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", line):
            return line[:limit]
    return lines[-1][:limit] if lines else ""


# torchrun's summary of the failed ranks (ChildFailedError): one entry per rank, its rank and exit code
_RANK_EXIT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def silent_ranks(log: str, reported: set[int]) -> list[tuple[int, int, int]]:
    """The ranks torchrun's summary lists as failed that reported no failure of their own (``reported``: the ranks
    that wrote one), as ``(rank, local_rank, exit code)``, those killed by a signal first: a rank killed outright
    (the OOM killer, a segfault) writes nothing, and its peers then fail in a collective for want of it, which
    makes their messages ("Connection closed by peer") the wrong ones to blame; torchrun's own "Root Cause" is
    only the first exit it noticed. The peers torchrun then stopped show as killed by SIGTERM: they come last, and
    not at all when a rank reported its failure (that one made torchrun stop them)."""
    found = {}
    for m in _RANK_EXIT.finditer(log):
        rank, code = int(m.group(1)), int(m.group(3))
        if rank not in reported and not (reported and code == -signal.SIGTERM):
            found[rank] = (rank, int(m.group(2)), code)
    # killed by a signal first, then exited with an error, SIGTERM last
    return sorted(found.values(), key=lambda r: (r[2] == -signal.SIGTERM, r[2] >= 0, r[0]))
