from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import sleepy_config
from tests.worker.test_meter import _spec
from tunekit.launch import classify_error, run_trial

# Error texts as torch, CUDA and the allocators print them.
CASES = [
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "139.81 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 138.74 GiB memory "
        "in use.",
        "oom",
    ),
    ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", "oom"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
    (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
        "you tried to allocate 1125899906842624 bytes.",
        "oom",
    ),
    (
        "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 80000000000 bytes. "
        "Error code 12 (Cannot allocate memory)",
        "oom",
    ),
    ("MemoryError", "oom"),
    (
        "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
        "asynchronously reported at some other API call",
        "illegal_access",
    ),
    ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. ", "crashed"),
    ("RuntimeError: DataLoader worker (pid(s) 4242, 4243) exited unexpectedly", "crashed"),
    (
        "ValueError: Caught ValueError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 3, in __getitem__\nValueError: sample 3 is corrupt',
        "crashed",
    ),
    ("Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'label'", "crashed"),
]


@pytest.mark.parametrize("text,status", CASES)
def test_classification_of_real_error_texts(text: str, status: str):
    got, reason = classify_error(text)
    assert got == status
    assert reason and "\n" not in reason


def test_reasons_name_the_cause():
    assert "pid 4242" in classify_error(CASES[7][0])[1]
    for killed in CASES[7:9]:  # torch's two wordings of one SIGKILL: both a worker's death, both naming memory
        reason = classify_error(killed[0])[1]
        assert reason.startswith("a DataLoader worker died: ") and "4242" in reason and "OOM killer" in reason
    # a worker that exited by itself, with its code: no kill, no memory hint
    exited = classify_error("RuntimeError: DataLoader worker (pid 4242) exited unexpectedly with exit code 1. ")[1]
    assert exited.startswith("a DataLoader worker died: ") and "exit code 1" in exited and "OOM" not in exited
    assert "DataLoader worker 1" in classify_error(CASES[9][0])[1]
    assert "sample 3 is corrupt" in classify_error(CASES[9][0])[1]
    assert classify_error(CASES[10][0])[1] == "KeyError: 'label'"
    assert "Tried to allocate 2.00 GiB" in classify_error(CASES[0][0])[1]


def test_a_trial_out_of_shared_memory_says_so():
    from tunekit.launch import classify_error

    log = (
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory "
        "(shm).\nRuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error."
    )
    status, reason = classify_error(log)
    assert status == "crashed" and "ran out of shared memory (/dev/shm)" in reason and "--shm-size" in reason


def test_dying_loader_worker_is_crashed_with_reason(tmp_path: Path):
    cfg = sleepy_config(**{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "kill_at": 5}})
    m = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=4), tmp_path / "t", 60)
    assert m.status == "crashed"
    # torch names the signal or only the pids, by which of its checks saw the death first: the kill is named both ways
    assert m.reason.startswith("a DataLoader worker died: "), m.reason
    assert "OOM killer" in m.reason and ("killed by signal: Killed" in m.reason or "exited unexpectedly" in m.reason)


def test_exception_in_dataset_is_crashed_with_its_message(tmp_path: Path):
    cfg = sleepy_config(**{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "raise_at": 7}})
    m = run_trial(_spec(cfg, num_workers=1, prefetch_factor=2, batch_size=4), tmp_path / "t", 60)
    assert m.status == "crashed"
    assert "sample 7 is corrupt" in m.reason and "DataLoader worker 0" in m.reason
    assert "Traceback" in (tmp_path / "t" / "worker.log").read_text()


def test_host_oom_is_classified_oom(tmp_path: Path):
    cfg = sleepy_config(**{"workload.step": "tests._workloads:huge_alloc_step"})
    m = run_trial(_spec(cfg, num_workers=0, batch_size=4), tmp_path / "t", 60)
    assert m.status == "oom", m
    assert "allocate" in m.reason


def test_a_loader_worker_killed_by_the_kernel_names_memory():
    status, reason = classify_error("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert status == "crashed" and "OOM killer" in reason and "host memory" in reason
