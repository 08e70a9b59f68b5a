"""What the model asks of the device and what the device can do: the floating-point operations of one micro-batch's
forward and backward per item (``torch.utils.flop_counter.FlopCounterMode``), and the sustained rate of a large
matrix multiply in the workload's precision (the matmul peak). Both run after the windows and after the memory peaks
are read, so neither touches a measured figure; a count or a probe that fails is a None with its reason, never a
failed trial."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from tunekit.worker.factory._build import Built
from tunekit.worker.factory._step import TrialStep

__all__ = ["count_flops", "counted", "matmul_peak", "PROBE"]

PROBE: dict[str, tuple[int, float]] = {"cuda": (8192, 1.0), "cpu": (512, 0.1)}
"""Square matrix size and timed seconds of the matmul probe by device type. On a GPU, 8192 keeps the tensor cores
busy with no tail of partial tiles (bf16: 1.1 TFLOP a multiply, about 1.5 ms on an H200-class card; three matrices
of 128 MiB); warm-up, sizing and the timed second take about 1.3 s. On a CPU, 512 already runs at the BLAS's
full rate (the same GFLOP/s as 1024 on a 2-core host), in a tenth of a second."""


def count_flops(step: TrialStep, built: Built, step_updates: bool) -> dict[str, Any]:
    """``flops_per_item`` and ``flops_reason``: one more micro-batch of the trial, moved to the device as the step
    gets it (outside the count: a dataset's own device-side decoding is input work, not the model's), then the
    forward under the trial's autocast and the backward, counted. The optimizer step is left out (with
    ``step_updates`` the workload's own step runs whole, update included); FlopCounterMode has formulas for
    matrix multiplies, convolutions and attention only, so elementwise work (normalisation, activations, the
    optimizer) counts 0 either way. A compiled model is counted as its eager module: the same arithmetic, and no
    recompilation under the counting mode. Gradients are dropped afterwards."""
    if step.on_device is None:
        return _not_counted("a loader trial runs no model")
    if built.ddp is not None:  # a backward on one rank alone would wait for its peers' gradients
        return _not_counted("counted on one-rank trials (DDP syncs the gradients of every backward)")
    model = getattr(built.model, "_orig_mod", built.model)
    try:
        batch, items = step.on_device()

        def forward() -> Any:
            with built.autocast():
                return built.step_fn(model, batch, built.ctx)

        forward_flops, total = counted(forward, backward=not step_updates)
    except Exception as exc:  # noqa: BLE001 - a count that fails is data
        return _not_counted(f"counting failed: {_one_line(exc)}")
    finally:
        built.optimizer.zero_grad(set_to_none=True)
    if total <= 0:
        return _not_counted(
            "FlopCounterMode counted no matrix multiply, convolution or attention: the model's work "
            "is in ops it has no formula for (custom kernels)"
        )
    ratio = (total - forward_flops) / forward_flops if forward_flops > 0 and not step_updates else None
    return {"flops_per_item": total / items, "flops_reason": None, "flops_backward_ratio": ratio}


def counted(forward: Callable[[], Any], backward: bool = True) -> tuple[int, int]:
    """The FLOPs of ``forward()`` and, with ``backward``, of it and the backward of the loss it returns:
    (forward, total), counted by ``FlopCounterMode`` with a grouped convolution's backward counted right
    (:func:`conv_backward_flops`)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops})
    with counter:
        loss = forward()
        forward_flops = counter.get_total_flops()
        if backward:
            loss.backward()
    return forward_flops, counter.get_total_flops()


def conv_backward_flops(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    groups: int,
    output_mask: list[bool],
    out_shape: Any,
    **_: Any,
) -> int:
    """The FLOPs of a convolution's backward: the input's gradient, a transposed convolution of the output's
    gradient with the weight (whose shape holds in channels / groups, so a grouped convolution counts right), and
    the weight's gradient, a convolution of the input with the output's gradient over every pair of channels, of
    which only the ``groups`` blocks on the diagonal are computed: divided by ``groups``. torch's own formula
    (torch 2.4-2.14) leaves that division out, so a depthwise convolution's weight gradient counts as many times
    too much as it has channels: ConvNeXt's backward at 200 times its forward instead of twice."""
    from torch.utils.flop_counter import conv_flop_count, get_shape

    def swap(shape: list[int]) -> list[int]:
        return [shape[1], shape[0], *shape[2:]]

    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, get_shape(out_shape[0]), not transposed)
    if output_mask[1]:
        pair = (swap(grad_out_shape), swap(x_shape)) if transposed else (swap(x_shape), swap(grad_out_shape))
        flops += conv_flop_count(*pair, swap(get_shape(out_shape[1])), transposed=False) // groups
    return flops


def matmul_peak(
    device: torch.device, precision: str, size: int | None = None, seconds: float | None = None
) -> dict[str, Any]:
    """``matmul_peak_flops``, ``matmul_peak_precision`` and ``matmul_peak_reason``: the rate of back-to-back
    multiplies of two random ``size`` x ``size`` matrices over ``seconds`` on ``device`` (defaults: :data:`PROBE`),
    in the trial's precision: bf16 or fp16, else fp32 with TF32 where the trial allows it (``torch.backends.cuda.
    matmul.allow_tf32``, as the trial set it). Warmed up once (the library's kernel choice), then once more for a
    quarter of the timed calls (clocks up to their sustained level); the device is synchronised before the clock
    starts and after the last call."""
    dtype, label = _dtype(device, precision)
    default_size, default_seconds = PROBE.get(device.type, PROBE["cpu"])
    try:
        flops = _sustained(device, dtype, size or default_size, seconds or default_seconds)
    except Exception as exc:  # noqa: BLE001 - a probe that fails is data
        return {
            "matmul_peak_flops": None,
            "matmul_peak_precision": label,
            "matmul_peak_reason": f"the matmul probe failed: {_one_line(exc)}",
        }
    return {"matmul_peak_flops": flops, "matmul_peak_precision": label, "matmul_peak_reason": None}


def _dtype(device: torch.device, precision: str) -> tuple[torch.dtype, str]:
    if precision == "bf16":
        return torch.bfloat16, "bf16"
    if precision == "fp16":
        return torch.float16, "fp16"
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    return torch.float32, "tf32" if tf32 else "fp32"


def _sustained(device: torch.device, dtype: torch.dtype, size: int, seconds: float) -> float:
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    out = torch.empty_like(a)

    def timed(calls: int) -> float:
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=out)
        _sync(device)
        return time.perf_counter() - t0

    timed(1)
    calls = max(1, math.ceil(seconds / max(timed(1), 1e-9)))
    timed(max(1, calls // 4))
    spent = timed(calls)
    return 2.0 * size**3 * calls / spent


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _not_counted(reason: str) -> dict[str, Any]:
    return {"flops_per_item": None, "flops_reason": reason, "flops_backward_ratio": None}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
