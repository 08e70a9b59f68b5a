"""A trial of factories named in a config (tunekit/worker/factory/): each mode's built-in step, the batch moved
ahead, a user's loader, step and collate, and the model's FLOPs and the device's matmul peak, counted on models of
known FLOPs."""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import sleepy_config
from tests.worker.test_meter import _batch8_spec, _spec, _trial
from tunekit import config, rules
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial
from tunekit.records import rows_from_measurements
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


def _probe_spec(cfg: dict, number: int, mode: str, probe_peak: bool = False, **knobs) -> TrialSpec:
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
    compute = run_trial(_probe_spec(cfg, 0, "compute", probe_peak=True, batch_size=32), tmp_path / "0", 60)
    train = run_trial(_probe_spec(cfg, 1, "train", batch_size=32), tmp_path / "1", 60)
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


TEXT = {
    "workload.model": "tunekit.workloads.text:gpt_model",
    "workload.model_args": {"vocab_size": 512, "context": 64, "layers": 1, "heads": 2, "width": 32},
    "workload.dataset": "tunekit.workloads.text:synthetic_documents",
    "workload.dataset_args": {"vocab_size": 512, "context": 64, "min_words": 5, "max_words": 60},
    "workload.collate_fn": "tunekit.workloads.text:pad_collate",
    "workload.count": "tunekit.workloads.text:count_tokens",
    "workload.unit": "tokens",
    "workload.loss": None,
    "workload.optimizer": "torch.optim:AdamW",
}


def test_dict_batches_with_a_padding_collate_are_measured_in_tokens(tmp_path: Path):
    m = _trial(tmp_path, "text", {"num_workers": 2, "batch_size": 8}, **TEXT)
    assert m.status == "ok", m
    assert m.unit == "tokens"
    # 5-60 words a document, under 64 tokens after truncation: the mean tokens per batch of 8 lies in between
    assert 8 * 5 <= m.items_per_batch_mean <= 8 * 64
    # counted apart from the trial: the same documents, padded and counted as the config says, 100 batches of 8
    # drawn at random (about 290 tokens a batch, 58 apart), so the trial's batches average within ~15 % of it
    from tunekit.workloads.text import count_tokens, pad_collate, synthetic_documents

    docs = synthetic_documents(**TEXT["workload.dataset_args"])
    rng = random.Random(0)
    picks = [rng.randrange(len(docs)) for _ in range(8 * 100)]
    expected = statistics.mean(
        count_tokens(pad_collate([docs[i] for i in picks[k : k + 8]])) for k in range(0, len(picks), 8)
    )
    assert m.items_per_batch_mean == pytest.approx(expected, rel=0.15)
    # tokens/s, not samples/s: the steps' rate times the tokens a batch holds (8 samples would be ~36x fewer)
    assert m.rate == pytest.approx(expected * m.measured_steps / m.measured_s, rel=0.25)


def test_a_users_loader_factory_is_used_and_must_honour_the_knobs(tmp_path: Path):
    good = _trial(
        tmp_path,
        "good",
        {"num_workers": 2, "batch_size": 8},
        **{"workload.loader": "tests._workloads:own_loader", "trial.window_s": 0.5},
    )
    assert good.status == "ok", good
    assert good.host_processes >= 3  # its two workers ran
    bad = _trial(
        tmp_path,
        "bad",
        {"num_workers": 2, "batch_size": 8},
        **{"workload.loader": "tests._workloads:loader_ignoring_workers"},
    )
    assert bad.status == "crashed"
    assert "num_workers=0, not the trial's 2" in bad.reason and "\n" not in bad.reason


def test_a_step_that_owns_the_update(tmp_path: Path):
    owns = {
        "workload.step": "tests._workloads:clipping_step",
        "workload.model_args": {"step_wait_s": 0.0},
        "trial.window_s": 0.5,
    }
    m = _trial(tmp_path, "owns", {"batch_size": 8, "grad_accum": 2}, **owns, **{"workload.step_updates": True})
    assert m.status == "ok", m
    # the step returns a detached loss: had tunekit run backward on it too, the trial would have failed
    wrong = _trial(tmp_path, "wrong", {"batch_size": 8}, **owns)
    assert wrong.status == "crashed" and "does not require grad" in wrong.reason


def test_mapping_and_dataclass_batches_reach_the_device_with_their_type():
    import collections
    import dataclasses

    import torch

    from tunekit.worker.factory._build import StepContext, to_device

    class Encoding(collections.UserDict):  # a BatchEncoding-like mapping
        pass

    @dataclasses.dataclass
    class Pair:
        inputs: torch.Tensor
        label: torch.Tensor

    ctx = StepContext(device=torch.device("meta"), loss_fn=None, precision="fp32", channels_last=False)
    moved = to_device(Encoding(input_ids=torch.ones(2, 3)), ctx, non_blocking=False)
    assert type(moved) is Encoding and moved["input_ids"].device.type == "meta"
    pair = to_device(Pair(torch.ones(2), torch.zeros(2)), ctx, non_blocking=False)
    assert type(pair) is Pair and pair.inputs.device.type == pair.label.device.type == "meta"


@pytest.mark.parametrize("step,shown", [("nan_step", "nan"), ("inf_step", "inf")])
def test_a_nan_or_inf_loss_is_diverged_and_never_the_knee(tmp_path: Path, step: str, shown: str):
    """A non-finite loss, seen at a window edge: the trial is diverged with the micro-batch it was seen at, and no
    rate. Recorded among completed end-to-end trials, it is neither the knee nor the best."""
    from tests.conftest import measurement
    from tunekit.analysis import select_knee
    from tunekit.config import Selection
    from tunekit.records import TrialRow, rows_from_measurements

    cfg = sleepy_config(**{"workload.step": f"tests._workloads:{step}", "trial.window_s": 0.3})
    spec = TrialSpec(
        number=0, stage="single", mode="train", knobs=Knobs(batch_size=8), config=config.from_dict(cfg).to_dict()
    )
    m = run_trial(spec, tmp_path / "t", 60)
    assert m.status == "diverged", m
    assert f"the loss is {shown} at micro-batch " in m.reason
    assert m.rate is None and m.rate_windows is None
    saved = json.loads((tmp_path / "t" / "measurement.json").read_text())
    assert saved["status"] == "diverged" and saved["reason"] == m.reason
    # the diverged trial as the sweep records it, beside two completed ones (0 workers at 80/s, 2 at 200/s)
    diverged = TrialRow.from_measurement(
        dataclasses.replace(m, number=12, stage="end_to_end", params={**m.params, "num_workers": 8})
    )
    rows = [
        *rows_from_measurements(
            [measurement(10, "end_to_end", "train", 80.0), measurement(11, "end_to_end", "train", 200.0, num_workers=2)]
        ),
        diverged,
    ]
    choice = select_knee(rows, Selection(tolerance=0.03, min_headroom=0.10))
    assert choice.knee is not None and choice.knee.number == 11 and choice.best.number == 11


def test_compute_and_loader_modes(tmp_path: Path):
    cfg = sleepy_config(
        **{
            "workload.model_args": {"step_wait_s": 0.02},
            "workload.dataset_args": {"sample_wait_s": 0.01},
            "trial.window_s": 0.5,
        }
    )
    compute = run_trial(_spec(cfg, mode="compute", num_workers=2, batch_size=8), tmp_path / "c", 60)
    loader = run_trial(_spec(cfg, mode="loader", num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "l", 60)
    assert compute.status == loader.status == "ok"
    # compute: the model alone on a staged batch, 8 samples / 20 ms; loader: 2 workers / 10 ms per sample
    assert 0.6 * 400 <= compute.rate <= 400 * 1.03
    assert compute.data_wait_frac < 0.01 and compute.host_processes == 1
    assert 0.6 * 200 <= loader.rate <= 200 * 1.03
    assert all(steps % 2 == 0 for steps in loader.steps_windows)  # windows end on whole rounds of 2 workers


def test_a_dataset_moving_its_batches_ahead_is_moved_beside_the_step(tmp_path: Path):
    """A dataset with batch_to_device_ahead (decode: gpu-overlap on a GPU) has each batch moved in the trial's ahead
    thread, before the step takes it; the trial counts the loader's items and records input on the device."""
    cfg = sleepy_config(
        **{
            "workload.dataset": "tests._workloads:moved_ahead_dataset",
            "workload.dataset_args": {},
            "workload.step": "tests._workloads:moved_ahead_step",
            "trial.window_s": 0.3,
        }
    )
    m = run_trial(_spec(cfg, number=0, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "t", 60)
    assert m.status == "ok", m
    assert m.input_on_device is True and m.measured_items == 8 * m.measured_steps


def test_the_ahead_thread_keeps_order_and_hands_on_its_failure():
    """AheadStream moves batches in order in a thread of its own, passes an exception on to the step that fetches next,
    and close() ends the thread."""
    import threading

    from tunekit.worker.factory._ahead import AheadStream

    class Ctx:
        device = torch.device("cpu")

    source = iter([torch.tensor([1]), torch.tensor([2]), torch.tensor([3])])

    def batches():
        item = next(source, None)
        if item is None:
            raise ValueError("the loader failed")
        return item

    threads = set()

    def move(batch, ctx, non_blocking):
        threads.add(threading.current_thread().name)
        return batch * 10

    ahead = AheadStream(batches, move, Ctx(), non_blocking=False)
    assert [next(ahead).item() for _ in range(3)] == [10, 20, 30]
    with pytest.raises(ValueError, match="the loader failed"):
        next(ahead)
    ahead.close()
    assert not ahead.thread.is_alive() and threads == {"tunekit-ahead"}


def test_the_step_waiting_on_the_ahead_move_is_not_data_wait():
    """While the ahead thread moves (decodes) a batch, a step that waits for it waits on the device-side work, not
    on the loader: AheadStream counts that apart (device_wait_s), and a wait while the thread waits on the loader stays
    data wait."""
    from tunekit.worker.factory._ahead import AheadStream

    class Ctx:
        device = torch.device("cpu")

    def slow_move(batch, ctx, non_blocking):
        time.sleep(0.1)
        return batch

    ahead = AheadStream(lambda: torch.zeros(1), slow_move, Ctx(), non_blocking=False)
    for _ in range(3):
        next(ahead)
    ahead.close()
    assert ahead.device_wait_s > 0.1  # the first fetch alone waited a whole move

    def slow_loader():
        time.sleep(0.1)
        return torch.zeros(1)

    ahead = AheadStream(slow_loader, lambda b, c, non_blocking: b, Ctx(), non_blocking=False)
    for _ in range(3):
        next(ahead)
    ahead.close()
    assert ahead.device_wait_s < 0.15  # of about 0.3 s waited, on the loader


def test_worker_threads_are_set_in_every_loader_worker(tmp_path: Path):
    """The worker_threads knob reaches each loader worker before the workload's own worker_init_fn; without it the
    workers keep PyTorch's one thread (the dataset fails a trial whose workers run another count)."""
    cfg = sleepy_config(**{"workload.dataset": "tests._workloads:threads_seen_dataset", "trial.window_s": 0.3})
    for number, (threads, expect) in enumerate([(2, 2), (None, 1)]):
        cfg["workload"]["dataset_args"] = {"expect": expect}
        m = run_trial(
            _spec(cfg, number=number, num_workers=2, prefetch_factor=2, batch_size=8, worker_threads=threads),
            tmp_path / str(number),
            60,
        )
        assert m.status == "ok", m
        assert m.params["worker_threads"] == threads


def test_a_step_that_returns_no_tensor_is_named(tmp_path: Path):
    module = tmp_path / "badstep.py"
    module.write_text("def step(model, batch, ctx):\n    model(batch[0])\n    return None\n")
    cfg = sleepy_config(**{"workload.step": f"{module}:step", "trial.window_s": 0.3})
    m = run_trial(_batch8_spec(cfg), tmp_path / "t", 60)
    assert m.status == "crashed" and "workload.step returned NoneType, not the loss" in m.reason, m.reason
