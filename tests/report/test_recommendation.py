"""recommended.yaml of a script sweep (tunekit/report/_recommendation.py): the image example swept unedited, the
command that applies the result and what is set on the script's loader."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO
from tests.worker.script.test_session import QUICK, _no_process_runs


def _example_sweep(
    tmp_path: Path,
    folder: str,
    command: list[str],
    workers: list[int],
    trial: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[Any, Path]:
    """A grid sweep of an example script, run unedited, through the Python API (``tunekit sweep`` of the same
    config: test_sweep_script_without_a_config_keeps_the_scripts_own_batch runs the command line)."""
    import tunekit

    raw = {
        "name": folder,
        "device": "cpu",
        "strategy": "grid",
        "script": {"command": command, "cwd": str(REPO / "examples" / folder), **extra},
        "search": {"num_workers": workers, "batch_size": [8], "pin_memory": [False]},
        "trial": {**QUICK, **(trial or {})},
        "selection": {"repeats": 0},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    return tunekit.sweep(path, out=out), out


def test_the_image_example_is_swept_unedited(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    run, out = _example_sweep(
        tmp_path,
        "image_classifier",
        [
            sys.executable,
            "train.py",
            "--data",
            str(tmp_path / "data"),
            "--make-data",
            "64",
            "--crop",
            "32",
            "--out",
            str(ckpt),
            "--arch",
            "squeezenet1_1",
            "-j",
            "{num_workers}",
            "-b",
            "{batch_size}",
        ],
        [1],
        trial_args=["--epochs", "1000"],
    )
    assert run.recommendation is not None, run.reason
    measured = {m["stage"]: m for m in (json.loads(p.read_text()) for p in (out / "trials").glob("*/measurement.json"))}
    assert len(list((out / "trials").glob("*/measurement.json"))) == 2  # the script's own settings, 1 config
    assert all(m["status"] == "ok" for m in measured.values()), {k: m.get("reason") for k, m in measured.items()}
    assert {m["loader_measured"]["dataset"] for m in measured.values()} == {"ImageFolder"}
    own = measured["baseline"]["loader_measured"]
    assert (own["num_workers"], own["batch_size"]) == (2, 64)  # train.py's own -j and -b defaults
    rec = yaml.safe_load((out / "recommended.yaml").read_text())
    workers = rec["dataloader"]["num_workers"]
    if rec["evidence"]["keep_own_settings"]:  # batch 8 on 1 worker did not beat its own 2 workers, batch 64
        assert (workers, rec["dataloader"]["batch_size"]) == (2, 64)
        assert rec["script"]["command"][-2:] == ["--arch", "squeezenet1_1"]  # its own -j and -b: no flag needed
        assert rec["script"]["set_on_dataloader"] == {}  # the loader stays as the script builds it
    else:
        assert workers == 1 and rec["script"]["command"][-4:] == ["-j", "1", "-b", "8"]
        # what the knee's trial ran with: pinning set on the loader, and its workers kept across epochs
        assert "persistent_workers" in rec["script"]["set_on_dataloader"]
    assert "--epochs" not in rec["script"]["command"]  # script.trial_args: the trials' alone
    report = (out / "report.md").read_text()
    assert "The script's own settings (2 workers, batch 64" in report and "Apply it: run `" in report
    # what has no flag is set where the script builds its training loader: that line, relative to its folder
    source = (REPO / "examples" / "image_classifier" / "train.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.lstrip().startswith("loader = DataLoader("))
    assert rec["script"]["dataloader_built_at"] == f"train.py:{line}", rec["script"]
    kept = rec["evidence"]["keep_own_settings"]
    assert (f"(the script builds it at train.py:{line})" in report) == (not kept)  # nothing to set when kept
    # an epoch that ended inside a trial ran the script's own checkpoint (its work between epochs is measured);
    # none beyond: the trial ended the script at its last window, its remaining epochs never ran
    written = sorted(int(p.stem.removeprefix("epoch")) for p in ckpt.glob("epoch*.pt"))
    assert len(written) <= max(m["epochs_ended"] for m in measured.values()) < 1000
    assert _no_process_runs(str(ckpt))
