"""Workloads with a known answer, for fidelity tests, benchmarks and a CPU-friendly quickstart.

``sleepy_dataset`` costs a fixed wall time per sample and ``sleepy_model`` a fixed wall time per forward pass,
so the throughput of a correct measurement is known analytically:

* ``num_workers == 0``: ``B / (B * sample_wait_s + step_wait_s)`` samples/s;
* ``num_workers == W > 0``: ``min(W / sample_wait_s, B / step_wait_s)`` samples/s (loader and model overlap).

The sleeps hold no CPU, so the figures hold on a 2-core machine too. ``sample_cpu_s`` instead burns CPU time per
sample, as decoding and augmenting do: such a loader is bound by the cores, not by the number of workers.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

__all__ = ["sleepy_dataset", "sleepy_model", "tensor_dataset", "small_cnn", "expected_samples_per_s"]


class _SleepyDataset(Dataset):
    def __init__(
        self,
        num_samples: int,
        sample_wait_s: float,
        shape: tuple[int, ...],
        num_classes: int,
        hang_at: int | None,
        raise_at: int | None,
        kill_at: int | None,
        pid_dir: str | None,
        sample_cpu_s: float = 0.0,
        print_every: int = 0,
    ):
        self.num_samples = num_samples
        self.print_every = print_every
        self.sample_cpu_s = sample_cpu_s
        self.sample_wait_s = sample_wait_s
        self.shape = tuple(shape)
        self.num_classes = num_classes
        self.hang_at, self.raise_at, self.kill_at = hang_at, raise_at, kill_at
        self.pid_dir = pid_dir
        self._sample = torch.randn(self.shape, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.pid_dir:
            Path(self.pid_dir, str(os.getpid())).touch()
        if self.raise_at is not None and index == self.raise_at:
            raise ValueError(f"sample {index} is corrupt (planted by sleepy_dataset)")
        in_worker = torch.utils.data.get_worker_info() is not None
        if self.kill_at is not None and index == self.kill_at and in_worker:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.hang_at is not None and index == self.hang_at:
            while True:  # a loader that never returns: what timeouts exist for
                time.sleep(3600)
        if self.sample_wait_s > 0:
            time.sleep(self.sample_wait_s)
        if self.print_every and index % self.print_every == 0:
            print(f"sample {index} " + "x" * 1024, flush=True)
        if self.sample_cpu_s > 0:
            end = time.thread_time() + self.sample_cpu_s
            while time.thread_time() < end:  # CPU time, not wall time: contention for cores slows it down
                pass
        return self._sample.clone(), index % self.num_classes


def sleepy_dataset(
    num_samples: int = 100_000,
    sample_wait_s: float = 0.005,
    shape: tuple[int, ...] = (3, 8, 8),
    num_classes: int = 10,
    hang_at: int | None = None,
    raise_at: int | None = None,
    kill_at: int | None = None,
    pid_dir: str | None = None,
    sample_cpu_s: float = 0.0,
    build_wait_s: float = 0.0,
    print_every: int = 0,
) -> Dataset:
    """A dataset whose every sample costs ``sample_wait_s`` of wall time and no CPU (plus ``sample_cpu_s`` of CPU
    time, spent computing).

    Args:
        num_samples: dataset length (the sampler indexes it at random).
        sample_wait_s: wall time per sample.
        shape: shape of each input tensor.
        num_classes: labels are ``index % num_classes``.
        hang_at: an index whose access never returns (for timeout tests).
        raise_at: an index whose access raises ValueError (a corrupt sample).
        kill_at: an index whose access kills the loader worker process with SIGKILL.
        pid_dir: if set, each process that serves a sample touches a file named by its pid there.
        sample_cpu_s: CPU time each sample burns (a busy loop), as decoding does.
        build_wait_s: wall time building the dataset takes (a slow first-time cache).
        print_every: print a line of 1 KiB every this many samples (0: never), as a chatty dataset does.
    """
    if build_wait_s > 0:
        time.sleep(build_wait_s)
    return _SleepyDataset(
        num_samples, sample_wait_s, shape, num_classes, hang_at, raise_at, kill_at, pid_dir, sample_cpu_s, print_every
    )


class _SleepyModel(nn.Module):
    def __init__(self, step_wait_s: float, first_step_wait_s: float, in_features: int, num_classes: int):
        super().__init__()
        self.step_wait_s = step_wait_s
        self.first_step_wait_s = first_step_wait_s
        self.fc = nn.Linear(in_features, num_classes)
        self._calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._calls += 1
        wait = self.first_step_wait_s if self._calls == 1 and self.first_step_wait_s else self.step_wait_s
        if wait > 0:
            time.sleep(wait)
        return self.fc(x.flatten(1).float())


def sleepy_model(
    step_wait_s: float = 0.02, first_step_wait_s: float = 0.0, in_features: int = 192, num_classes: int = 10
) -> nn.Module:
    """A linear model whose forward pass costs ``step_wait_s`` of wall time (``first_step_wait_s`` the first time,
    like a compiling first step).

    Sets torch to one intra-op thread: the model does no real arithmetic, and an idle OpenMP pool between tiny ops
    costs ~10 ms of CPU per step on a 2-core machine, which would blur the known answer.
    """
    torch.set_num_threads(1)
    return _SleepyModel(step_wait_s, first_step_wait_s, in_features, num_classes)


class _TensorDataset(Dataset):
    def __init__(self, num_samples: int, shape: tuple[int, ...], num_classes: int):
        self.data = torch.randn((min(num_samples, 256), *shape), generator=torch.Generator().manual_seed(0))
        self.num_samples = num_samples
        self.num_classes = num_classes

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.data[index % len(self.data)], index % self.num_classes


def tensor_dataset(num_samples: int = 100_000, shape: tuple[int, ...] = (3, 64, 64), num_classes: int = 10) -> Dataset:
    """Cheap data: pre-generated tensors, no decoding. Makes a workload compute-bound."""
    return _TensorDataset(num_samples, tuple(shape), num_classes)


def small_cnn(num_classes: int = 10, width: int = 16) -> nn.Module:
    """A small convolutional classifier that trains at a useful speed on a CPU."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, stride=2, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(inplace=True),
        nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1),
        nn.BatchNorm2d(4 * width),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, num_classes),
    )


def expected_samples_per_s(num_workers: int, batch_size: int, sample_wait_s: float, step_wait_s: float) -> float:
    """The analytic throughput of ``sleepy_dataset`` + ``sleepy_model`` (see the module docstring)."""
    if num_workers == 0:
        return batch_size / (batch_size * sample_wait_s + step_wait_s)
    return min(num_workers / sample_wait_s, batch_size / step_wait_s)
