"""The script's training loader as a trial reads it (tunekit/worker/script/_loader.py): the batch a trainer's
loader yields, a stream without a length, items counted by the script's own hook."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.report.test_recommendation import _example_sweep
from tests.worker.script.test_session import _script_config, _trial


def test_a_trainer_built_loader_is_measured_at_the_batch_it_yields(tmp_path: Path):
    """Hugging Face Trainer builds its loader over a batch sampler (accelerate's DataLoaderShard): a batch knob set
    on it does not take. The trial measures and records the batch the loop received (16), says what it asked (32),
    and counts 16 items a batch (it reported 32, every rate twice the truth)."""
    pytest.importorskip("transformers")
    script = REPO / "tests" / "_hf_train.py"
    raw = _script_config(
        tmp_path, [sys.executable, str(script), "--workers", "{num_workers}", "--out", str(tmp_path / "hf")]
    )
    m = _trial(tmp_path, raw, num_workers=0, batch_size=32)
    assert m.status == "ok", m.reason
    assert m.params["batch_size"] == 16 and m.loader_measured["batch_size"] == 16, m.loader_measured
    assert m.asked == {"batch_size": 32}
    assert m.items_per_batch_mean == 16
    # accelerate built the loader, called from the script's Trainer(...).train() line
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if ".train()" in text)
    assert m.loader_measured["built_by"] == "accelerate", m.loader_measured
    assert m.loader_measured["built_at"] == f"{script}:{line}", m.loader_measured


def test_an_iterable_dataset_without_a_length_is_measured(tmp_path: Path):
    """A streamed dataset has no len(): the trial is measured (it crashed after its windows, asking the loader's
    length)."""
    from tests.launch.test_ending import _faulty_trial as faulty_trial

    m = faulty_trial(tmp_path, "stream", workers=0)
    assert m.status == "ok", m.reason
    assert m.dataset_len is None and m.loader_measured["length"] is None


def test_a_lightning_trainer_loop_is_measured_at_the_batch_it_yields(tmp_path: Path):
    """A Lightning Trainer script: the fit loop iterates the module's loader through its CombinedLoader, with a
    validation loop between epochs. The script has no batch flag; its loader is a plain DataLoader(batch_size=16),
    so the batch knob is set on it: the trial records and counts the 32 the loop received, and its rate stays under
    the bound of 32 samples of 1 ms each plus a 10 ms step."""
    pytest.importorskip("lightning")
    script = REPO / "tests" / "_lightning_train.py"
    raw = _script_config(tmp_path, [sys.executable, str(script), "--workers", "{num_workers}"])
    m = _trial(tmp_path, raw, num_workers=0, batch_size=32)
    assert m.status == "ok", m.reason
    assert m.params["batch_size"] == 32 and m.loader_measured["batch_size"] == 32, m.loader_measured
    assert m.asked is None
    assert m.items_per_batch_mean == 32
    assert m.rate < 32 / (32 * 0.001 + 0.01), m.rate
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "DataLoader(Rows(1024)" in text)
    assert m.loader_measured["built_at"] == f"{script}:{line}" and "built_by" not in m.loader_measured


def test_the_text_example_is_swept_in_tokens(tmp_path: Path):
    run, out = _example_sweep(
        tmp_path,
        "text_lm",
        [
            sys.executable,
            "train.py",
            "--steps",
            "100000",
            "--dim",
            "32",
            "--max-len",
            "64",
            "-j",
            "{num_workers}",
            "-b",
            "{batch_size}",
        ],
        [1],
        count="data:count_tokens",
        unit="tokens",
        # epochs of 1,250 batches (20,000 documents at its own -b 16): the script's own settings would wait up to a
        # third of the timeout to see two of their ends; they are not what this test is about
        trial={"timeout_s": 45},
    )
    assert run.recommendation is not None, run.reason
    measured = [json.loads(p.read_text()) for p in (out / "trials").glob("*/measurement.json")]
    assert all(m["status"] == "ok" and m["unit"] == "tokens" for m in measured), measured
    # documents of 16 to 64 tokens: a batch of b holds 16 b to 64 b real ones (the script's own baseline runs its
    # own -b 16, the other the searched 8)
    assert all(
        16 * m["params"]["batch_size"] <= m["items_per_batch_mean"] <= 64 * m["params"]["batch_size"] for m in measured
    ), [(m["params"]["batch_size"], m["items_per_batch_mean"]) for m in measured]
    assert sorted(m["params"]["batch_size"] for m in measured) == [8, 16]
    assert "tokens/s" in (out / "report.md").read_text()
    assert not (REPO / "examples" / "text_lm" / "lm.pt").exists()
