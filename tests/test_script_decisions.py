"""Script mode's decisions, swept for real: a knee twice the script's own settings claims a gain whose interval
holds the analytic 2x, the script's own settings at the knee are kept, and run-to-run noise made on purpose widens
the band and the intervals (the repeats measure it). Apart from test_script_sweeps.py so the two run side by side."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_script import QUICK

# the known-answer loop again, for decisions: 5 ms per sample in each worker, 5 ms per step (--step-ms), batch 8:
# 1 worker gives 200 samples/s and 2 give 400 (the workers are the bound: the step alone could take 1,600); with
# --step-ms 20 the step is the bound from 4 workers on, at 400; --noisy makes every other pair of processes 25 %
# slower, run-to-run noise on purpose
DECIDING_SCRIPT = """
import argparse, os, torch
from torch.utils.data import DataLoader
from tunekit.workloads.synthetic import sleepy_dataset, sleepy_model

parser = argparse.ArgumentParser()
parser.add_argument("-j", type=int, default=None)
parser.add_argument("--own-j", type=int, default=1)  # -j's default, the script's own workers
parser.add_argument("-b", type=int, default=8)
parser.add_argument("--step-ms", type=float, default=5.0)
parser.add_argument("--noisy", action="store_true")
args = parser.parse_args()
slow = 1.0
if args.noisy:
    starts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "starts")
    os.makedirs(starts, exist_ok=True)
    n = len(os.listdir(starts))
    open(os.path.join(starts, str(n)), "w").close()
    slow = 1.25 if (n // 2) % 2 else 1.0
model = sleepy_model(step_wait_s=args.step_ms / 1000 * slow)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
workers = args.own_j if args.j is None else args.j
train = DataLoader(sleepy_dataset(sample_wait_s=0.005 * slow), batch_size=args.b, num_workers=workers, shuffle=True)
for epoch in range(1000):
    for x, y in train:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _decided(tmp_path: Path, *flags: str, workers: int = 2) -> tuple[Any, dict[str, Any]]:
    """A grid sweep of DECIDING_SCRIPT at ``workers`` beside the script's own settings, each run twice in
    alternation (selection.repeats 1): the run and its recommended.yaml."""
    import tunekit

    script = tmp_path / "train.py"
    script.write_text(DECIDING_SCRIPT)
    raw = {
        "name": "decide",
        "device": "cpu",
        "strategy": "grid",
        "script": {
            "command": [sys.executable, str(script), "-j", "{num_workers}", *flags],
            "cwd": str(tmp_path.parent),
        },  # the worker's other script tests' folder: one fork server
        "search": {"num_workers": [workers], "batch_size": [8], "pin_memory": [False]},
        "trial": {**QUICK, "measure_windows": 3},
        "selection": {"repeats": 1},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    run = tunekit.sweep(path, out=tmp_path / "run")
    measured = [json.loads(p.read_text()) for p in (tmp_path / "run" / "trials").glob("*/measurement.json")]
    # the script's own settings and the config, then both again, in that order
    assert [(m["stage"], m["run"]) for m in sorted(measured, key=lambda m: m["number"])] == [
        ("baseline", 0),
        ("grid", 0),
        ("baseline", 1),
        ("grid", 1),
    ], measured
    return run, yaml.safe_load((tmp_path / "run" / "recommended.yaml").read_text())


def test_a_knee_twice_the_scripts_own_settings_claims_a_gain_whose_interval_holds_2x(tmp_path: Path):
    """Its own 1 worker gives 200 samples/s, 2 workers 400: the gain over its own settings, from two runs of each
    in alternation, is printed with an interval that holds the analytic 2x."""
    run, rec = _decided(tmp_path)
    ev = rec["evidence"]
    assert not ev["keep_own_settings"] and rec["dataloader"]["num_workers"] == 2, ev["reason"]
    low, high = ev["speedup_vs_script_interval"]
    assert low <= 2.0 <= high, (low, high, ev["speedup_vs_script"])
    assert len(ev["runs"]) == 2 and ev["run_spread"] is not None
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Measured again in alternation on this machine" in report and "at 95 %" in report


def test_the_scripts_own_settings_at_the_knee_are_kept(tmp_path: Path):
    """Its own 4 workers already reach the 20-ms step's 400 samples/s; 8 workers cannot beat them beyond the two rates'
    intervals: keep your settings, no gain claimed."""
    run, rec = _decided(tmp_path, "--own-j", "4", "--step-ms", "20", workers=8)
    ev = rec["evidence"]
    assert ev["keep_own_settings"], ev["reason"]
    assert rec["dataloader"]["num_workers"] == 4 and rec["script"]["set_on_dataloader"] == {}
    assert ev["reason"].startswith("Keep your settings")


def test_a_job_noisy_on_purpose_widens_the_band_and_its_intervals(tmp_path: Path):
    """Every other pair of runs 25 % slower: the repeats measure that spread (about 16 %, against the 1-3 % of the
    windows inside one run), the band is at least that wide and the run is said to be disturbed, and the knee's
    interval is the runs', wider than its windows'."""
    from tunekit import rules
    from tunekit.analysis import pooled

    run, rec = _decided(tmp_path, "--noisy")
    ev = rec["evidence"]
    assert ev["run_spread"] > 0.08, ev
    assert ev["band"] >= ev["run_spread"]
    assert ev["disturbed"] and "noise band" in ev["disturbed"][0]
    rows = pooled(run.summary.rows)
    knee = next(r for r in rows if r.number == ev["run"]["knee_trial"])
    windows = json.loads((tmp_path / "run" / "trials" / str(knee.number) / "measurement.json").read_text())
    assert ev["runs_interval"] > windows["rate_interval"] and ev["runs_interval"] == pytest.approx(
        rules.runs_interval(2, rules.run_spread(rows), 2), rel=1e-3
    )
