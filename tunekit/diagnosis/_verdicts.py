from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tunekit import rules

VERDICTS: tuple[str, ...] = (
    "shared-host",
    "shared-gpu",
    "memory-wall",
    "h2d-copy",
    "cpu-preprocessing",
    "data-starved",
    "communication-bound",
    "gpu-preprocessing",
    "cpu-contention",
    "overhead-bound",
    "compute-bound",
    "unattributed",
)
"""The fixed vocabulary, in precedence order: a trial's predicates are tried in this order and the first that
holds is its verdict. h2d-copy comes before the data verdicts because a copy bound also makes the loop wait: when
pinning measurably beats every unpinned config with as many workers or fewer, more workers are not the fix."""

FIXES: dict[str, str] = {
    "data-starved": "the loop waits on batches the loader does not deliver in time: raise num_workers and "
    "prefetch_factor and keep workers persistent; when the workers wait rather than compute "
    "(their CPU time per item is far below their wall time per item: slow or remote storage), "
    "go beyond the usable core count, cache the data locally or move it to faster storage",
    "cpu-preprocessing": "decoding and augmentation are the bound: decode and augment on the GPU "
    "(torchvision.io.decode_jpeg on the device, NVIDIA DALI), use pillow-simd, lower the input "
    "resolution, or cache decoded samples",
    "communication-bound": "gradient synchronisation between the ranks is the bound: accumulate gradients "
    "(search.grad_accum or target_effective_batch) so the ranks sync once per several "
    "micro-batches, raise DDP's bucket_cap_mb, and check the GPU interconnect (nvidia-smi topo "
    "-m: NVLink rather than PCIe through a shared switch, links at their full width)",
    "gpu-preprocessing": "decoding and augmentation inside the training step are the bound (the loop does not "
    "wait for data, yet the step is slower than the model's own on a ready batch): when they "
    "run inside the step, overlap them with the previous step (decode the next batch on a side "
    "CUDA stream, as NVIDIA DALI's pipelines do; decode: gpu-overlap in tunekit's image "
    "pipelines); when they already run ahead, they share the GPU with training: decode at a "
    "lower resolution, or give part of the work back to the loader workers",
    "cpu-contention": "the loader and the training step compete for the same CPU cores: the step runs slower than "
    "on its own though it does not wait for data (with no workers, the workers measured were no "
    "faster): keep to the fewest workers that keep up, cap torch's intra-op threads "
    "(search.threads, search.worker_threads) so they and the workers do not oversubscribe the "
    "cores, move decoding off the CPU, or train on a GPU when the model runs on the CPU",
    "overhead-bound": "launches and fixed per-step costs dominate: use a larger batch, CUDA graphs via "
    "torch.compile(mode='reduce-overhead'), or kernel fusion via torch.compile",
    "memory-wall": "cap the batch below the OOM boundary and reach the effective batch with gradient accumulation "
    "(search.target_effective_batch); bf16 or activation checkpointing free more",
    "h2d-copy": "host-to-device copies block compute: set pin_memory=True and copy with .to(device, non_blocking=True)",
    "compute-bound": "the input pipeline keeps up: speed up the model itself (torch.compile, bf16, channels_last, "
    "fused optimizers) or use a faster GPU",
    "shared-gpu": "the measurement is disturbed: check nvidia-smi for other processes, clock throttling (power, "
    "thermal), and rerun on an idle GPU",
    "shared-host": "the measurement is disturbed: other processes kept the machine's CPUs busy (see top or htop), "
    "so loading, launches and the step itself ran slower and their windows scattered; rerun when the "
    "machine is idle, or on one of its own",
    "unattributed": "no single bound stands out: compare the trial's step time with the compute ceiling's and "
    "profile one step (torch.profiler) to see where the rest goes",
}


COMPUTE_FIXES: dict[str, str] = {
    "kernels": "the input pipeline keeps up and the model's step keeps this device's matrix units busy for a small "
    "share of its time: speed up the model itself where its kernels lose it: channels_last for "
    "convolutions, a larger batch, torch.compile (kernel fusion), CUDA graphs "
    "(torch.compile(mode='reduce-overhead')) for a launch-bound step, fused optimizers (fused=True), bf16 "
    "when the step runs in fp32",
    "card": "the input pipeline keeps up and the model's step runs near what this device's matrix units sustain: "
    "kernel work has little left to gain; the next lever is a cheaper model (fewer FLOPs per item: a "
    "smaller model, a lower resolution, shorter sequences) or a faster card (in fp32 or TF32, bf16 first: "
    "the card's bf16 peak is twice its TF32 one)",
}
"""The compute-bound fix by the model's share of the measured matmul peak: below :data:`rules.MATMUL_SHARE_HIGH`
the kernels, at or above it the card. Without a share (no FLOP count, no peak) the fix is ``FIXES``'s."""


def compute_fix(share: float | None) -> str:
    """The first fix of a compute-bound trial whose model runs at ``share`` of the device's matmul peak."""
    if share is None:
        return FIXES["compute-bound"]
    return COMPUTE_FIXES["card" if share >= rules.MATMUL_SHARE_HIGH else "kernels"]


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


def verdict(name: str, evidence: dict[str, Any], trial: int | None = None, fix: str | None = None) -> Verdict:
    """A verdict with the fix of its name (or ``fix``)."""
    return Verdict(name, evidence, fix or FIXES[name], trial)


def _show(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.1%}" if 0 <= v <= 1.5 else f"{v:.1f}"
    return str(v)
