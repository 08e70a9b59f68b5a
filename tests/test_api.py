"""The Python API and the CLI are one path: the same checks, the same meaning of --set, from any thread."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

import tunekit
from tests.conftest import REPO, sleepy_config
from tunekit import _api, config
from tunekit.errors import UsageError
from tunekit.workloads.synthetic import sleepy_dataset


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunekit", *args], capture_output=True, text=True, timeout=300)


BAD_KNOBS = [
    ("num_workers", 999, "999"),
    ("num_workers", -5, "-5"),
    ("pin_memory", "false", "'false'"),
    ("grad_accum", 0, "0"),
    ("grad_accum", 2.7, "2.7"),
    ("compile", "fast", "fast"),
    ("prefetch_factor", -1, "-1"),
    ("batch_size", "many", "many"),
]


@pytest.mark.parametrize(("key", "value", "text"), BAD_KNOBS)
def test_a_bad_knob_is_refused_alike_by_the_api_and_by_set(write_config, tmp_path: Path, key, value, text):
    cfg = write_config(sleepy_config())
    with pytest.raises(UsageError) as api:
        tunekit.trial(str(cfg), knobs={key: value}, out=tmp_path / "api")
    for command in ("trial", "sweep"):
        cli = _cli(command, str(cfg), "--set", f"{key}={text}", "--out", str(tmp_path / command))
        assert cli.returncode == 2, cli.stderr
        (line,) = cli.stderr.strip().splitlines()
        # the same rule and the same words after where it came from
        assert line.split(f"{key}=", 1)[1].split(":", 1)[1] == str(api.value).split(f"{key}=", 1)[1].split(":", 1)[1]
    assert not (tmp_path / "api").exists() and not (tmp_path / "trial").exists()  # nothing started


def test_an_unknown_knob_names_the_allowed_ones(write_config, tmp_path: Path):
    with pytest.raises(UsageError, match="allowed: num_workers, prefetch_factor"):
        tunekit.trial(str(write_config(sleepy_config())), knobs={"workers": 2}, out=tmp_path / "t")


def test_a_zero_budget_is_refused_by_both(write_config, tmp_path: Path):
    cfg = write_config(sleepy_config())
    with pytest.raises(UsageError, match="must be more than 0"):
        tunekit.sweep(str(cfg), budget_min=0, out=tmp_path / "api")
    cli = _cli("sweep", str(cfg), "--budget-min", "0", "--out", str(tmp_path / "cli"))
    assert cli.returncode == 2 and "must be more than 0" in cli.stderr
    assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()


def test_set_of_a_knob_holds_it_for_a_whole_sweep(write_config, tmp_path: Path):
    """--set num_workers=1 runs that value in a trial and holds it in a sweep: every trial of the sweep has it."""
    cfg = write_config(
        sleepy_config(
            **{"search.num_workers": [0, 1, 2], "search.batch_size": [4, 8], "strategy": "grid", "trial.window_s": 0.3}
        )
    )
    run = _cli("sweep", str(cfg), "--set", "num_workers=1", "--out", str(tmp_path / "run"), "--quiet")
    assert run.returncode == 0, run.stderr
    resolved = yaml.safe_load((tmp_path / "run" / "config.resolved.yaml").read_text())
    assert resolved["search"]["num_workers"] == [1]
    import pandas as pd

    assert set(pd.read_csv(tmp_path / "run" / "trials.csv")["num_workers"]) == {1}


def test_the_api_runs_from_a_thread_that_is_not_the_main_one(tmp_path: Path):
    cfg = sleepy_config(**{"trial.window_s": 0.3})
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["trial"] = tunekit.trial(cfg, knobs={"num_workers": 0, "batch_size": 8}, out=tmp_path / "t")
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            out["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout=120)
    assert "error" not in out, out.get("error")
    assert out["trial"].ok and out["trial"].measurement.rate > 0


def test_the_readme_lists_the_knobs_as_the_code_defines_them():
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- knobs -->\n(.*?)<!-- /knobs -->", text, re.S)
    assert block, "README.md must hold the knob list between <!-- knobs --> markers"
    assert _api.knobs_markdown() in block.group(1)
    assert list(config.KNOB_HELP) == [k for k in re.findall(r"^- `(\w+)`", block.group(1), re.M)]
    for function in (tunekit.sweep, tunekit.trial):
        assert all(f"{key}: {help}" in function.__doc__ for key, help in config.KNOB_HELP.items())


def tiny_dataset(num_samples: int = 10_000):
    """A factory defined in this test module, handed to the Python API as a callable."""
    return sleepy_dataset(num_samples=num_samples, sample_wait_s=0.002)


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
    assert resolved["workload"]["dataset"] == "tests.test_api:tiny_dataset"
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


def test_a_script_trial_without_knobs_runs_its_own_settings(tmp_path: Path):
    """``tunekit trial --script CMD`` without ``--set``: the script's own settings (its -b 8, its -j 0), not the
    search's first values (batch 32), and the trial says so (stage baseline)."""
    import tunekit
    from tests.launch.test_ending import _raw

    raw = _raw(tmp_path, "none")
    raw["search"]["batch_size"] = [32]
    outcome = tunekit.trial(raw, out=tmp_path / "one")
    m = outcome.measurement
    assert m.status == "ok", m.reason
    assert m.stage == "baseline" and m.params["batch_size"] == 8 and m.params["num_workers"] == 0, m.params
    assert m.asked is None
