"""Your own job as you run it: loader hooks, iterable data, units other than samples, a step that owns the update,
and the Python API with a factory defined right here."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import tunekit
from tests.conftest import REPO, sleepy_config
from tunekit.workloads.synthetic import sleepy_dataset

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


def tiny_dataset(num_samples: int = 10_000):
    """A factory defined in this test module, handed to the Python API as a callable."""
    return sleepy_dataset(num_samples=num_samples, sample_wait_s=0.002)


def _trial(tmp_path: Path, name: str, knobs: dict | None = None, **overrides) -> dict:
    cfg = sleepy_config(**overrides)
    return tunekit.trial(cfg, knobs=knobs, out=tmp_path / name).measurement


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


def test_an_iterable_dataset_runs_and_unsharded_workers_are_flagged(tmp_path: Path):
    iterable = {"workload.dataset_args": {}, "workload.model_args": {"step_wait_s": 0.002}, "trial.window_s": 0.5}
    sharded = _trial(
        tmp_path,
        "sharded",
        {"num_workers": 2, "batch_size": 8},
        **{"workload.dataset": "tests._workloads:sharded_stream", **iterable},
    )
    assert sharded.status == "ok", sharded
    # (a loaded box adds its own warnings: other processes' CPU use)
    assert not [w for w in sharded.warnings if "identical" in w], sharded.warnings
    assert sharded.dataset_len is None and not sharded.epoch_boundary_in_trial
    unsharded = _trial(
        tmp_path,
        "unsharded",
        {"num_workers": 2, "batch_size": 8},
        **{"workload.dataset": "tests._workloads:unsharded_stream", **iterable},
    )
    assert unsharded.status == "ok", unsharded
    (warning,) = [w for w in unsharded.warnings if "get_worker_info" in w]
    assert "workers 0, 1" in warning and "identical" in warning and "get_worker_info" in warning


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


def test_the_python_api_with_a_factory_defined_in_this_module(tmp_path: Path):
    cfg = sleepy_config(
        **{
            "workload.dataset": tiny_dataset,
            "workload.dataset_args": {},
            "search.num_workers": [0, 2],
            "strategy": "grid",
            "trial.window_s": 0.3,
        }
    )
    outcome = tunekit.sweep(cfg, out=tmp_path / "run", overrides={"trial.measure_windows": 2})
    assert outcome.recommendation is not None and outcome.recommendation.num_workers in (0, 2)
    assert len(outcome.trials) == 2 and set(outcome.trials["status"]) == {"ok"}
    resolved = yaml.safe_load((tmp_path / "run" / "config.resolved.yaml").read_text())
    assert resolved["workload"]["dataset"] == "tests.test_own_job:tiny_dataset"
    assert resolved["trial"]["measure_windows"] == 2


def test_a_factory_defined_in_the_users_script(tmp_path: Path):
    """A training script that defines its dataset and calls tunekit.trial: the trial process loads the script by
    path, without running its main block again."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        import tunekit
        from tunekit.workloads.synthetic import sleepy_dataset, sleepy_model

        def my_dataset():
            return sleepy_dataset(sample_wait_s=0.001)

        if __name__ == "__main__":
            print("main block ran", file=sys.stderr)
            cfg = {{"name": "script", "device": "cpu",
                    "workload": {{"model": sleepy_model, "model_args": {{"step_wait_s": 0.005}},
                                  "dataset": my_dataset}},
                    "search": {{"batch_size": [8]}},
                    "trial": {{"warmup_steps": 2, "measure_windows": 2, "window_s": 0.3}}}}
            result = tunekit.trial(cfg, out={str(tmp_path / "out")!r})
            print(result.measurement.status, result.measurement.rate > 0)
        """)
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "True"]
    assert run.stderr.count("main block ran") == 1  # not again in the trial process
    resolved = yaml.safe_load((tmp_path / "out" / "config.resolved.yaml").read_text())
    assert resolved["workload"]["dataset"] == f"{script}:my_dataset"


def test_sweep_takes_set_overrides(write_config, tmp_path: Path):
    cfg = write_config(sleepy_config(**{"trial.window_s": 0.3}))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunekit",
            "sweep",
            str(cfg),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--set",
            "search.num_workers=[0]",
            "--set",
            "workers=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "--set workers: unknown knob" in run.stderr and run.returncode == 2  # neither a knob nor a config key
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunekit",
            "sweep",
            str(cfg),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--set",
            "search.num_workers=[0, 2]",
            "--strategy",
            "grid",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    resolved = yaml.safe_load((tmp_path / "run" / "config.resolved.yaml").read_text())
    assert resolved["search"]["num_workers"] == [0, 2]


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
