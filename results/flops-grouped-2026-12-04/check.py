"""FLOPs of grouped-convolution models, forward and backward at 224 px, batch 8, under bf16 autocast: the analytic
forward count (every convolution and linear layer from its shapes), torch's FlopCounterMode as it is, and tunekit's
count (torch's with a grouped convolution's backward counted right).
Usage: PYTHONPATH=. python results/flops-grouped-2026-12-04/check.py [DEVICE]"""
import sys

import torch
import torchvision
from torch.utils.flop_counter import FlopCounterMode

from tests.worker.test_factory import _analytic_forward as analytic_forward  # one analytic count, tested
from tunekit.worker._flops import counted


def main():
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    print(f"{'model':22} {'analytic fwd GFLOP/img':>22} {'torch fwd+bwd / fwd':>20} {'tunekit fwd+bwd / fwd':>22} "
          f"{'tunekit / (3 x analytic)':>25}")
    for name in ("convnext_tiny", "convnext_large", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf",
                 "resnext50_32x4d", "resnet50"):
        model = torchvision.models.get_model(name).to(device)
        x = torch.randn(8, 3, 224, 224, device=device)
        analytic = analytic_forward(model, x)

        def loss():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                return model(x).float().square().mean()

        torch_counter = FlopCounterMode(display=False)
        with torch_counter:
            loss().backward()
        model.zero_grad(set_to_none=True)
        forward, total = counted(loss)
        model.zero_grad(set_to_none=True)
        print(f"{name:22} {analytic / 8 / 1e9:22.2f} {torch_counter.get_total_flops() / forward:20.2f} "
              f"{total / forward:22.2f} {total / (3 * analytic):25.3f}", flush=True)


if __name__ == "__main__":
    main()
