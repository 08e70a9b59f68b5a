"""The device's matmul peak as a sweep measured it, and the datasheet figure shown beside it (never instead of it).

The measured figure is the trial's (``Measurement.matmul_peak_flops``, ``worker/factory/_flops.py``): the same card can
sustain less than its datasheet (clocks, power limit, cooling) and a share of the datasheet would blame the model
for the card. The datasheet figures are NVIDIA's dense (no sparsity) tensor-core rates of the SXM parts unless the
name says PCIe.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tunekit.records import TrialRow

__all__ = ["DATASHEET_TFLOPS", "datasheet_flops", "matmul_peaks"]

DATASHEET_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("h100 pcie", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("nvl", {}),  # H100 NVL, H200 NVL: other clocks and power limits, no figure here
    ("h200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("h100", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("a100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
)
"""Dense TFLOP/s by precision for device names holding the key (lower case), the first key that matches."""


def datasheet_flops(device_name: str | None, precision: str | None) -> float | None:
    """The datasheet's dense FLOP/s of a device named so (``torch.cuda.get_device_name``) in ``precision``
    (``bf16``, ``fp16``, ``tf32``, ``fp32``), or None for a device or precision not listed (every CPU)."""
    name = (device_name or "").lower()
    for key, figures in DATASHEET_TFLOPS:
        if key in name:
            tflops = figures.get(precision or "")
            return tflops * 1e12 if tflops else None
    return None


def matmul_peaks(rows: Iterable[TrialRow]) -> list[dict[str, Any]]:
    """Every matmul probe of a run, in trial order: the trial, its device, the precision, the measured figure (None
    with the reason where the probe failed) and the datasheet's beside it. env.json's ``matmul_peak``."""
    out = []
    for row in sorted(rows, key=lambda r: r.number):
        m = row.measurement
        if m.matmul_peak_flops is None and m.matmul_peak_reason is None:
            continue
        out.append(
            {
                "trial": row.number,
                "device": m.device,
                "device_name": m.device_name,
                "device_uuid": m.device_uuid,
                "precision": m.matmul_peak_precision,
                "flops": m.matmul_peak_flops,
                "datasheet_flops": datasheet_flops(m.device_name, m.matmul_peak_precision),
                "reason": m.matmul_peak_reason,
            }
        )
    return out
