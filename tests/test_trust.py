"""Inputs checked with the key's name, and messages that name the cause (the trust issue's reproductions)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import tunekit
from tests.conftest import sleepy_config
from tunekit import config
from tunekit.contract import Knobs, Mode, Stage, TrialSpec
from tunekit.errors import ConfigError
from tunekit.launch import classify_error, run_trial
from tunekit.recommended import recommendation_dict

GOOD = recommendation_dict(
    {"num_workers": 4, "prefetch_factor": 2, "pin_memory": True, "batch_size": 64, "grad_accum": 1, "compile": "none"},
    {"unit": "samples", "rate": 100.0},
)


@pytest.mark.parametrize(
    ("section", "key", "value", "said"),
    [
        ("dataloader", "pin_memory", "false", 'pin_memory="false": expected true or false'),
        ("training", "grad_accum", 0, "grad_accum=0: must be at least 1"),
        ("training", "grad_accum", 2.7, "grad_accum=2.7: expected an integer"),
        ("training", "compile", "fast", 'compile="fast": choose one of: none, default'),
        ("dataloader", "prefetch_factor", -1, "prefetch_factor=-1: must be at least 1"),
        ("dataloader", "prefetch_factor", "four", 'prefetch_factor="four": expected an integer'),
        ("training", "non_blocking", "yes", "training.non_blocking = 'yes': expected true or false"),
        (None, "version", 3, "version: 3 is not one this tunekit reads"),
    ],
)
def test_load_recommended_checks_what_it_reads_as_strictly_as_a_config(tmp_path: Path, section, key, value, said):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    (data[section] if section else data)[key] = value
    path = tmp_path / "recommended.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        tunekit.load_recommended(path)
    (line,) = err.value.lines()
    assert str(path) in line and said in line


def test_a_recommendation_with_more_workers_than_this_machine_allows_still_loads(tmp_path: Path):
    """Tuned on a large machine, loaded on a laptop: the worker bound is the sweep's, not the reader's."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["dataloader"]["num_workers"] = config.max_workers() + 1
    path = tmp_path / "recommended.yaml"
    path.write_text(yaml.safe_dump(data))
    assert tunekit.load_recommended(path).num_workers == config.max_workers() + 1


def _spec(cfg: dict, **knobs) -> TrialSpec:
    return TrialSpec(
        number=0,
        stage=Stage.single,
        mode=Mode.train,
        knobs=Knobs(batch_size=8, **knobs),
        config=config.from_dict(cfg).to_dict(),
    )


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        ("0", "returned 0 for a batch"),
        ("-3", "returned -3"),
        ("float('nan')", "returned nan"),
        ("'many'", "returned str 'many'"),
    ],
)
def test_a_count_hook_that_returns_no_positive_number_is_named(tmp_path: Path, write_config, returned, said):
    module = tmp_path / "badcount.py"
    module.write_text(f"def count(batch):\n    return {returned}\n")
    cfg = sleepy_config(**{"workload.count": f"{module}:count", "trial.window_s": 0.3})
    m = run_trial(_spec(cfg), tmp_path / "t", 60)
    assert m.status == "crashed" and "workload.count" in m.reason and said in m.reason, m.reason
    assert "ZeroDivisionError" not in m.reason


def test_a_step_that_returns_no_tensor_is_named(tmp_path: Path):
    module = tmp_path / "badstep.py"
    module.write_text("def step(model, batch, ctx):\n    model(batch[0])\n    return None\n")
    cfg = sleepy_config(**{"workload.step": f"{module}:step", "trial.window_s": 0.3})
    m = run_trial(_spec(cfg), tmp_path / "t", 60)
    assert m.status == "crashed" and "workload.step returned NoneType, not the loss" in m.reason, m.reason


def test_a_loader_worker_killed_by_the_kernel_names_memory():
    status, reason = classify_error("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert status == "crashed" and "OOM killer" in reason and "host memory" in reason


def _tiny_run(write_config, out: Path) -> None:
    cfg = write_config(sleepy_config(**{"search.num_workers": [0, 1], "trial.window_s": 0.3, "strategy": "grid"}))
    done = tunekit.sweep(cfg, out=out)
    assert done.recommendation is not None, done.reason


def test_report_refuses_a_symlink_among_the_outputs_and_writes_nothing_outside(write_config, tmp_path: Path):
    import subprocess
    import sys

    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    _tiny_run(write_config, out)
    elsewhere.mkdir()
    (elsewhere / "keep.png").write_bytes(b"not tunekit's")
    import shutil

    shutil.rmtree(out / "plots")
    (out / "plots").symlink_to(elsewhere)
    refused = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(out)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "symlink" in line and str(out / "plots") in line
    assert [p.name for p in elsewhere.iterdir()] == ["keep.png"]  # nothing written there, nothing deleted


def test_outputs_are_all_written_or_none(write_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A run whose report cannot be rendered (here: a figure that raises) keeps its earlier outputs as they were:
    no recommended.yaml rewritten beside a stale report.md."""
    from tunekit import driver, report

    out = tmp_path / "run"
    _tiny_run(write_config, out)
    before = {name: (out / name).read_bytes() for name in ("trials.csv", "recommended.yaml", "report.md")}
    (out / "recommended.yaml").write_text("# edited by hand\n")

    def broken(*args, **kwargs):
        raise ValueError("a figure could not be drawn")

    monkeypatch.setattr(report, "report_md", broken)
    with pytest.raises(ValueError, match="could not be drawn"):
        driver.rebuild(out)
    assert (out / "recommended.yaml").read_text() == "# edited by hand\n"
    assert (out / "report.md").read_bytes() == before["report.md"] and (out / "plots").is_dir()
    assert not (out / ".plots.new").exists()


@pytest.mark.alone
def test_a_trial_on_a_machine_other_processes_keep_busy_names_them(tmp_path: Path):
    """Busy loops outside the trial's tree, one per usable CPU: the trial measures the cores they took, warns, and
    its verdict is shared-host with CPU advice (no GPU here)."""
    import subprocess
    import sys

    from tunekit.diagnosis import trial_verdicts
    from tunekit.records import rows_from_measurements

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(config.cpu_count())]
    try:
        m = run_trial(_spec(sleepy_config(**{"trial.window_s": 0.5})), tmp_path / "t", 60)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert m.status == "ok", m.reason
    assert m.other_cpu_cores > 0.5 * config.cpu_count(), m.other_cpu_cores
    assert any("other processes kept" in w and "usable CPUs busy" in w for w in m.warnings)
    verdict = trial_verdicts(rows_from_measurements([m]), config.Selection())[0]
    assert verdict.name == "shared-host" and "nvidia-smi" not in verdict.fix


def test_a_disturbed_run_says_so_first_everywhere(tmp_path: Path):
    """The quickstart on a busy 2-core box: windows scattered 20-50 %, the band widened past 10 %, and a knee read
    201 % of its own compute ceiling. report.md, recommended.yaml and the console say so before anything else."""
    from tests.conftest import measurement
    from tunekit.records import rows_from_measurements
    from tunekit.report import summarize, write_outputs

    cfg = config.from_dict(sleepy_config())
    rows = rows_from_measurements(
        [
            measurement(0, "compute", "compute", 100, batch_size=8, noise_cv=0.3),
            measurement(1, "end_to_end", "train", 201, batch_size=8, num_workers=2, noise_cv=0.35),
            measurement(2, "end_to_end", "train", 160, batch_size=8, num_workers=0, noise_cv=0.45),
        ]
    )
    s = summarize(cfg, rows, strategy="staged")
    assert s.choice.band > 0.10
    assert any("noise band" in d and "pick is uncertain" in d for d in s.disturbances)
    assert any("trial 1 ran at 201% of its own compute ceiling" in d for d in s.disturbances)
    write_outputs(tmp_path, s, {})
    report = (tmp_path / "report.md").read_text().splitlines()
    assert report[4].startswith("**Disturbed:**")  # under the title and the line that describes the run
    rec_text = (tmp_path / "recommended.yaml").read_text()
    assert rec_text.splitlines()[1].startswith("# DISTURBED:")
    assert yaml.safe_load(rec_text)["evidence"]["disturbed"] == list(s.disturbances)
    quiet = summarize(
        cfg,
        rows_from_measurements(
            [
                measurement(0, "compute", "compute", 300, batch_size=8),
                measurement(1, "end_to_end", "train", 201, batch_size=8, num_workers=2),
                measurement(2, "end_to_end", "train", 160, batch_size=8, num_workers=0),
            ]
        ),
        strategy="staged",
    )
    assert quiet.disturbances == ()


def test_validate_reports_import_problems_beside_the_other_errors(write_config):
    import subprocess
    import sys

    path = write_config(
        sleepy_config(
            **{
                "workload.model": "tunekit.workloads.synthetic:no_such_model",
                "trial.measure_windows": 3,
                "trial.max_windows": 2,
            }
        )
    )
    bad = subprocess.run(
        [sys.executable, "-m", "tunekit", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert any("trial.max_windows" in line for line in lines) and any("no_such_model" in line for line in lines)


def test_an_iterable_dataset_sweep_prints_no_false_failure(
    write_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    cfg = write_config(
        sleepy_config(
            **{
                "workload.dataset": "tests._workloads:sharded_stream",
                "workload.dataset_args": {},
                "search.num_workers": [0],
                "search.batch_size": [4, 8],
                "strategy": "grid",
                "trial.window_s": 0.3,
            }
        )
    )
    run = tunekit.sweep(cfg, out=tmp_path / "run", quiet=False)  # what `tunekit sweep` prints, in this process
    said = capsys.readouterr().err
    assert run.recommendation is not None, said
    assert "building the dataset failed" not in said and "dataset ready: an IterableDataset" in said


def test_an_import_path_that_does_not_resolve_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tunekit.workloads import check_paths

    monkeypatch.chdir(tmp_path)
    problems = check_paths({"workload.model": "mytask_nowhere:make_model", "workload.dataset": "sub/task.py:make"})
    assert f"looked in {tmp_path}" in problems["workload.model"] and "PYTHONPATH" in problems["workload.model"]
    assert f"relative to the folder tunekit runs in, {tmp_path}" in problems["workload.dataset"]


def test_a_study_holding_nan_or_negative_figures_is_data_not_a_raw_error(write_config, tmp_path: Path):
    """A study.db whose record of a trial holds NaN and negative figures (edited, corrupted): `tunekit report` gave
    a raw StatisticsError and wrote nothing; it now reads that trial as bad_output, naming it and the field, and
    writes every output."""
    import json
    import sqlite3
    import subprocess
    import sys

    out = tmp_path / "run"
    _tiny_run(write_config, out)
    db = sqlite3.connect(out / "study.db")
    ((trial_id, text),) = db.execute(
        "select trial_id, value_json from trial_user_attributes where key = "
        "'measurement' and value_json like '%\"number\": 1,%'"
    ).fetchall()
    record = json.loads(text)
    record.update(rate=float("nan"), noise_cv=-0.5, rate_windows=[float("nan"), -3.0])
    db.execute(
        "update trial_user_attributes set value_json = ? where trial_id = ? and key = 'measurement'",
        (json.dumps(record), trial_id),
    )
    db.commit()
    db.close()
    done = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Error" not in done.stderr
    report = (out / "report.md").read_text()
    assert "bad_output: study.db's record of trial 1 is not a measurement: rate = nan" in report
