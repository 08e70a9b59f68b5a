"""The FLOP share a sweep reported for ConvNeXt-Tiny against the share from the analytic count: each trial's rate x
FLOPs per item over the measured matmul peak, with FLOPs per item from tunekit's count and from 3 x the analytic
forward (every convolution's and linear layer's multiply-adds from their shapes). Usage: share.py RUN_DIR"""
import json
import sys
from pathlib import Path

import torch
import torchvision

from tests.worker.test_factory import _analytic_forward as analytic_forward


def main() -> None:
    run = Path(sys.argv[1])
    trials = [json.loads(p.read_text()) for p in sorted(run.glob("trials/*/measurement.json"))]
    peak = next(m["matmul_peak_flops"] for m in trials if m.get("matmul_peak_flops"))
    model = torchvision.models.convnext_tiny(num_classes=100)
    analytic = 3 * analytic_forward(model, torch.randn(1, 3, 224, 224))  # forward + backward, per image
    print(f"matmul peak measured: {peak / 1e12:.0f} TFLOP/s; analytic forward + backward: {analytic / 1e9:.2f} GFLOP "
          "per image")
    for m in trials:
        if m["status"] != "ok" or not m.get("flops_per_item"):
            continue
        counted, rate = m["flops_per_item"], m["rate"]
        print(f"trial {m['number']} {m['stage']}/{m['mode']}: {rate:.0f} images/s; tunekit counts "
              f"{counted / 1e9:.2f} GFLOP per image (backward/forward {m.get('flops_backward_ratio')}), "
              f"{counted / analytic:.3f} x analytic; share {rate * counted / peak:.1%} against "
              f"{rate * analytic / peak:.1%} from the analytic count")
    rec = run / "recommended.yaml"
    if rec.exists():
        import yaml
        ev = yaml.safe_load(rec.read_text())["evidence"]
        print("recommended.yaml: flop_share", ev.get("flop_share"), "model_flops", ev.get("model_flops"))


if __name__ == "__main__":
    main()
