"""Test-only workload pieces, imported by trial workers through their import paths (tests._workloads:...)."""

from __future__ import annotations

import os
import signal

import torch


def huge_alloc_step(model, batch, ctx):
    """Asks the host allocator for far more memory than any machine has: a real host OOM error."""
    torch.empty(1 << 50, dtype=torch.uint8)
    return model(batch[0]).sum()


def self_kill_step(model, batch, ctx):
    """Dies the way the kernel's OOM killer ends a process: SIGKILL, no message."""
    os.kill(os.getpid(), signal.SIGKILL)


def nan_step(model, batch, ctx):
    return model(batch[0]).sum() * float("nan")


def inf_step(model, batch, ctx):
    """A loss of +Inf, as an overflow gives, whose gradient is zero: the weights stay finite, so every loss the
    trial checks is Inf (not the NaN that Inf gradients would turn the next losses into)."""
    return model(batch[0]).sum() * 0.0 + float("inf")


class _Stream(torch.utils.data.IterableDataset):
    """An endless stream of (input, label) samples; ``sharded`` splits it across DataLoader workers as it should."""

    def __init__(self, sharded: bool):
        self.sharded = sharded

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if self.sharded and info is not None else (0, 1)
        i = start
        while True:
            yield torch.full((3, 8, 8), float(i)), i % 10
            i += step


class _Finite(torch.utils.data.IterableDataset):
    """``n`` samples, sharded across the DataLoader's workers; then the stream ends."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, self.n, step):
            yield torch.full((2,), float(i))


def finite_stream(n: int = 8):
    return _Finite(n)


def sharded_stream():
    return _Stream(sharded=True)


def unsharded_stream():
    """The classic bug: every worker yields the whole stream."""
    return _Stream(sharded=False)


def own_loader(dataset, **knobs):
    """A user's DataLoader factory: its own collate, the knobs passed on."""
    return torch.utils.data.DataLoader(
        dataset, shuffle=True, drop_last=True, collate_fn=torch.utils.data.default_collate, **knobs
    )


def loader_ignoring_workers(dataset, **knobs):
    """A factory that drops num_workers: the trial would measure another loader."""
    knobs = {k: v for k, v in knobs.items() if k not in ("num_workers", "prefetch_factor", "persistent_workers")}
    return torch.utils.data.DataLoader(dataset, shuffle=True, drop_last=True, **knobs)


def clipping_step(model, batch, ctx):
    """A step that owns the update: backward, gradient clipping, the optimizer step; returns the detached loss."""
    loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
    (loss / ctx.grad_accum).backward()
    if (ctx.micro_step + 1) % ctx.grad_accum == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def rank1_raises_step(model, batch, ctx):
    """A step that fails on rank 1 only: the other rank blocks in the next collective until torchrun stops it."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() == 1:
        raise RuntimeError("rank one's step broke")
    return ctx.loss_fn(model(batch[0]), batch[1])


_STEPS = {"count": 0}


def rank1_killed_step(model, batch, ctx):
    """A step that kills rank 1's process outright (as the OOM killer would) on its 4th call: it writes nothing,
    and rank 0 then fails in a collective with a lost peer."""
    import os
    import signal

    import torch.distributed as dist

    _STEPS["count"] += 1
    if dist.is_initialized() and dist.get_rank() == 1 and _STEPS["count"] == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return ctx.loss_fn(model(batch[0]), batch[1])


class _SettlingModel(torch.nn.Module):
    """A linear model whose steps take ``slow_s`` up to call ``fast_after`` (warm-up included) and ``step_s`` after:
    a pipeline still settling when the first window starts."""

    def __init__(self, step_s: float, slow_s: float, fast_after: int):
        super().__init__()
        self.fc = torch.nn.Linear(192, 10)
        self.step_s, self.slow_s, self.fast_after, self.calls = step_s, slow_s, fast_after, 0

    def forward(self, x):
        import time

        self.calls += 1
        time.sleep(self.slow_s if self.calls <= self.fast_after else self.step_s)
        return self.fc(x.flatten(1).float())


def settling_model(step_s: float = 0.02, slow_s: float = 0.04, fast_after: int = 12):
    torch.set_num_threads(1)
    return _SettlingModel(step_s, slow_s, fast_after)


class _CyclingModel(torch.nn.Module):
    """A linear model whose steps take the times of ``pattern`` in turn: one slow step in six, and windows of three
    steps (``MIN_WINDOW_STEPS``, when three fast ones outlast ``window_s``) hold it in turn, so that consecutive
    windows' rates differ about 2x however they fall."""

    def __init__(self, pattern: tuple[float, ...]):
        super().__init__()
        self.fc = torch.nn.Linear(192, 10)
        self.pattern, self.calls = pattern, 0

    def forward(self, x):
        import time

        time.sleep(self.pattern[self.calls % len(self.pattern)])
        self.calls += 1
        return self.fc(x.flatten(1).float())


def cycling_model(pattern: tuple[float, ...] = (0.05, 0.05, 0.05, 0.05, 0.05, 0.2)):
    torch.set_num_threads(1)
    return _CyclingModel(tuple(pattern))


_BUILDS = []
"""Models built in this process: a trial that finds one already built ran in a process another trial used."""


def once_per_process_model(step_wait_s: float = 0.005):
    """The sleepy model, refusing to be built twice in one process (the fork server's isolation, tested)."""
    from tunekit.workloads.synthetic import sleepy_model

    if _BUILDS:
        raise RuntimeError(f"a model was already built in this process (pid {_BUILDS[0]})")
    _BUILDS.append(os.getpid())
    return sleepy_model(step_wait_s=step_wait_s)


class _MovedAhead(torch.utils.data.Dataset):
    """A dataset that moves its batches itself, one batch ahead (as ``decode: gpu-overlap`` does on a GPU): its
    move negates the inputs and checks that it runs in the trial's ahead thread, so a batch the step sees unmoved,
    or moved in the step's own thread, fails the trial."""

    batch_to_device_ahead = True

    def __init__(self, shape=(3, 8, 8)):
        self.shape = tuple(shape)

    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        return torch.ones(self.shape), index % 10

    @staticmethod
    def batch_to_device(batch, ctx, non_blocking):
        import threading

        if threading.current_thread().name != "tunekit-ahead":
            raise RuntimeError(f"moved in thread {threading.current_thread().name}")
        inputs, labels = batch
        return -inputs.to(ctx.device), labels.to(ctx.device)


def moved_ahead_dataset():
    return _MovedAhead()


def moved_ahead_step(model, batch, ctx):
    inputs, labels = batch
    if not bool((inputs < 0).all()):
        raise RuntimeError("the step got a batch that was not moved")
    return torch.nn.functional.cross_entropy(model(inputs), labels)


class _ThreadsSeen(torch.utils.data.Dataset):
    """Samples that fail in a loader worker whose intra-op thread count is not ``expect`` (search.worker_threads
    must reach the workers)."""

    def __init__(self, expect: int):
        self.expect = expect

    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        if torch.utils.data.get_worker_info() is not None and torch.get_num_threads() != self.expect:
            raise RuntimeError(f"worker runs {torch.get_num_threads()} threads, expected {self.expect}")
        return torch.ones(3, 8, 8), index % 10


def threads_seen_dataset(expect: int = 1):
    return _ThreadsSeen(expect)


class _BracketedFailure(torch.utils.data.Dataset):
    """Samples that fail in the worker of a one-worker loader with a message in square brackets, as gloo's errors
    (``[/__w/pytorch/...]``) and many file errors are: the sweep must print it as text. The main process and a
    loader of two workers load them, so a grid over 0, 1 and 2 workers crashes in its middle and goes on."""

    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers == 1:
            raise OSError(
                "cannot decode [/data/img1.jpg]: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
                "tcp/pair.cc:534] Connection closed by peer [bold]"
            )
        return torch.ones(3, 8, 8), index % 10


def bracketed_failure_dataset():
    return _BracketedFailure()


def linear_stack(widths: tuple[int, ...] = (64, 256, 256, 10)) -> torch.nn.Module:
    """Linear layers with ReLUs between them, of known FLOPs per sample: 2 x in x out for each layer's forward, as
    much for its weight gradient and for its input gradient (but the first layer's: its input needs none)."""
    layers: list[torch.nn.Module] = [torch.nn.Flatten()]
    for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        layers += [torch.nn.ReLU()] if i else []
        layers.append(torch.nn.Linear(a, b))
    return torch.nn.Sequential(*layers)


class _NoMatmul(torch.nn.Module):
    """A model without a matrix multiply: its output is its input plus a bias, elementwise."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :10] + self.bias


def no_matmul_model() -> torch.nn.Module:
    return _NoMatmul()
