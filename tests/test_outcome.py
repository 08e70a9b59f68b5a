from __future__ import annotations

import pytest

from tunekit.launch import classify_error

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
