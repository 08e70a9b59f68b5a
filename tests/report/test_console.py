"""The sweep's console (tunekit/report/_console.py): a trial's reason is printed as text, whatever brackets it holds."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import tunekit
from tests.conftest import sleepy_config


def test_a_failure_message_in_brackets_is_printed_as_text_and_the_sweep_goes_on(
    write_config, tmp_path: Path, capsys: pytest.CaptureFixture
):
    cfg = write_config(
        sleepy_config(
            **{
                "workload.dataset": "tests._workloads:bracketed_failure_dataset",
                "workload.dataset_args": {},
                "search.num_workers": [0, 1, 2],
                "search.batch_size": [4],
                "trial.window_s": 0.3,
                "strategy": "grid",
            }
        )
    )
    out = tmp_path / "run"
    done = tunekit.sweep(cfg, out=out, quiet=False)  # the console `tunekit sweep` prints to, in this process
    said = capsys.readouterr().err
    assert done.recommendation is not None, said
    for name in ("report.md", "trials.csv", "sweep.json", "recommended.yaml"):
        assert (out / name).exists(), name
    assert "MarkupError" not in said
    # the reason as the worker raised it, brackets and all, and the log line's [stage/mode] prefix
    assert "[/data/img1.jpg]" in said and "[/__w/pytorch/" in said and "[bold]" in said
    assert "[grid/train]" in said
    assert "[/data/img1.jpg]" in (out / "report.md").read_text()
    # a one-worker loader crashes on every sample, the main process and two workers load fine: the sweep went on
    # past the crash to the next trial
    trials = pd.read_csv(out / "trials.csv").sort_values("number")
    assert list(zip(trials["num_workers"], trials["status"], strict=True)) == [(0, "ok"), (1, "crashed"), (2, "ok")]
    assert "[/data/img1.jpg]" in trials.iloc[1]["reason"]
