"""benchmarks/: compare.py resumes a cut-off side-by-side run; a trial that left no measurement is not another's."""

import importlib.util
import json
import sys
from pathlib import Path

from tunekit.contract import Measurement

_BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
sys.path.insert(0, str(_BENCHMARKS))  # as when a script runs: its folder first, for benchmarks/_common.py
_spec = importlib.util.spec_from_file_location("compare", _BENCHMARKS / "compare.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def _trial(trials: Path, n: int, status: str, sps, **params) -> None:
    (trials / str(n)).mkdir(parents=True)
    if status != "cut":  # a trial killed mid-run leaves its folder without a measurement
        m = {"version": 2, "status": status, "rate": sps, "params": {"grad_accum": 1, "compile": "none", **params}}
        (trials / str(n) / "measurement.json").write_text(json.dumps(m))


def test_previous_rounds_count_only_finished_trials_of_the_same_knobs(tmp_path):
    knobs = {"num_workers": 4, "prefetch_factor": 2, "pin_memory": True, "batch_size": 64}
    _trial(tmp_path, 0, "ok", 100.0, **knobs)
    _trial(tmp_path, 1, "cut", None)
    _trial(tmp_path, 2, "ok", 50.0, **{**knobs, "batch_size": 32})  # the recommendation changed since
    _trial(tmp_path, 10, "oom", None, **knobs)
    _trial(tmp_path, 11, "ok", 110.0, **knobs)
    assert compare._previous(tmp_path, knobs) == (3, [100.0, 110.0])
    assert compare._previous(tmp_path / "missing", knobs) == (0, [])


def test_a_trial_that_left_no_measurement_is_a_failed_round_not_the_previous_one(tmp_path):
    _trial(tmp_path / "trials", 0, "ok", 100.0, num_workers=0)
    # a command that fails before it starts a trial: the earlier trial must not be read again as this round's
    m, trial_dir = compare.run_trial(tmp_path / "no-such-config.yaml", tmp_path, ["num_workers=0"])
    assert m.status == "crashed" and m.reason and trial_dir is None


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_time_breakdown_splits_each_trial_into_its_parts(tmp_path):
    breakdown = _load("time_breakdown").breakdown
    for n, stage, wall in ((0, "compute", 10.0), (1, "end_to_end", 20.0), (2, "end_to_end", 30.0)):
        (tmp_path / "trials" / str(n)).mkdir(parents=True)
        m = {
            "status": "ok",
            "stage": stage,
            "launcher_wall_s": wall,
            "startup_s": 2.0,
            "cuda_init_s": 0.5,
            "build_s": 1.5,
            "warmup_s": 2.0,
            "measured_s": wall / 2,
        }
        (tmp_path / "trials" / str(n) / "measurement.json").write_text(json.dumps(m))
    (tmp_path / "trials" / "3").mkdir()
    (tmp_path / "trials" / "3" / "measurement.json").write_text(json.dumps({"status": "skipped", "stage": "x"}))
    rows = {r["stage"]: r for r in breakdown(tmp_path)}
    assert set(rows) == {"compute", "end_to_end", "all"}  # skipped trials cost nothing
    whole = rows["all"]
    assert whole["trials"] == 3 and whole["wall_s"] == 60.0 and whole["measured_share"] == 0.5
    # the launcher's wall time the worker did not account for, per trial and never below 0: 0 + 4 + 9
    assert whole["other_s"] == 13.0
    assert whole["trials_per_min"] == 3.0
    assert rows["end_to_end"]["trials"] == 2 and rows["end_to_end"]["wall_s"] == 50.0
    # the loader's start and the teardown, where the worker timed them, leave "other"
    m = json.loads((tmp_path / "trials" / "2" / "measurement.json").read_text())
    (tmp_path / "trials" / "2" / "measurement.json").write_text(
        json.dumps({**m, "loop_setup_s": 3.0, "teardown_s": 4.0})
    )
    whole = {r["stage"]: r for r in breakdown(tmp_path)}["all"]
    assert (whole["loop_setup_s"], whole["teardown_s"], whole["other_s"]) == (3.0, 4.0, 6.0)
    sweep_wall = _load("time_breakdown").sweep_wall
    assert sweep_wall(tmp_path, 60.0) is None  # no sweep.json: nothing to say
    calls = [{"wall_s": 50.0, "dataset_s": 20.0, "trials": 2}, {"wall_s": 40.0, "dataset_s": 1.0, "trials": 4}]
    (tmp_path / "sweep.json").write_text(json.dumps({"invocations": calls}))
    line = sweep_wall(tmp_path, 60.0)
    assert "90 s (1.5 min) in 2 invocation(s) (50 + 40 s)" in line and "dataset preparation 21 s" in line
    assert "the rest (planning, recording, the environment snapshot) 9 s" in line
    # a rerun of the finished sweep is named apart, not added to its time
    calls.append({"wall_s": 12.0, "dataset_s": 6.0, "trials": 4, "interrupted": False})
    (tmp_path / "sweep.json").write_text(json.dumps({"invocations": calls}))
    line = sweep_wall(tmp_path, 60.0)
    assert "90 s (1.5 min) in 2 invocation(s) (50 + 40 s)" in line
    assert line.endswith("; 1 more invocation(s) found nothing left to run (12 s)")


def test_the_ddp_side_by_side_names_a_config_measured_twice_under_two_names():
    spec = importlib.util.spec_from_file_location("ddp_side_by_side", _BENCHMARKS / "ddp_side_by_side.py")
    sbs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sbs)
    knobs = {"num_workers": 15, "prefetch_factor": 2, "pin_memory": False, "batch_size": 512, "ranks": 2}
    configs = {
        "tunekit": knobs,
        "Lightning rule (15/rank)": dict(knobs),
        "single-GPU knee per rank": {**knobs, "num_workers": 16},
    }
    measured = {
        name: [Measurement(status="ok", rate=rate)]
        for name, rate in zip(configs, (4803.0, 5045.0, 5053.0), strict=True)
    }
    rows = sbs._table(configs, measured)
    assert [r["same_as"] for r in rows] == [None, "tunekit", None]
    assert rows[1]["vs_tunekit"] == 5045.0 / 4803.0


def test_fidelity_compares_the_long_run_with_the_short_trials_on_either_side_of_it():
    """A host that slows steadily over the three runs (110, then 100, then 90 samples/s) moves the short trials
    around the long one: their mean over it is 1.0, and the drift column shows the host's move."""
    row = _load("trial_fidelity")._row

    def ok(rate: float) -> Measurement:
        return Measurement(status="ok", rate=rate)

    r = row(16, ok(110.0), ok(100.0), ok(90.0))
    assert r["ratio"] == 1.0 and round(r["drift"], 3) == -0.182 and r["status"] == "ok/ok/ok"
    failed = row(0, ok(110.0), Measurement(status="timeout"), ok(90.0))
    assert failed["ratio"] is None and failed["drift"] is None


def test_the_benchmarks_give_each_set_key_once_with_the_later_value():
    """The showcase's step 3 passes --set pin_memory=false over the benchmark's own pin_memory=true: each trial's
    --set list names the key once (tunekit trial refuses it twice), the user's value winning, the long run's last."""
    merged = _load("_common").merged_sets
    base = ["num_workers=16", "batch_size=512", "pin_memory=true"]
    assert merged(base, ["pin_memory=false"]) == ["num_workers=16", "batch_size=512", "pin_memory=false"]
    long = merged(base, ["pin_memory=false", "trial.window_s=3"], ["trial.window_s=30"])
    assert long == ["num_workers=16", "batch_size=512", "pin_memory=false", "trial.window_s=30"]


def test_the_plan_replay_answers_from_the_recorded_trials_and_cuts_a_clear_miss_where_the_rule_now_stops(tmp_path):
    """A recorded run (written here as the plan asked, 8 windows each): the replay asks the same plan and gets
    every answer from the record; each trial is cut where the window rule stops it now, its time losing the cut
    windows' share of its measured seconds. A record that lacks a config stops the replay there."""
    from tests.conftest import measurement, sleepy_config
    from tunekit import config, plan
    from tunekit.records import rows_from_measurements

    replay = _load("replay_plan").replay
    cfg = config.from_dict(
        sleepy_config(
            **{
                "search.num_workers": [0, 2, 4],
                "search.batch_size": [8],
                "search.pin_memory": [False],
                "search.prefetch_factor": [2],
                "search.compile": ["none"],
                "trial.max_windows": 8,
                "trial.measure_windows": 3,
                "trial.precision": 0.03,
            }
        )
    )

    def rate(req) -> float:
        return 1000.0 if req.mode == "compute" else min(400.0, 100.0 * req.knobs.num_workers) or 80.0

    rows = []
    while reqs := plan.next_requests(cfg, rows, strategy="staged", cuda=False):
        req, n = reqs[0], len(rows)
        if req.skip:
            m = {
                "number": n,
                "stage": req.stage,
                "mode": req.mode,
                "status": "skipped",
                "reason": req.skip,
                "params": req.knobs.to_dict(),
            }
        else:
            r = rate(req)
            m = measurement(
                n,
                req.stage,
                req.mode,
                r,
                **{**req.knobs.to_dict(), "extra": None},
                rate_windows=[r * f for f in (0.99, 1.01) * 4],
                measured_s=8.0,
                trial_s=12.0,
            )
        (tmp_path / "trials" / str(n)).mkdir(parents=True)
        (tmp_path / "trials" / str(n) / "measurement.json").write_text(json.dumps(m))
        rows += rows_from_measurements([m])
    replayed, lines, seconds, missing = replay(tmp_path, cfg, cuda=False)
    assert missing is None and len(replayed) == len(rows)
    assert [(r.stage, r.knobs.num_workers, r.status) for r in replayed] == [
        (r.stage, r.knobs.num_workers, r.status) for r in rows
    ]
    # a clear miss stops after 2 windows (12 s less 6/8 of the 8 measured seconds): the loader ceiling (400/s
    # against the ~970 that reach the compute ceiling), PyTorch's defaults (80/s) and 2 workers (200/s) against
    # the band of ~400/s; the compute ceiling and 4 workers stop at 3, precise (1 % noise: 12 s less 5/8 of 8)
    kept = {
        line.split(":")[0].split(" run  ")[1].split(",")[0]: line.split(": ")[1] for line in lines if " run " in line
    }
    assert {k: v.split(", ", 1)[1] for k, v in kept.items()} == {
        "compute    0 workers": "windows 3 of 8, 7.0 s",
        "loader     4 workers": "windows 2 of 8, 6.0 s",
        "end_to_end 4 workers": "windows 3 of 8, 7.0 s",
        "end_to_end 0 workers": "windows 2 of 8, 6.0 s",
        "end_to_end 2 workers": "windows 2 of 8, 6.0 s",
    }
    assert seconds == 7.0 * 2 + 6.0 * 3
    first = next(
        p
        for p in sorted((tmp_path / "trials").iterdir(), key=lambda p: int(p.name))
        if json.loads((p / "measurement.json").read_text())["status"] == "ok"
    )
    (first / "measurement.json").unlink()  # the record lacks the first trial the plan asks for
    assert replay(tmp_path, cfg, cuda=False)[3] is not None
