"""Model FLOPs and the device's matmul peak: the count on a model of known FLOPs, the probe, the share
(rules.flop_share) in the verdict, report.md, recommended.yaml and the console lines, and output per unit of
money beside the rate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import measurement, sleepy_config
from tunekit import config, rules
from tunekit.contract import Knobs, TrialSpec
from tunekit.diagnosis._verdicts import COMPUTE_FIXES
from tunekit.env import datasheet_flops
from tunekit.launch import run_trial
from tunekit.records import rows_from_measurements
from tunekit.report import flop_summary, money_summary, summarize
from tunekit.report._markdown import _costs, report_md
from tunekit.report._recommendation import recommendation_yaml
from tunekit.worker.factory._build import build
from tunekit.worker.factory._flops import _dtype, count_flops, matmul_peak
from tunekit.worker.factory._step import TrialStep

WIDTHS = (64, 256, 256, 10)
LINEAR_FLOPS = 6 * sum(a * b for a, b in zip(WIDTHS, WIDTHS[1:], strict=False)) - 2 * WIDTHS[0] * WIDTHS[1]
"""tests._workloads.linear_stack per sample: forward, weight and input gradients of 2 x in x out each, the first
layer's input gradient left out."""


def _linear_config(**overrides) -> dict:
    return sleepy_config(
        **{
            "workload.model": "tests._workloads:linear_stack",
            "workload.model_args": {},
            "workload.dataset": "tunekit.workloads.synthetic:tensor_dataset",
            "workload.dataset_args": {"shape": [WIDTHS[0]], "num_samples": 1024},
            "trial.window_s": 0.2,
            "trial.warmup_steps": 1,
            **overrides,
        }
    )


def _spec(cfg: dict, number: int, mode: str, probe_peak: bool = False, **knobs) -> TrialSpec:
    return TrialSpec(
        number=number,
        stage="single",
        mode=mode,
        knobs=Knobs(**knobs),
        config=config.from_dict(cfg).to_dict(),
        probe_peak=probe_peak,
    )


def test_a_linear_stack_counts_its_known_flops_and_the_trial_asked_measures_the_peak(tmp_path: Path):
    cfg = _linear_config()
    compute = run_trial(_spec(cfg, 0, "compute", probe_peak=True, batch_size=32), tmp_path / "0", 60)
    train = run_trial(_spec(cfg, 1, "train", batch_size=32), tmp_path / "1", 60)
    for m in (compute, train):
        assert m.status == "ok", m
        assert m.flops_per_item == pytest.approx(LINEAR_FLOPS, rel=0.01) and m.flops_reason is None
    assert compute.matmul_peak_flops > 0 and compute.matmul_peak_precision == "fp32"
    assert compute.matmul_peak_reason is None
    assert train.matmul_peak_flops is None and train.matmul_peak_precision is None  # only the trial asked probes
    rows = rows_from_measurements([compute, train])
    for row, m in zip(rows, (compute, train), strict=True):
        share = rules.flop_share(row, rows)
        assert share == pytest.approx(m.rate * m.flops_per_item / compute.matmul_peak_flops) and share > 0


def _built(model: str):
    return build(
        config.from_dict(_linear_config(**{"workload.model": model})), Knobs(batch_size=4), torch.device("cpu")
    )


def _step(on_device) -> TrialStep:
    return TrialStep(batches=iter(()), run=lambda b: None, count=lambda b: 4, ready=lambda: 0, on_device=on_device)


def test_a_count_leaves_no_gradient_and_one_that_fails_is_a_reason():
    batch = (torch.randn(4, WIDTHS[0]), torch.zeros(4, dtype=torch.long))
    built = _built("tests._workloads:linear_stack")
    # backward over forward: (3 x 2 - 1 x 2 x 64 x 256 / total forward) of a stack whose first layer needs no
    # input gradient
    forward = 2 * sum(a * b for a, b in zip(WIDTHS, WIDTHS[1:], strict=False))
    assert count_flops(_step(lambda: (batch, 4.0)), built, step_updates=False) == {
        "flops_per_item": pytest.approx(LINEAR_FLOPS, rel=0.01),
        "flops_reason": None,
        "flops_backward_ratio": pytest.approx((LINEAR_FLOPS - forward) / forward, rel=0.01),
    }
    assert all(p.grad is None for p in built.model.parameters())

    def broken():
        raise RuntimeError("no batch\nsecond line")

    assert count_flops(_step(broken), built, False) == {
        "flops_per_item": None,
        "flops_reason": "counting failed: RuntimeError: no batch",
        "flops_backward_ratio": None,
    }
    assert count_flops(_step(None), built, False)["flops_reason"] == "a loader trial runs no model"
    elementwise = count_flops(_step(lambda: (batch, 4.0)), _built("tests._workloads:no_matmul_model"), False)
    assert elementwise["flops_per_item"] is None and "no matrix multiply" in elementwise["flops_reason"]


def _analytic_forward(model: torch.nn.Module, x: torch.Tensor) -> int:
    """The forward's FLOPs of ``model``'s convolutions and linear layers on ``x``, from their shapes (2 x
    multiply-adds: for a convolution, every output point x its kernel x its group's input channels)."""
    total = 0

    def conv(module: torch.nn.Conv2d, _: object, out: torch.Tensor) -> None:
        nonlocal total
        kh, kw = module.kernel_size
        total += 2 * out.numel() * kh * kw * module.in_channels // module.groups

    def linear(module: torch.nn.Linear, _: object, out: torch.Tensor) -> None:
        nonlocal total
        total += 2 * out.numel() * module.in_features

    hooks = [m.register_forward_hook(conv) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    hooks += [m.register_forward_hook(linear) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        model(x)
    for hook in hooks:
        hook.remove()
    return total


def _grouped(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    from torchvision.models import convnext_tiny
    from torchvision.models.mobilenetv2 import InvertedResidual
    from torchvision.models.resnet import Bottleneck

    torch.manual_seed(0)
    if name == "convnext_tiny":
        return convnext_tiny(), torch.randn(1, 3, 32, 32)
    if name == "mobilenet block":  # a depthwise 3 x 3 between two pointwise convolutions
        return InvertedResidual(32, 32, 1, 6), torch.randn(2, 32, 28, 28)
    return Bottleneck(256, 64, groups=32, base_width=4), torch.randn(2, 256, 14, 14)  # ResNeXt's 32 x 4d


@pytest.mark.parametrize("name", ["convnext_tiny", "mobilenet block", "resnext block"])
def test_a_grouped_convolutions_backward_counts_twice_its_forward(name: str):
    """Grouped and depthwise convolutions (ConvNeXt, MobileNet, ResNeXt): the count, forward and backward, is three
    times the forward's analytic count within 10 % (torch's own formula counts the weight gradient as dense:
    ConvNeXt-Tiny's backward 100 times its forward), and its backward over forward lies in the band."""
    from tunekit.worker.factory._flops import counted

    model, x = _grouped(name)
    x.requires_grad_(True)
    analytic = _analytic_forward(model, x)
    forward, total = counted(lambda: model(x).float().square().mean())
    assert forward == pytest.approx(analytic, rel=0.01)
    assert total == pytest.approx(3 * analytic, rel=0.10), total / analytic
    low, high = rules.FLOP_BACKWARD_BAND
    assert low <= (total - forward) / forward <= high


def test_an_uncertain_count_decides_no_fix():
    """A count whose backward is 100 times its forward (a miscounted op): the compute-bound verdict's fix does not
    turn on its share (58 % of the peak named a faster card), and report.md and recommended.yaml say it is
    uncertain."""
    from tunekit.diagnosis._verdicts import FIXES

    s = _run(200e12, ratio=100.0)
    verdict = s.trial_verdicts[3]
    assert verdict.name == "compute-bound" and verdict.fix == FIXES["compute-bound"], verdict
    assert "its backward counted 100.0x its forward (expected 1.5-2.5x)" in verdict.sentence()
    assert "**Uncertain**: the count's backward is 100.0x its forward" in flop_summary(s)
    assert yaml.safe_load(recommendation_yaml(s))["evidence"]["model_flops"]["uncertain_backward_ratio"] == 100.0
    assert _run(200e12, ratio=None).trial_verdicts[3].fix == COMPUTE_FIXES["card"]  # no ratio: nothing to doubt


def test_the_matmul_probe_gives_a_figure_in_the_workload_s_precision_or_a_reason():
    cpu = torch.device("cpu")
    fp32 = matmul_peak(cpu, "fp32", size=128, seconds=0.02)
    assert fp32["matmul_peak_flops"] > 0 and fp32["matmul_peak_precision"] == "fp32"
    assert fp32["matmul_peak_reason"] is None
    assert matmul_peak(cpu, "bf16", size=64, seconds=0.01)["matmul_peak_precision"] == "bf16"
    failed = matmul_peak(cpu, "fp16", size=-1)
    assert failed["matmul_peak_flops"] is None and failed["matmul_peak_precision"] == "fp16"
    assert failed["matmul_peak_reason"].startswith("the matmul probe failed: RuntimeError")
    cuda, tf32 = torch.device("cuda", 0), torch.backends.cuda.matmul.allow_tf32  # a flag: no CUDA needed
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert _dtype(cuda, "fp32") == (torch.float32, "tf32") and _dtype(cpu, "fp32") == (torch.float32, "fp32")
        torch.backends.cuda.matmul.allow_tf32 = False
        assert _dtype(cuda, "fp32") == (torch.float32, "fp32")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def test_datasheet_figures_for_known_names_only():
    assert datasheet_flops("NVIDIA H200", "bf16") == 989e12
    assert datasheet_flops("NVIDIA H100 80GB HBM3", "tf32") == 494e12
    assert datasheet_flops("NVIDIA H100 PCIe", "fp16") == 756e12
    assert datasheet_flops("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert datasheet_flops("NVIDIA H100 NVL", "bf16") is None
    assert datasheet_flops("CPU: Intel Xeon", "fp32") is None


GPU = {"device": "cuda:0", "device_uuid": "GPU-1", "device_name": "NVIDIA H200"}
FLOPS = 24e9


def _run(peak: float, ratio: float | None = 2.0, **cfg_overrides):
    """A ResNet-like run on an H200 whose compute trial at batch 512 measured the matmul peak: the knee (8 workers)
    within 2 % of the best (16), the PyTorch defaults a fifth of it; ``ratio``: each count's backward over its
    forward."""
    cfg = config.from_dict(
        sleepy_config(**{"search.batch_size": [256, 512], "search.num_workers": [0, 8, 16], **cfg_overrides})
    )
    probe = {"matmul_peak_flops": peak, "matmul_peak_precision": "bf16"}
    GPU = {**globals()["GPU"], "flops_backward_ratio": ratio}
    rows = rows_from_measurements(
        [
            measurement(0, "compute", "compute", 5000, batch_size=512, flops_per_item=FLOPS, **GPU, **probe),
            measurement(1, "compute", "compute", 4000, batch_size=256, flops_per_item=FLOPS, **GPU),
            measurement(
                2, "end_to_end", "train", 1000, batch_size=512, data_wait_frac=0.8, flops_per_item=FLOPS, **GPU
            ),
            measurement(3, "end_to_end", "train", 4800, batch_size=512, num_workers=8, flops_per_item=FLOPS, **GPU),
            measurement(4, "end_to_end", "train", 4900, batch_size=512, num_workers=16, flops_per_item=FLOPS, **GPU),
        ]
    )
    return summarize(cfg, rows, strategy="staged")


def test_the_share_and_the_output_per_money_in_the_report_the_evidence_and_the_console():
    s = _run(500e12, **{"cost.per_hour": 3.6})
    knee = s.choice.knee
    assert (knee.number, s.choice.best.number, s.defaults.number) == (3, 4, 2)
    assert s.flop_share(knee) == pytest.approx(4800 * FLOPS / 500e12)
    said = (
        "Model FLOP utilisation: the knee 23.0%, its compute ceiling (batch 512) 24.0% of this device's "
        "measured matmul peak (24.0 GFLOP per sample, forward and backward, counted with FlopCounterMode, "
        "grouped convolutions' backward corrected; peak 500.0 TFLOP/s in bf16, trial 0; datasheet 989.0 "
        "TFLOP/s)."
    )
    assert flop_summary(s) == said
    md = report_md(s, [], {})
    assert said in md
    assert "**8 workers, prefetch 2, not pinned, batch 512** — 4,800,000 samples per unit of money at 4800.0 " in md
    assert (
        "- matmul peak in bf16: 500.0 TFLOP/s sustained on NVIDIA H200 (cuda:0), measured in trial 0; datasheet "
        "989.0 TFLOP/s" in md
    )
    trial_1 = next(line for line in md.splitlines() if line.startswith("| 1 | compute"))
    assert "| 19.2% |" in trial_1  # the share at each batch (and compile mode): a column of the trials table
    costs = _costs(s)
    assert "samples per unit of money" in costs[0]
    assert costs[2].startswith("| knee | 3 | 4800.0 | 4,800,000 | ") and costs[3].startswith(
        "| best | 4 | 4900.0 | 4,900,000 | "
    )
    evidence = yaml.safe_load(recommendation_yaml(s))["evidence"]
    assert list(evidence)[:4] == ["unit", "items_per_money", "rate", "flop_share"]
    assert evidence["items_per_money"] == 4_800_000 and evidence["best_items_per_money"] == 4_900_000
    assert evidence["defaults_items_per_money"] == 1_000_000
    assert evidence["flop_share"] == pytest.approx(0.2304)
    assert evidence["model_flops"] == {
        "flops_per_item": FLOPS,
        "flops_reason": None,
        "uncertain_backward_ratio": None,
        "share_of_peak": 0.2304,
        "ceiling_share_of_peak": 0.24,
        "ceiling_trial": 0,
        "matmul_peak_flops": 500e12,
        "matmul_peak_precision": "bf16",
        "matmul_peak_trial": 0,
        "datasheet_flops": 989e12,
    }
    assert money_summary(s) == (
        "4,800,000 samples per unit of money at 4800.0 samples/s (cost.per_hour 3.6); best "
        "4,900,000, defaults 1,000,000."
    )
    assert money_summary(_run(500e12)) is None  # no price, no money
    tokens = flop_summary(
        _run(500e12, **{"workload.unit": "tokens", "workload.count": "tunekit.workloads.text:count_tokens"})
    )
    assert (
        "forward and backward, counted with FlopCounterMode, grouped convolutions' backward corrected, on one "
        "batch, its padding's work included: shares "
        "of executed FLOPs" in tokens
    )  # the tokens counted are not the positions the model computed on


def test_the_compute_bound_fix_turns_on_the_share_of_the_peak():
    low, high = _run(500e12), _run(200e12)  # the knee at 23 % and at 58 % of the peak
    for s, fix in ((low, COMPUTE_FIXES["kernels"]), (high, COMPUTE_FIXES["card"])):
        verdict = s.trial_verdicts[3]
        assert verdict.name == "compute-bound" and verdict.fix == fix
        assert verdict.evidence["of the device's measured matmul peak"] == pytest.approx(s.flop_share(s.choice.knee))
    assert "reduce-overhead" in low.trial_verdicts[3].fix and "channels_last" in low.trial_verdicts[3].fix
    assert "cheaper model" in high.trial_verdicts[3].fix
    no_peak = _run(0.0)  # no figure: the share is unknown, the fix the general one, and the report says why
    assert no_peak.flop_share(no_peak.choice.knee) is None
    assert "of the device's measured matmul peak" not in no_peak.trial_verdicts[3].evidence
    assert (
        flop_summary(no_peak) == "Model FLOP utilisation: not known: no matmul peak of this device (no trial "
        "measured it)."
    )
