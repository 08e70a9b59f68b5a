from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import tunekit
from tests.conftest import measurement, sleepy_config, study_trials, trial_number
from tunekit import config, plan, rules
from tunekit.contract import Mode, Stage
from tunekit.plan import Request, _finished, _walk, estimate_total, next_requests
from tunekit.records import rows_from_measurements


def _cfg(**overrides):
    base = {
        "search.num_workers": [0, 2, 6, 8],
        "search.batch_size": [8, 16, 32],
        "search.pin_memory": [False, True],
        "search.prefetch_factor": [2, 4],
        "search.compile": ["none", "default"],
    }
    base.update(overrides)
    return config.from_dict(sleepy_config(**base))


_m = functools.partial(measurement, batch_size=8)


def _maybe_skip(req, rows, cfg):
    return _walk._maybe_skip(req, _finished._Finished(cfg, rows, cuda=True))


def test_compute_stage_walks_down_from_the_largest_batch_past_ooms_until_one_falls_out_of_the_band():
    cfg = _cfg(**{"search.batch_size": [4, 8, 16, 32]})
    first = plan.next_requests(cfg, [], strategy="staged", cuda=True)
    assert [(r.stage, r.knobs.batch_size) for r in first] == [("compute", 32)]
    rows = rows_from_measurements([_m(0, "compute", "compute", None, status="oom", batch_size=32)])
    assert plan.next_requests(cfg, rows, strategy="staged", cuda=True)[0].knobs.batch_size == 16  # past the OOM
    rows += rows_from_measurements([_m(1, "compute", "compute", 400, batch_size=16)])
    assert plan.next_requests(cfg, rows, strategy="staged", cuda=True)[0].knobs.batch_size == 8
    within = rows + rows_from_measurements([_m(2, "compute", "compute", 395, batch_size=8)])  # within the band
    assert plan.next_requests(cfg, within, strategy="staged", cuda=True)[0].knobs.batch_size == 4
    rows += rows_from_measurements([_m(2, "compute", "compute", 300, batch_size=8)])  # out of the band: batch 4 is
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=True)  # not measured, the batch is 16
    assert nxt[0].stage == "loader" and nxt[0].knobs.batch_size == 16


def test_stages_follow_in_order_and_pruning_skips_hopeless_worker_counts():
    cfg = _cfg(**{"search.batch_size": [8]})
    ms = [_m(0, "compute", "compute", 400)]
    ms += [
        _m(i + 1, "loader", "loader", rate, num_workers=w, pin_memory=True)
        for i, (w, rate) in enumerate([(0, 80), (2, 200), (6, 600), (8, 800)])
    ]
    rows = rows_from_measurements(ms)
    start = plan.next_requests(cfg, rows, strategy="staged", cuda=True)[0]
    # 6 workers: the fewest whose loader ceiling (600/s) reaches the compute ceiling (400/s), pinned first
    assert (start.stage, start.knobs.num_workers, start.knobs.pin_memory, start.skip) == ("end_to_end", 6, True, None)
    rows += rows_from_measurements([_m(9, "end_to_end", "train", 398, num_workers=6, pin_memory=True)])
    assert plan.next_requests(cfg, rows, strategy="staged", cuda=True)[0].knobs.num_workers == 6  # unpinned
    rows += rows_from_measurements([_m(10, "end_to_end", "train", 396, num_workers=6)])
    # then PyTorch's defaults, raced against the band the start gave
    defaults = plan.next_requests(cfg, rows, strategy="staged", cuda=True)[0]
    assert (defaults.knobs.num_workers, defaults.knobs.pin_memory, defaults.skip) == (0, False, None)
    assert plan.needed_rate(cfg, rows, defaults) == pytest.approx(398 * 0.97)
    rows += rows_from_measurements([_m(11, "end_to_end", "train", 80)])
    assert plan.next_requests(cfg, rows, strategy="staged", cuda=True)[0].knobs.num_workers == 8  # to confirm
    # 2 workers: the loader alone gives 200/s, far below 97 % of 400/s -> skipped with its evidence
    rows += rows_from_measurements([_m(12, "end_to_end", "train", 400, num_workers=8, pin_memory=True)])
    requests = plan.next_requests(
        cfg,
        rows + rows_from_measurements([_m(13, "end_to_end", "train", 400, num_workers=8)]),
        strategy="staged",
        cuda=True,
    )
    assert requests[0].knobs.num_workers == 2 and requests[0].skip and "200.0 samples/s" in requests[0].skip
    assert requests[0].knobs.pin_memory  # the loader ceiling was measured pinned: it bounds pinned trials only
    unpinned = _maybe_skip(
        plan.Request(
            "end_to_end", "train", requests[0].knobs.__class__(num_workers=2, prefetch_factor=2, batch_size=8)
        ),
        rows,
        cfg,
    )
    assert unpinned.skip is None
    defaults = _maybe_skip(plan.Request("end_to_end", "train", requests[0].knobs.__class__(batch_size=8)), rows, cfg)
    assert defaults.skip is None  # PyTorch defaults are always measured


def test_pruning_uses_the_runs_noise_not_one_noisy_best_trial():
    cfg = _cfg(**{"search.batch_size": [8]})
    ms = [_m(0, "compute", "compute", 400), _m(1, "loader", "loader", 320, num_workers=2, pin_memory=True)]
    best = _m(2, "end_to_end", "train", 400, num_workers=8, pin_memory=True)
    best["noise_cv"] = 0.30  # one wild window: under its own noise, 2 workers' 320/s ceiling would look reachable
    ms += [
        best,
        _m(3, "end_to_end", "train", 390, num_workers=8),
        _m(4, "end_to_end", "train", 385, num_workers=6, pin_memory=True),
    ]
    rows = rows_from_measurements(ms)
    req = _maybe_skip(
        plan.Request(
            "end_to_end",
            "train",
            rows[-1].knobs.__class__(num_workers=2, prefetch_factor=2, pin_memory=True, batch_size=8),
        ),
        rows,
        cfg,
    )
    # run noise = median CV of the upper half (0.30, 0.01) -> 0.155: needed = 400 * 0.845 = 338 > 320 * 1.03
    assert req.skip and "338.0 needed" in req.skip


def test_grid_has_every_valid_combination():
    cfg = _cfg(**{"search.batch_size": [8]})
    grid = plan.next_requests(cfg, [], strategy="grid", cuda=True)
    # workers 0: 1 prefetch (none); 3 worker counts x 2 prefetch; x 2 pins x 2 compile modes
    assert len(grid) == (1 + 3 * 2) * 2 * 2
    assert all(r.knobs.prefetch_factor is None for r in grid if r.knobs.num_workers == 0)
    assert len(plan.next_requests(cfg, [], strategy="grid", cuda=False)) == (1 + 3 * 2) * 2  # no pinning on CPU


def test_single_end_to_end_config_still_gets_prefetch_and_compile_stages():
    cfg = _cfg(**{"search.num_workers": [8], "search.pin_memory": [False], "search.batch_size": [8]})
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 400),
            _m(1, "loader", "loader", 800, num_workers=8),
            _m(2, "end_to_end", "train", 390, num_workers=8),
            _m(3, "end_to_end", "train", 80),
        ]
    )  # the defaults, always run
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.prefetch_factor) for r in nxt] == [("prefetch", 4)]


@pytest.mark.parametrize("cpu_busy,runs", [(0.95, False), (0.5, True)])
def test_prefetch_is_skipped_when_the_knee_keeps_the_cpus_busy(cpu_busy: float, runs: bool):
    """A knee that waits on data 40 % of the time: deeper prefetch is tried while CPUs are free, and skipped with
    the evidence when the trial already keeps them over CPU_SATURATED busy (the same CPU time makes the batches)."""
    cfg = _cfg(**{"search.num_workers": [8], "search.pin_memory": [False], "search.batch_size": [8]})
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 400),
            _m(1, "loader", "loader", 300, num_workers=8),
            _m(2, "end_to_end", "train", 290, num_workers=8, data_wait_frac=0.4, cpu_util_frac=cpu_busy),
            _m(3, "end_to_end", "train", 80),
        ]
    )
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.prefetch_factor) for r in nxt] == [("prefetch", 4)]
    assert (nxt[0].skip is None) == runs
    if not runs:
        assert "95% of its usable CPUs busy" in nxt[0].skip


def test_defaults_run_even_when_zero_workers_is_not_searched():
    cfg = _cfg(**{"search.num_workers": [4, 8], "search.pin_memory": [False], "search.batch_size": [8]})
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 400),
            *[_m(i + 1, "loader", "loader", 800, num_workers=w) for i, w in enumerate([4, 8])],
            _m(3, "end_to_end", "train", 390, num_workers=8),
            _m(4, "end_to_end", "train", 385, num_workers=4),
        ]
    )
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert (nxt[0].stage, nxt[0].knobs.num_workers, nxt[0].knobs.pin_memory, nxt[0].skip) == (
        "end_to_end",
        0,
        False,
        None,
    )


def test_grid_with_a_target_effective_batch_builds_the_pairs():
    cfg = _cfg(
        **{
            "search.num_workers": [0],
            "search.batch_size": [8, 16, 32],
            "search.compile": ["none"],
            "search.target_effective_batch": 32,
        }
    )
    shapes = {
        (r.knobs.batch_size, r.knobs.grad_accum) for r in plan.next_requests(cfg, [], strategy="grid", cuda=False)
    }
    assert shapes == {(8, 4), (16, 2), (32, 1)}


def _data_bound_rows(knee_rate):
    """batch 32 chosen by the compute ceiling; 8 workers end to end at batch 32 give knee_rate."""
    return rows_from_measurements(
        [
            _m(0, "compute", "compute", 300, batch_size=8),
            _m(1, "compute", "compute", 600, batch_size=16),
            _m(2, "compute", "compute", 1000, batch_size=32),
            _m(3, "loader", "loader", 900, num_workers=8, batch_size=32),
            _m(4, "end_to_end", "train", knee_rate, num_workers=8, batch_size=32),
            _m(5, "end_to_end", "train", 80, batch_size=32),
        ]
    )


def test_a_data_bound_knee_tries_smaller_batches_while_they_keep_up():
    cfg = _cfg(**{"search.num_workers": [8], "search.pin_memory": [False], "search.prefetch_factor": [2]})
    rows = _data_bound_rows(400)  # 40 % of the compute ceiling at batch 32: the loader is the bound
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.batch_size, r.knobs.num_workers, r.skip) for r in nxt] == [("batch", 16, 8, None)]
    rows += rows_from_measurements([_m(6, "batch", "train", 420, num_workers=8, batch_size=16)])
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    # batch 8's compute ceiling (300/s) cannot reach 97 % of 420/s: skipped with that evidence
    assert (nxt[0].stage, nxt[0].knobs.batch_size) == ("batch", 8)
    assert nxt[0].skip and "compute ceiling at batch 8 is 300.0 samples/s" in nxt[0].skip
    rows += rows_from_measurements(
        [{**_m(7, "batch", "train", None, num_workers=8, batch_size=8), "status": "skipped"}]
    )
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.batch_size, r.knobs.compile) for r in nxt] == [("compile", 16, "default")]


@pytest.mark.parametrize("rate8,within", [(640, True), (300, False)])
def test_stage_4b_measures_the_ceiling_of_a_batch_the_compute_stage_did_not_reach_once_it_keeps_within_the_band(
    rate8: float, within: bool
):
    """The compute stage stopped at batch 16 (out of the band of batch 32), so batch 8 has no ceiling: stage 4b tries
    it end to end first (the knee runs far below any ceiling); within the band, its ceiling comes next (the knee may
    land there, and the verdicts and later stages read it), before batch 4; out of it, no ceiling is measured. A
    ceiling that then fails (out of memory) ends the stage."""
    cfg = _cfg(
        **{
            "search.num_workers": [8],
            "search.pin_memory": [False],
            "search.prefetch_factor": [2],
            "search.batch_size": [4, 8, 16, 32],
        }
    )
    rows = rows_from_measurements(
        [_m(0, "compute", "compute", 1000, batch_size=32), _m(1, "compute", "compute", 700, batch_size=16)]
    )
    assert plan.next_requests(cfg, rows, strategy="staged", cuda=False)[0].stage == "loader"  # batch 8 not asked
    rows += rows_from_measurements(
        [
            _m(2, "loader", "loader", 900, num_workers=8, batch_size=32),
            _m(3, "end_to_end", "train", 600, num_workers=8, batch_size=32),
            _m(4, "end_to_end", "train", 80, batch_size=32),
            _m(5, "batch", "train", 650, num_workers=8, batch_size=16),
        ]
    )
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.mode, r.knobs.batch_size, r.knobs.num_workers, r.skip) for r in nxt] == [
        ("batch", "train", 8, 8, None)
    ]
    rows += rows_from_measurements([_m(6, "batch", "train", rate8, num_workers=8, batch_size=8)])
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    if not within:
        assert [r.stage for r in nxt] == ["compile"]
        return
    assert [(r.stage, r.mode, r.knobs.batch_size, r.knobs.num_workers) for r in nxt] == [("compute", "compute", 8, 0)]
    rows += rows_from_measurements([_m(7, "compute", "compute", 680, batch_size=8)])
    from tunekit.analysis import choose_batch

    assert choose_batch([r for r in rows if r.stage == "compute"], cfg.selection) == 32  # the stages' batch stays
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.batch_size) for r in nxt] == [("batch", 4)]
    oom8 = rows[:-1] + rows_from_measurements([_m(7, "compute", "compute", None, status="oom", batch_size=8)])
    assert [r.stage for r in plan.next_requests(cfg, oom8, strategy="staged", cuda=False)] == ["compile"]  # ends
    oom = rows_from_measurements([_m(0, "compute", "compute", None, status="oom", batch_size=32)]) + rows[1:2]
    assert _finished._fitting_batches(_finished._Finished(cfg, rows[:2], cuda=False)) == [32, 16, 8, 4]
    assert _finished._fitting_batches(_finished._Finished(cfg, oom, cuda=False)) == [16, 8, 4]


def test_the_compute_stage_judges_each_batch_against_the_larger_ones_only():
    """Ceilings 64: 90, 32: 100, 16: 97, 8: 60. Batch 64 is below 32's band, but it was measured first: that must not
    end the walk at 32 once 32 is measured; the walk goes on to 16 (within the band) and stops at 8."""
    cfg = _cfg(**{"search.batch_size": [8, 16, 32, 64]})
    rates = {64: 90.0, 32: 100.0, 16: 97.0, 8: 60.0}
    rows, asked = [], []
    while (req := plan.next_requests(cfg, rows, strategy="staged", cuda=False)[0]).stage == "compute":
        asked.append(req.knobs.batch_size)
        rows += rows_from_measurements(
            [_m(len(rows), "compute", "compute", rates[req.knobs.batch_size], batch_size=req.knobs.batch_size)]
        )
    assert asked == [64, 32, 16, 8] and req.knobs.batch_size == 16


def test_a_smaller_batch_that_falls_behind_ends_the_batch_stage():
    cfg = _cfg(**{"search.num_workers": [8], "search.pin_memory": [False], "search.prefetch_factor": [2]})
    rows = _data_bound_rows(400) + rows_from_measurements([_m(6, "batch", "train", 350, num_workers=8, batch_size=16)])
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.batch_size) for r in nxt] == [("compile", 32)]


def test_a_compute_bound_knee_keeps_its_batch():
    cfg = _cfg(**{"search.num_workers": [8], "search.pin_memory": [False], "search.prefetch_factor": [2]})
    nxt = plan.next_requests(cfg, _data_bound_rows(950), strategy="staged", cuda=False)  # 95 % of the ceiling
    assert [(r.stage, r.knobs.batch_size) for r in nxt] == [("compile", 32)]


def test_a_much_faster_smaller_batch_does_not_end_the_stage_at_the_larger_one():
    """Each batch is judged against itself and larger batches: batch 16 beating batch 32 by far must not make
    batch 32 look as if it fell behind, which would end the stage before batch 8."""
    cfg = _cfg(
        **{
            "search.num_workers": [8],
            "search.pin_memory": [False],
            "search.prefetch_factor": [2],
            "search.batch_size": [8, 16, 32, 64],
        }
    )
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 700, batch_size=8),
            _m(1, "compute", "compute", 800, batch_size=16),
            _m(2, "compute", "compute", 900, batch_size=32),
            _m(3, "compute", "compute", 1000, batch_size=64),
            _m(4, "loader", "loader", 900, num_workers=8, batch_size=64),
            _m(5, "end_to_end", "train", 400, num_workers=8, batch_size=64),
            _m(6, "end_to_end", "train", 80, batch_size=64),
            _m(7, "batch", "train", 410, num_workers=8, batch_size=32),
            _m(8, "batch", "train", 600, num_workers=8, batch_size=16),
        ]
    )
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.batch_size, r.skip) for r in nxt] == [("batch", 8, None)]


def test_no_pruning_against_trials_that_leave_too_little_headroom():
    cfg = _cfg(**{"search.batch_size": [8]})
    ms = [
        _m(0, "compute", "compute", 400),
        _m(1, "loader", "loader", 100, num_workers=2, pin_memory=True),
        _m(2, "end_to_end", "train", 400, headroom=0.02, num_workers=8, pin_memory=True),
    ]
    rows = rows_from_measurements(ms)
    req = _maybe_skip(
        plan.Request(
            "end_to_end",
            "train",
            rows[-1].knobs.__class__(num_workers=2, prefetch_factor=2, pin_memory=True, batch_size=8),
        ),
        rows,
        cfg,
    )
    assert req.skip is None  # the 8-worker trial cannot be the knee: it is no yardstick for 2 workers, which may fit


def test_compile_is_skipped_with_evidence_when_the_knee_waits_on_data():
    cfg = _cfg(
        **{
            "search.batch_size": [8],
            "search.num_workers": [0, 8],
            "search.pin_memory": [False],
            "search.prefetch_factor": [2],
        }
    )
    base = [
        _m(0, "compute", "compute", 400),
        _m(1, "loader", "loader", 800, num_workers=0),
        _m(2, "loader", "loader", 800, num_workers=8),
        _m(4, "end_to_end", "train", 80, data_wait_frac=0.8),
    ]
    starved = rows_from_measurements([*base, _m(3, "end_to_end", "train", 200, num_workers=8, data_wait_frac=0.5)])
    (req,) = plan.next_requests(cfg, starved, strategy="staged", cuda=False)
    assert req.stage == "compile" and req.knobs.compile == "default"
    assert req.skip and "waits on data 50%" in req.skip and "50% of its compute ceiling" in req.skip
    bound = rows_from_measurements([*base, _m(3, "end_to_end", "train", 390, num_workers=8, data_wait_frac=0.02)])
    (req,) = plan.next_requests(cfg, bound, strategy="staged", cuda=False)
    assert req.stage == "compile" and req.skip is None  # the model is the bound: compiling may help


def _simulate(cfg) -> list:
    """Run the staged plan against the analytic known-knee workload (the loader alone gives W x 100/s, 100/s in the
    main process; the model 400/s; end to end the smaller, 80/s for the defaults), as a sweep would, without
    processes: every request becomes a measurement or a skipped record."""
    from tunekit.analysis import select

    rows: list = []
    while True:
        requests = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
        if not requests:
            return rows, select(cfg, rows)
        req, number = requests[0], len(rows)
        k = req.knobs
        loader = 100.0 * k.num_workers if k.num_workers else 100.0
        rate = {"compute": 400.0, "loader": loader}.get(req.mode, 80.0 if not k.num_workers else min(loader, 400.0))
        if req.skip:
            m = {**_m(number, req.stage, req.mode, None, **k.to_dict()), "status": "skipped", "reason": req.skip}
        else:
            m = _m(number, req.stage, req.mode, rate, data_wait_frac=0.0 if loader >= 400 else 0.5, **k.to_dict())
        rows += rows_from_measurements([m])


def test_plan_from_the_ceilings_runs_fewer_trials_and_keeps_the_knee():
    """Worker counts 0 ... 16 on the known-knee workload. The plan used to run every count whose loader ceiling could
    reach the band, most workers first: 16, 12, 8, 6 and the defaults (5 end to end, 2 skipped). From the ceilings it
    starts at 6 (the fewest whose loader ceiling reaches the compute ceiling), confirms at 8, and skips 12 and 16."""
    cfg = _cfg(
        **{
            "search.num_workers": [0, 2, 6, 8, 12, 16],
            "search.batch_size": [8],
            "search.compile": ["none"],
            "search.prefetch_factor": [2, 4],
        }
    )
    rows, choice = _simulate(cfg)
    e2e = [r for r in rows if r.stage == "end_to_end"]
    assert [r.knobs.num_workers for r in e2e if r.status == "ok"] == [6, 0, 8]  # the start, the defaults, one up
    skipped = {r.knobs.num_workers: r.reason for r in e2e if r.status == "skipped"}
    assert set(skipped) == {2, 12, 16} and "plateau" in skipped[12] and "loader alone" in skipped[2]
    assert choice.knee is not None and choice.knee.knobs.num_workers == 6
    prefetch = [r for r in rows if r.stage == "prefetch"]  # the knee never waits: prefetch 4 cannot help
    assert [r.status for r in prefetch] == ["skipped"] and "cannot make it faster" in prefetch[0].reason


def test_walking_down_stops_once_a_count_falls_out_of_the_band():
    """Optimistic loader ceilings (all above the compute ceiling from 4 workers): the start is 4; once 3 workers fall
    out of the band end to end, 2 and 1 are skipped with that evidence, not run."""
    cfg = _cfg(
        **{
            "search.num_workers": [0, 1, 2, 3, 4, 5],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
        }
    )
    ms = [_m(0, "compute", "compute", 400)]
    ms += [
        _m(i + 1, "loader", "loader", rate, num_workers=w)
        for i, (w, rate) in enumerate([(0, 100), (1, 380), (2, 380), (3, 380), (4, 800), (5, 900)])
    ]
    ms += [
        _m(10, "end_to_end", "train", 80),
        _m(11, "end_to_end", "train", 400, num_workers=4),
        _m(12, "end_to_end", "train", 401, num_workers=5),
        _m(13, "end_to_end", "train", 300, num_workers=3),
    ]
    (req,) = plan.next_requests(cfg, rows_from_measurements(ms), strategy="staged", cuda=False)
    assert (req.knobs.num_workers, req.stage) == (2, "end_to_end")
    assert req.skip and "3 workers (trial 13, 300.0 samples/s) already fell out of the band" in req.skip


def test_a_count_above_the_start_that_falls_out_of_the_band_says_nothing_of_the_counts_below_it():
    """6 workers start the walk within the band; 8, the count above that confirms the plateau, falls out of it (noise
    or oversubscription). 2 workers, below the start, are judged by their own loader ceiling, not by 8's rate."""
    cfg = _cfg(
        **{
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
        }
    )
    ms = [_m(0, "compute", "compute", 400)]
    ms += [
        _m(i + 1, "loader", "loader", rate, num_workers=w)
        for i, (w, rate) in enumerate([(0, 100), (2, 200), (6, 600), (8, 800)])
    ]
    ms += [
        _m(10, "end_to_end", "train", 400, num_workers=6),
        _m(11, "end_to_end", "train", 80),
        _m(12, "end_to_end", "train", 300, num_workers=8),
    ]
    (req,) = plan.next_requests(cfg, rows_from_measurements(ms), strategy="staged", cuda=False)
    assert (req.knobs.num_workers, req.stage) == (2, "end_to_end")
    assert req.skip and "the loader alone gives 200.0 samples/s at 2 workers" in req.skip


def test_loader_ceilings_are_measured_only_where_they_decide_the_start():
    """A CPU-bound loader (the showcase's shape): the most workers' ceiling stays below the compute ceiling, so the
    walk starts there and no other loader count is measured; each is skipped with that evidence. 16 workers pinned
    fall out of the band, but nothing above them says which way the curve runs (fewer workers may contend less for
    the CPUs), so 12 are tried pinned; once 12 pinned are slower still, fewer are not tried pinned, while the
    unpinned walk goes on."""
    cfg = _cfg(
        **{
            "search.num_workers": [0, 2, 8, 12, 16],
            "search.batch_size": [8],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
        }
    )
    rows = rows_from_measurements([_m(0, "compute", "compute", 4900)])
    (first,) = plan.next_requests(cfg, rows, strategy="staged", cuda=True)
    assert (first.stage, first.knobs.num_workers, first.knobs.pin_memory, first.skip) == ("loader", 16, True, None)
    rows += rows_from_measurements([_m(1, "loader", "loader", 3000, num_workers=16, pin_memory=True)])
    skipped = plan.next_requests(cfg, rows, strategy="staged", cuda=True)
    assert sorted(r.knobs.num_workers for r in skipped) == [0, 2, 8, 12]
    assert all(r.stage == "loader" and "below the compute ceiling" in r.skip for r in skipped)
    rows += rows_from_measurements(
        [
            {**_m(2 + i, "loader", "loader", None, **r.knobs.to_dict()), "status": "skipped", "reason": r.skip}
            for i, r in enumerate(skipped)
        ]
    )
    rows += rows_from_measurements(
        [
            _m(10, "end_to_end", "train", 300),
            _m(11, "end_to_end", "train", 2500, num_workers=16, pin_memory=True),
            _m(12, "end_to_end", "train", 2950, num_workers=16),
        ]
    )
    (nxt,) = plan.next_requests(cfg, rows, strategy="staged", cuda=True)
    assert (nxt.knobs.num_workers, nxt.knobs.pin_memory, nxt.skip) == (12, True, None)
    rows += rows_from_measurements([_m(13, "end_to_end", "train", 2400, num_workers=12, pin_memory=True)])
    (unpinned,) = plan.next_requests(cfg, rows, strategy="staged", cuda=True)
    assert (unpinned.knobs.num_workers, unpinned.knobs.pin_memory, unpinned.skip) == (12, False, None)
    rows += rows_from_measurements([_m(14, "end_to_end", "train", 3000, num_workers=12)])
    (eight,) = plan.next_requests(cfg, rows, strategy="staged", cuda=True)
    assert (eight.knobs.num_workers, eight.knobs.pin_memory) == (8, True)
    assert eight.skip and (
        "12 workers pinned (trial 13, 2400.0 samples/s) already fell out of the band" in eight.skip
        and "below 16 workers (trial 11, 2500.0)" in eight.skip
    )
    rows += rows_from_measurements(
        [{**_m(15, "end_to_end", "train", None, **eight.knobs.to_dict()), "status": "skipped", "reason": eight.skip}]
    )
    (nxt,) = plan.next_requests(cfg, rows, strategy="staged", cuda=True)
    assert (nxt.knobs.num_workers, nxt.knobs.pin_memory, nxt.skip) == (8, False, None)


def test_a_walk_down_that_climbs_is_not_cut_by_the_first_count_out_of_the_band():
    """More workers than the CPUs run (an H200 host of 16 CPUs measured 32, 24 and 16 workers pinned at 2960, 3034 and
    3590 samples/s): the counts out of the band above the best were each faster going down, so they say nothing of
    fewer workers; the walk measures the next count below the best and stops only after a count that is slower
    than the one above it."""
    cfg = _cfg(
        **{
            "search.num_workers": [0, 8, 12, 16, 24, 32],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
        }
    )
    ms = [_m(0, "compute", "compute", 10000), _m(1, "loader", "loader", 4100, num_workers=32)]
    ms += [
        _m(10, "end_to_end", "train", 2960, num_workers=32),
        _m(11, "end_to_end", "train", 500),
        _m(12, "end_to_end", "train", 3034, num_workers=24),
        _m(13, "end_to_end", "train", 3590, num_workers=16),
    ]
    rows = rows_from_measurements(ms)
    skipped = plan.next_requests(cfg, rows, strategy="staged", cuda=False)  # the loader counts below 32
    assert all(r.stage == "loader" and r.skip for r in skipped)
    rows += rows_from_measurements(
        [
            {**_m(2 + i, "loader", "loader", None, **r.knobs.to_dict()), "status": "skipped", "reason": r.skip}
            for i, r in enumerate(skipped)
        ]
    )
    (nxt,) = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert (nxt.knobs.num_workers, nxt.skip) == (12, None)  # not skipped on 32 or 24 workers' evidence
    rows += rows_from_measurements([_m(14, "end_to_end", "train", 3300, num_workers=12)])
    (nxt,) = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert nxt.knobs.num_workers == 8
    assert nxt.skip and "12 workers (trial 14, 3300.0 samples/s) already fell out" in nxt.skip
    assert "below 16 workers (trial 13, 3590.0)" in nxt.skip


def test_a_count_within_noise_of_the_one_above_says_nothing_of_fewer_workers():
    """Pinned 32 and 24 workers read 2700 and 2695 (0.2 % apart, within the band), both out of the band of the best
    (24 unpinned, 3010): which way the pinned curve runs is noise, so 16 workers pinned are measured, not skipped."""
    cfg = _cfg(
        **{
            "search.num_workers": [0, 16, 24, 32],
            "search.batch_size": [8],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
        }
    )
    ms = [_m(0, "compute", "compute", 10000), _m(1, "loader", "loader", 4000, num_workers=32, pin_memory=True)]
    ms += [
        _m(2, "loader", "loader", None, status="skipped", num_workers=w, pin_memory=True, reason="below the ceiling")
        for w in (0, 16, 24)
    ]
    ms += [
        _m(10, "end_to_end", "train", 2700, num_workers=32, pin_memory=True),
        _m(11, "end_to_end", "train", 3000, num_workers=32),
        _m(12, "end_to_end", "train", 500),
        _m(13, "end_to_end", "train", 2695, num_workers=24, pin_memory=True),
        _m(14, "end_to_end", "train", 3010, num_workers=24),
    ]
    (nxt,) = plan.next_requests(cfg, rows_from_measurements(ms), strategy="staged", cuda=True)
    assert (nxt.knobs.num_workers, nxt.knobs.pin_memory, nxt.skip) == (16, True, None)


def test_a_slow_decline_is_cut_once_out_of_the_band_of_its_peak():
    """2 % lost at each step down from 16 workers (1000, 980, 960 samples/s): 10 workers lie within the band of 12,
    the count just above, but out of the band of 16, the fastest above and the best: 8 and fewer are skipped."""
    cfg = _cfg(
        **{
            "search.num_workers": [0, 6, 8, 10, 12, 16],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
            "selection.tolerance": 0.03,
        }
    )
    ms = [_m(0, "compute", "compute", 10000), _m(1, "loader", "loader", 1200, num_workers=16)]
    ms += [
        _m(2, "loader", "loader", None, status="skipped", num_workers=w, reason="below the ceiling")
        for w in (0, 6, 8, 10, 12)
    ]
    ms += [
        _m(10, "end_to_end", "train", 1000, num_workers=16),
        _m(11, "end_to_end", "train", 300),
        _m(12, "end_to_end", "train", 980, num_workers=12),
        _m(13, "end_to_end", "train", 960, num_workers=10),
    ]
    (nxt,) = plan.next_requests(cfg, rows_from_measurements(ms), strategy="staged", cuda=False)
    assert nxt.knobs.num_workers == 8
    assert nxt.skip and "10 workers (trial 13, 960.0 samples/s) already fell out" in nxt.skip
    assert "below 16 workers (trial 10, 1000.0)" in nxt.skip


def test_loader_bisection_finds_the_fewest_workers_that_reach_the_compute_ceiling():
    """Loader ceilings of 100/s per worker against a 400/s model: the most workers reach it, so the stage bisects the
    counts, measuring 16, then 4, 2 and 3 (log2 of the counts), and skips the rest with the start it found."""
    cfg = _cfg(
        **{
            "search.num_workers": [0, 1, 2, 3, 4, 6, 8, 12, 16],
            "search.batch_size": [8],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
            "search.pin_memory": [False],
        }
    )
    rows = rows_from_measurements([_m(0, "compute", "compute", 400)])
    measured = []
    while True:
        reqs = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
        if reqs[0].stage != "loader" or reqs[0].skip:
            break
        w = reqs[0].knobs.num_workers
        measured.append(w)
        rows += rows_from_measurements([_m(len(rows), "loader", "loader", 100.0 * w, num_workers=w)])
    assert measured[0] == 16 and len(measured) <= 4 and 4 in measured and 3 in measured
    assert all("are 4 (trial" in r.skip for r in reqs)


def test_a_trial_needs_the_band_of_the_best_so_far_and_a_loader_ceiling_the_compute_ceiling():
    cfg = _cfg(**{"search.batch_size": [8]})
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 400),
            _m(1, "end_to_end", "train", 80),
            _m(2, "end_to_end", "train", 300, num_workers=8),
        ]
    )
    Knobs = rows[0].knobs.__class__
    e2e = plan.Request("end_to_end", "train", Knobs(num_workers=2, prefetch_factor=2, batch_size=8))
    assert plan.needed_rate(cfg, rows, e2e) == pytest.approx(300 * (1 - 0.03))  # quiet trials: the tolerance
    assert plan.needed_rate(cfg, rows[:1], e2e) is None  # no end-to-end trial yet
    # a loader ceiling is asked only whether it reaches the compute ceiling (400) within the tolerance
    assert plan.needed_rate(cfg, rows, plan.Request("loader", "loader", e2e.knobs)) == pytest.approx(400 * 0.97)
    assert plan.needed_rate(cfg, rows[1:], plan.Request("loader", "loader", e2e.knobs)) is None  # no ceiling yet
    assert plan.needed_rate(cfg, rows, plan.Request("compute", "compute", e2e.knobs)) is None
    # the defaults are raced like any end-to-end trial (they run after the start of the walk for that)
    assert plan.needed_rate(cfg, rows, plan.Request("end_to_end", "train", Knobs(batch_size=8))) == pytest.approx(291)
    assert plan.needed_rate(cfg, rows, plan.Request("scaling", "train", e2e.knobs)) is None


def test_user_knobs_run_at_an_input_bound_knee_and_are_skipped_at_a_compute_bound_one():
    extra = {"workload.dataset_args.sample_wait_s": {"values": [0.005, 0.001], "changes_result": False}}
    cfg = _cfg(
        **{
            "search.num_workers": [0, 8],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
            "search.extra": extra,
        }
    )
    base = [
        _m(0, "compute", "compute", 400),
        _m(1, "loader", "loader", 900, num_workers=8),
        _m(5, "loader", "loader", 60),
        _m(2, "end_to_end", "train", 80),
    ]
    bound = rows_from_measurements([*base, _m(3, "end_to_end", "train", 390, num_workers=8)])
    (req,) = plan.next_requests(cfg, bound, strategy="staged", cuda=False)
    assert req.stage == "extra" and req.skip and "the input pipeline is not the bound" in req.skip
    starved = rows_from_measurements([*base, _m(3, "end_to_end", "train", 200, num_workers=8, data_wait_frac=0.5)])
    (req,) = plan.next_requests(cfg, starved, strategy="staged", cuda=False)
    assert req.stage == "extra" and req.skip is None
    assert dict(req.knobs.extra) == {"workload.dataset_args.sample_wait_s": 0.001} and req.knobs.num_workers == 8
    faster = starved + rows_from_measurements(
        [_m(4, "extra", "train", 395, num_workers=8, extra=dict(req.knobs.extra))]
    )
    (fewer,) = plan.next_requests(cfg, faster, strategy="staged", cuda=False)
    assert (fewer.stage, fewer.knobs.num_workers, fewer.knobs.extra) == ("extra", 0, req.knobs.extra)
    threads = _cfg(
        **{
            "search.num_workers": [0, 8],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
            "search.threads": [2],
        }
    )
    (req,) = plan.next_requests(threads, starved, strategy="staged", cuda=False)
    assert (req.stage, req.knobs.threads, req.knobs.num_workers, req.skip) == ("extra", 2, 8, None)
    workers = _cfg(
        **{
            "search.num_workers": [0, 8],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
            "search.worker_threads": [2],
        }
    )
    (req,) = plan.next_requests(workers, starved, strategy="staged", cuda=False)
    assert (req.stage, req.knobs.worker_threads, req.knobs.num_workers, req.skip) == ("extra", 2, 8, None)
    grid = plan.next_requests(workers, [], strategy="grid", cuda=False)  # worker threads only where workers run
    assert sorted((r.knobs.num_workers, r.knobs.worker_threads or 0) for r in grid) == [(0, 0), (8, 0), (8, 2)]


def test_a_count_without_its_own_loader_ceiling_is_bounded_by_the_next_count_measured_above():
    cfg = _cfg(
        **{
            "search.num_workers": [0, 2, 4, 8],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
        }
    )
    rows = rows_from_measurements(
        [
            _m(0, "compute", "compute", 400),
            _m(1, "loader", "loader", 150, num_workers=4),
            _m(2, "end_to_end", "train", 400, num_workers=8),
        ]
    )
    req = _maybe_skip(
        plan.Request("end_to_end", "train", rows[0].knobs.__class__(num_workers=2, prefetch_factor=2, batch_size=8)),
        rows,
        cfg,
    )
    assert req.skip and "150.0 samples/s at 4 workers, more than 2 (trial 1)" in req.skip


def test_a_failed_loader_at_the_most_workers_hands_the_bisection_to_the_next_count():
    cfg = _cfg(
        **{
            "search.num_workers": [0, 2, 4, 8],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
        }
    )
    rows = rows_from_measurements(
        [_m(0, "compute", "compute", 400), _m(1, "loader", "loader", None, status="oom", num_workers=8)]
    )
    (req,) = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    assert (req.stage, req.knobs.num_workers, req.skip) == ("loader", 4, None)


def test_fewer_workers_after_a_user_knob_are_found_by_bisection():
    """A user knob lifts the bound at 16 workers; the walk to fewer workers bisects the smaller counts (0, 2, 4, 8,
    12) for the fewest within the band: 4, then 2, then 0 (out of the band) — three trials where a walk down one
    count at a time takes five — and stops at 2."""
    extra = {"workload.dataset_args.sample_wait_s": {"values": [0.005, 0.001], "changes_result": False}}
    cfg = _cfg(
        **{
            "search.num_workers": [0, 2, 4, 8, 12, 16],
            "search.batch_size": [8],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
            "search.extra": extra,
        }
    )
    fast = {"workload.dataset_args.sample_wait_s": 0.001}
    ms = [
        _m(0, "compute", "compute", 1000),
        _m(1, "loader", "loader", 500, num_workers=16),
        _m(2, "end_to_end", "train", 50),
        _m(3, "end_to_end", "train", 480, num_workers=16, data_wait_frac=0.4),
        _m(4, "end_to_end", "train", 350, num_workers=12, data_wait_frac=0.5),
        _m(5, "extra", "train", 900, num_workers=16, extra=fast),
    ]
    rates = {4: 890, 2: 880, 0: 600, 8: 905, 12: 900}
    asked = []
    while reqs := plan.next_requests(cfg, rows_from_measurements(ms), strategy="staged", cuda=False):
        k = reqs[0].knobs
        if reqs[0].skip:  # the end-to-end counts below 12, out of the band: recorded as the driver records them
            ms.append({**_m(len(ms), reqs[0].stage, reqs[0].mode, None, **k.to_dict()), "status": "skipped"})
            continue
        assert reqs[0].stage == "extra" and dict(k.extra) == fast
        asked.append(k.num_workers)
        ms.append(_m(len(ms), "extra", "train", rates[k.num_workers], num_workers=k.num_workers, extra=fast))
    assert asked == [4, 2, 0]
    from tunekit.analysis import working_knee

    knee = working_knee(rows_from_measurements(ms), cfg.selection)  # what the plan steers by: single runs
    assert (knee.knobs.num_workers, dict(knee.knobs.extra)) == (2, fast)


@pytest.mark.parametrize("knob_rate,rechecked", [(930, True), (700, False)])
def test_a_knobs_knee_at_a_smaller_batch_is_tried_at_the_sweeps_batch_once_the_model_is_the_bound(
    knob_rate: float, rechecked: bool
):
    """Stage 4b moved the knee from batch 16 to 8 while the loader held both back; a user knob then lifts the
    input bound. At 930 samples/s the knee reaches 97 % of batch 8's ceiling (960): the model is the bound, and
    batch 16's ceiling is higher (1000), so the knob's config is tried at 16, once. At 700 (73 %) the input
    pipeline is still the bound and no larger batch is tried."""
    extra = {"workload.dataset_args.sample_wait_s": {"values": [0.005, 0.001], "changes_result": False}}
    cfg = _cfg(
        **{
            "search.num_workers": [8],
            "search.batch_size": [8, 16],
            "search.pin_memory": [False],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
            "search.extra": extra,
        }
    )
    fast = {"workload.dataset_args.sample_wait_s": 0.001}
    ms = [
        _m(0, "compute", "compute", 1000, batch_size=16),
        _m(1, "compute", "compute", 960),
        _m(2, "loader", "loader", 500, num_workers=8, batch_size=16),
        _m(3, "end_to_end", "train", 480, num_workers=8, batch_size=16, data_wait_frac=0.4),
        _m(4, "end_to_end", "train", 50, batch_size=16),
        _m(5, "batch", "train", 485, num_workers=8),
        _m(6, "extra", "train", knob_rate, num_workers=8, extra=fast),
    ]
    rows = rows_from_measurements(ms)
    assert _finished._Finished(cfg, rows, cuda=False).batch == 16
    nxt = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
    if not rechecked:
        assert nxt == []
        return
    assert [(r.stage, r.knobs.batch_size, r.knobs.num_workers, dict(r.knobs.extra)) for r in nxt] == [
        ("extra", 16, 8, fast)
    ]
    rows += rows_from_measurements([_m(7, "extra", "train", 990, num_workers=8, batch_size=16, extra=fast)])
    assert plan.next_requests(cfg, rows, strategy="staged", cuda=False) == []  # once
    from tunekit.analysis import select_knee

    assert select_knee(rows, cfg.selection).knee.knobs.batch_size == 16  # 990 is beyond the band of 930


def test_the_baseline_is_owed_once_the_batch_is_final_and_only_by_staged_sweeps():
    cfg = _cfg(**{"search.batch_size": [8, 16]})
    half = rows_from_measurements([_m(0, "compute", "compute", 300)])  # batch 16 not measured: the batch may move
    assert plan.baseline(cfg, half, strategy="staged", cuda=False) is None
    done = half + rows_from_measurements([_m(1, "compute", "compute", 400, batch_size=16)])
    owed = plan.baseline(cfg, done, strategy="staged", cuda=False)
    assert owed is not None and owed.knobs.loader_defaults and owed.knobs.batch_size == 16
    assert plan.baseline(cfg, done, strategy="grid", cuda=False) is None
    ran = done + rows_from_measurements([_m(2, "end_to_end", "train", 80, batch_size=16)])
    assert plan.baseline(cfg, ran, strategy="staged", cuda=False) is None


def _script_cfg(tmp_path, own_batch=False, **overrides):
    raw = sleepy_config(
        **{
            "search.num_workers": [0, 2, 6, 8],
            "search.batch_size": [8],
            "search.compile": ["none"],
            "search.prefetch_factor": [2],
            **overrides,
        }
    )
    del raw["workload"]
    command = "python train.py -j {num_workers}" + ("" if own_batch else " -b {batch_size}")
    raw["script"] = {"command": command, "cwd": str(tmp_path), "own_batch": own_batch}
    return config.from_dict(raw)


def test_a_scripts_own_settings_run_after_the_walks_start_raced_against_its_band(tmp_path):
    """The script's own settings are one end-to-end trial far below the knee, as a rule: run first, before any band
    existed, it measured every window (30 of a 190 s sweep on the H200); after the walk's start it races like the
    PyTorch defaults, which the budget's last trial still gives way to it."""
    cfg = _script_cfg(tmp_path)
    rows, choice = _simulate(cfg)
    order = [(r.stage, r.knobs.num_workers) for r in rows if r.status != "skipped"]
    first_e2e = next(i for i, (stage, _) in enumerate(order) if stage == "end_to_end")
    assert order[first_e2e + 1][0] == "baseline", order  # right after the start
    assert sum(1 for stage, _ in order if stage == "baseline") == 1
    assert choice.knee is not None and choice.knee.stage != "baseline"
    before = rows[: next(i for i, r in enumerate(rows) if r.stage == "baseline")]
    (req,) = plan.next_requests(cfg, before, strategy="staged", cuda=False)
    assert req.stage == "baseline" and req.knobs.batch_size == 8
    needed = plan.needed_rate(cfg, before, req)
    assert needed is not None and needed == _finished.band_target(before, cfg.selection)  # raced
    # a budget that ends the sweep here runs the script's own settings, then nothing else
    assert plan.baseline(cfg, before, strategy="staged", cuda=False).stage == "baseline"
    at = next(i for i, r in enumerate(rows) if r.stage == "baseline")
    after = rows[: at + 1]
    # the script ran PyTorch's loader defaults (no -j given: 0 workers, unpinned): one config, one figure, so its
    # trial serves as the defaults trial and no other is owed
    assert rows[at].knobs.pytorch_defaults and plan.baseline(cfg, after, strategy="staged", cuda=False) is None
    own = rows_from_measurements([_m(at, "baseline", "train", 150.0, **{**rows[at].knobs.to_dict(), "num_workers": 2})])
    assert plan.baseline(cfg, [*before, *own], strategy="staged", cuda=False).knobs.loader_defaults  # then the defaults


def test_a_script_keeping_its_own_batch_runs_its_own_settings_first_unraced(tmp_path):
    cfg = _script_cfg(tmp_path, own_batch=True)
    (req,) = plan.next_requests(cfg, [], strategy="staged", cuda=False)
    assert req.stage == "baseline" and plan.needed_rate(cfg, [], req) is None
    grid = _script_cfg(tmp_path)
    (req,) = plan.next_requests(grid, [], strategy="grid", cuda=False)
    assert req.stage == "baseline"  # a grid measures it first too, in full


def test_the_repeats_alternate_the_scripts_own_settings_the_knee_and_the_best(tmp_path):
    """With selection.repeats 2, once the stages are done the plan measures the script's own settings (asked for as
    their first trial was: the script chose 2 workers), the knee and the best once more each, in that order, then
    again; none of them races, and the choice reads each config's three runs as one."""
    from tunekit.analysis import select

    cfg = _script_cfg(tmp_path, **{"selection.repeats": 2})
    rows: list = []
    while len(rows) < 40:
        requests = plan.next_requests(cfg, rows, strategy="staged", cuda=False)
        if not requests:
            break
        req, number = requests[0], len(rows)
        k = req.knobs.to_dict()
        if req.stage == "baseline":
            assert req.knobs == plan.next_requests(cfg, [], strategy="staged", cuda=False)[0].knobs or req.run == 0
            k["num_workers"] = 2  # what the script chose
        w = k["num_workers"]
        loader = 100.0 * w if w else 100.0
        rate = {"compute": 400.0, "loader": loader}.get(req.mode, 80.0 if not w else min(loader, 400.0) + w)
        if req.run:
            assert plan.needed_rate(cfg, rows, req) is None  # never raced
        if req.skip:
            m = {**_m(number, req.stage, req.mode, None, **k), "status": "skipped", "reason": req.skip}
        else:
            m = _m(number, req.stage, req.mode, rate * (1 + 0.004 * req.run), run=req.run, **k)
        rows += rows_from_measurements([m])
    choice = select(cfg, rows)
    knee, best = choice.knee.knobs.num_workers, choice.best.knobs.num_workers
    assert (knee, best) == (6, 8)
    assert [(r.stage, r.knobs.num_workers, r.run) for r in rows if r.run] == [
        ("baseline", 2, 1),
        ("end_to_end", 6, 1),
        ("end_to_end", 8, 1),
        ("baseline", 2, 2),
        ("end_to_end", 6, 2),
        ("end_to_end", 8, 2),
    ]
    assert len(choice.knee.runs) == 3 and choice.knee.rate == pytest.approx(406 * 1.004)


def test_a_repeat_of_a_config_the_script_ran_otherwise_is_asked_once():
    """A script that halves the workers it is given: asked 2, it ran 1. Its repeat is asked as its first trial was
    (2 workers, run 1), and once that ran (1 worker again) it is done, not asked forever."""
    cfg = config.from_dict(sleepy_config(**{"strategy": "grid", "search.num_workers": [0, 2], "selection.repeats": 1}))
    rows = rows_from_measurements(
        [
            _m(0, "grid", "train", 100, num_workers=0),
            _m(1, "grid", "train", 200, num_workers=1, asked={"num_workers": 2}),
        ]
    )
    (repeat,) = [r for r in plan.next_requests(cfg, rows, strategy="grid", cuda=False) if r.knobs.num_workers]
    assert (repeat.run, repeat.knobs.num_workers) == (1, 2)
    rows += rows_from_measurements([_m(2, "grid", "train", 196, num_workers=1, asked={"num_workers": 2}, run=1)])
    left = plan.next_requests(cfg, rows, strategy="grid", cuda=False)
    assert all(r.knobs.num_workers == 0 for r in left), left  # the 0-worker config's repeat at most


def test_every_strategy_has_one_plan_behind_the_documented_base():
    """Each ``contract.Strategy`` names one subclass of ``plan.PlanStrategy`` (the config's choices, the CLI's and
    the API's all read the enum), and an unknown name is refused naming the ones there are."""
    from tunekit.contract import Strategy
    from tunekit.plan import STRATEGIES, PlanStrategy, strategy_for

    assert set(STRATEGIES) == set(Strategy)
    for name in Strategy:
        chosen = strategy_for(name.value)
        assert isinstance(chosen, PlanStrategy) and chosen.name is name
    with pytest.raises(ValueError, match="staged, grid"):
        strategy_for("random")


def test_plan_runs_the_job_on_every_rank_then_the_knee_on_one_gpu():
    cfg = config.from_dict(sleepy_config(**{"launch.nproc_per_node": 2, "search.batch_size": [8]}))
    rows = rows_from_measurements(
        [
            measurement(0, "compute", "compute", 400, batch_size=8),
            measurement(1, "loader", "loader", 200, batch_size=8),
            measurement(2, "loader", "loader", 400, batch_size=8, num_workers=2),
        ]
    )
    first = next_requests(cfg, rows, strategy="staged", cuda=False)
    assert first[0].stage == "end_to_end" and first[0].knobs.ranks == 2 and first[0].knobs.num_workers == 2
    rows += rows_from_measurements([measurement(3, "end_to_end", "train", 700, batch_size=8, num_workers=2, ranks=2)])
    second = next_requests(cfg, rows, strategy="staged", cuda=False)  # the defaults, on every rank too
    assert second[0].knobs.ranks == 2 and second[0].knobs.loader_defaults
    rows += rows_from_measurements(
        [measurement(4, "end_to_end", "train", 300, batch_size=8, ranks=2, data_wait_frac=0.6)]
    )
    scaling = next_requests(cfg, rows, strategy="staged", cuda=False)
    assert [(r.stage, r.knobs.ranks, r.knobs.num_workers) for r in scaling] == [("scaling", 1, 2)]
    rows += rows_from_measurements([measurement(5, "scaling", "train", 380, batch_size=8, num_workers=2)])
    assert next_requests(cfg, rows, strategy="staged", cuda=False) == []


def test_a_grid_under_launch_ends_with_its_knee_on_one_gpu():
    cfg = config.from_dict(
        sleepy_config(**{"launch.nproc_per_node": 2, "search.batch_size": [8], "search.num_workers": [0, 2]})
    )
    grid = next_requests(cfg, [], strategy="grid", cuda=False)
    assert {r.knobs.ranks for r in grid} == {2} and estimate_total(cfg, [], strategy="grid", cuda=False) == 3
    rows = rows_from_measurements(
        [
            measurement(
                i,
                "grid",
                "train",
                rate,
                batch_size=8,
                ranks=2,
                num_workers=r.knobs.num_workers,
                prefetch_factor=r.knobs.prefetch_factor,
            )
            for i, (r, rate) in enumerate(zip(grid, (300, 700), strict=True))
        ]
    )
    scaling = next_requests(cfg, rows, strategy="grid", cuda=False)
    assert [(r.stage, r.knobs.ranks, r.knobs.num_workers) for r in scaling] == [("scaling", 1, 2)]
    rows += rows_from_measurements([measurement(2, "scaling", "train", 380, batch_size=8, num_workers=2)])
    assert next_requests(cfg, rows, strategy="grid", cuda=False) == []


def test_a_request_and_a_row_of_the_same_trial_have_equal_keys():
    row = rows_from_measurements([_m(0, "end_to_end", "train", 100.0)])[0]
    assert (
        row.key == Request("end_to_end", "train", row.knobs).key == Request(Stage.end_to_end, Mode.train, row.knobs).key
    )


def test_the_walk_returns_its_skips_instead_of_keeping_them():
    """The plateau above and the band below are decided by functions that return the requests to skip; the
    finished trials they read are left as they were."""
    cfg = config.from_dict(
        sleepy_config(
            **{
                "search.num_workers": [0, 1, 2, 3, 4, 5],
                "search.batch_size": [8],
                "search.pin_memory": [False],
                "search.compile": ["none"],
                "search.prefetch_factor": [2],
            }
        )
    )
    ms = [_m(0, "compute", "compute", 400), _m(1, "loader", "loader", 900, num_workers=5)]
    ms += [
        _m(10, "end_to_end", "train", 80),
        _m(11, "end_to_end", "train", 400, num_workers=1),
        _m(12, "end_to_end", "train", 401, num_workers=2),
        _m(13, "end_to_end", "train", 300, num_workers=3),
        _m(14, "end_to_end", "train", 399, num_workers=4),
    ]
    finished = _finished._Finished(cfg, rows_from_measurements(ms), cuda=False)
    before = vars(finished).copy()
    up, plateau = _walk._climb(finished, 8, [0, 1, 2, 3, 4, 5], 1)
    assert up == [1, 2, 3, 4, 5]
    assert sorted(key[2].num_workers for key in plateau) == [3, 4, 5]
    assert all("on its plateau" in reason and bound is None for reason, bound in plateau.values())
    (below,) = _walk._below_band(finished, 8, 3, [2, 1, 0]).values()  # one pin setting searched
    assert sorted(key[2].num_workers for key in below) == [0, 1, 2]
    assert all(
        "3 workers (trial 13, 300.0 samples/s) already fell out" in reason
        and "below 4 workers (trial 14, 399.0)" in reason
        and bound == (300.0, 13)
        for reason, bound in below.values()
    )  # fewer workers deliver no more than trial 13
    assert vars(finished).keys() == before.keys() and finished.rows == before["rows"]


PLATEAU = (6, 8)
"""The analytic plateau of _knee_config: 8 samples per 20 ms step cap it at 400/s; W workers at 10 ms per sample
deliver W x 100/s, so 6 and 8 workers both reach it, and 6 (the cheaper) is the knee on a quiet box."""


def _check_knee(rec: tunekit.Recommended, trials: pd.DataFrame) -> None:
    """The recommendation is on the plateau and no cheaper end-to-end config within the 5 % tolerance of the best
    is passed over without a word: each is named undecided (single runs are not shown within it beyond doubt)."""
    assert rec.num_workers in PLATEAU
    assert 0.6 * 400 <= rec.evidence["rate"] <= 400 * 1.05
    e2e = trials[(trials["mode"] == "train") & (trials["status"] == "ok")]
    floor = rec.evidence["best_rate"] * (1 - 0.05)
    cheaper = e2e[(e2e["num_workers"] < rec.num_workers) & (e2e["rate"] >= floor)]
    assert cheaper.empty or rec.evidence["undecided"], rec.evidence["reason"]


def _knee_config(**overrides) -> dict:
    base = {
        "workload.model_args": {"step_wait_s": 0.02},
        "workload.dataset_args": {"sample_wait_s": 0.01},
        "search.num_workers": [0, 2, 6, 8],
        "search.batch_size": [8],
        "search.pin_memory": [False, True],
        # windows of at least 3 steps: 0.3 s at 0 workers (100 ms a step), 12 steps at the plateau; the rates the
        # tests bound are the sleeps' (they only slow a trial down), whatever the window's length
        "trial.window_s": 0.25,
        "trial.measure_windows": 2,
        "selection.tolerance": 0.05,
    }
    base.update(overrides)
    return sleepy_config(**base)


def _sweep(config: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunekit", "sweep", str(config), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def knee_grid(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One grid sweep of the known-answer workload for the module: the grid half of the knee test reads it, the
    resume test reruns a copy of it."""
    base = tmp_path_factory.mktemp("grid")
    config = base / "cfg.yaml"
    config.write_text(yaml.safe_dump(_knee_config(**{"cost.per_hour": 3.6}), sort_keys=False))
    assert tunekit.sweep(config, out=base / "run", strategy="grid").recommendation is not None
    return {"config": config, "out": base / "run"}


@pytest.mark.slow
@pytest.mark.alone
def test_staged_and_grid_find_the_true_knee(write_config, tmp_path: Path, knee_grid: dict):
    config = write_config(_knee_config(**{"cost.per_hour": 3.6}))
    assert config.read_text() == knee_grid["config"].read_text()  # the grid below swept this same config
    staged = tunekit.sweep(config, out=tmp_path / "staged")
    assert staged.recommendation is not None, staged.reason
    rec = tunekit.load_recommended(tmp_path / "staged" / "recommended.yaml")
    trials = pd.read_csv(tmp_path / "staged" / "trials.csv")
    _check_knee(rec, trials)
    assert rec.pin_memory is False  # on the CPU pinning is not even tried
    assert rec.dataloader_kwargs() == {
        "batch_size": 8,
        "num_workers": rec.num_workers,
        "pin_memory": False,
        "prefetch_factor": 2,
        "persistent_workers": True,
    }
    assert rec.evidence["speedup_vs_defaults"] > 3.5  # 400/s against 80/s, analytically 5x
    assert list(trials["stage"].unique()) == ["compute", "loader", "end_to_end"]
    assert len(trials) == 1 + 4 + 4
    e2e = trials[trials["stage"] == "end_to_end"]
    # 6 workers, the fewest whose loader ceiling reaches the compute ceiling; the defaults; 8 to confirm
    assert list(e2e["num_workers"]) == [6, 0, 8, 2]
    skipped = e2e[e2e["status"] == "skipped"]
    assert list(skipped["num_workers"]) == [2]  # its loader ceiling (~200/s) cannot reach the ~400/s of 8 workers
    # its loader ceiling cannot reach the band, or (on a loaded box, where 6 workers read low) a count above it
    # already fell out of the band: either is evidence that 2 workers cannot be the knee
    reason = skipped.iloc[0]["reason"]
    assert "the loader alone gives" in reason or "already fell out of the band" in reason, reason
    knee = e2e[e2e["num_workers"] == rec.num_workers].iloc[0]
    assert knee["items_per_money"] == pytest.approx(knee["rate"] * 1000)  # 3600 s / 3.6 per hour
    assert knee["verdict"] == "compute-bound"  # 8 samples per 20 ms step: the model is the bound at the knee
    assert e2e[e2e["num_workers"] == 0].iloc[0]["verdict"] == "data-starved"
    assert rec.evidence["verdict"] == "compute-bound" and rec.evidence["items_per_money"] > 0
    stored = study_trials(tmp_path / "staged")
    assert len(stored) == len(trials)
    assert {t.params["num_workers"] for t in stored} == {0, 2, 6, 8}
    assert {t.user_attrs["stage"] for t in stored} == {"compute", "loader", "end_to_end"}
    for name in ("config.resolved.yaml", "env.json", "report.md"):
        assert (tmp_path / "staged" / name).exists(), name
    assert "## Recommendation" in (tmp_path / "staged" / "report.md").read_text()
    # the matmul peak once per sweep, by its first trial that runs the model; every such trial counts its FLOPs
    peaks = json.loads((tmp_path / "staged" / "env.json").read_text())["matmul_peak"]
    assert [p["trial"] for p in peaks] == list(trials[trials["stage"] == "compute"]["number"])
    assert peaks[0]["flops"] > 0 and peaks[0]["precision"] == "fp32" and peaks[0]["datasheet_flops"] is None
    ran = trials[(trials["status"] == "ok") & (trials["mode"] != "loader")]
    assert (ran["flops_per_item"] > 0).all() and (ran["flop_share"] > 0).all()
    assert "of this device's measured matmul peak" in (tmp_path / "staged" / "report.md").read_text()
    assert 0 < rec.evidence["flop_share"] < rules.MATMUL_SHARE_HIGH  # a sleeping model: the kernels' fix
    assert "channels_last" in rec.evidence["diagnosis"][0]

    grid = knee_grid["out"]
    _check_knee(tunekit.load_recommended(grid / "recommended.yaml"), pd.read_csv(grid / "trials.csv"))
    grid_trials = pd.read_csv(grid / "trials.csv")
    assert len(grid_trials) == 4 and set(grid_trials["stage"]) == {"grid"}
    assert sorted(grid_trials["num_workers"]) == [0, 2, 6, 8]  # pinning is not tried on the CPU
    grid_peaks = json.loads((grid / "env.json").read_text())["matmul_peak"]
    assert [p["trial"] for p in grid_peaks] == [grid_trials["number"].min()]  # a grid's first trial probes


@pytest.mark.slow
def test_rerun_resumes_without_repeating_and_report_rebuilds_from_the_study(
    write_config, tmp_path: Path, knee_grid: dict
):
    out = tmp_path / "run"
    shutil.copytree(knee_grid["out"], out)  # a copy of the module's finished grid sweep
    config = knee_grid["config"]
    before = [(trial_number(t), t.value) for t in study_trials(out)]
    assert len(before) == 4 and all(value for _, value in before)
    again = _sweep(config, out, "--strategy", "grid")
    assert again.returncode == 0, again.stderr
    assert [(trial_number(t), t.value) for t in study_trials(out)] == before
    changed = write_config(_knee_config(**{"cost.per_hour": 3.6, "search.batch_size": [16]}), "other.yaml")
    refused = _sweep(changed, out, "--strategy", "grid")
    assert refused.returncode == 2 and "different config" in refused.stderr
    swept = tunekit.load_recommended(out / "recommended.yaml")
    assert swept.num_workers in PLATEAU
    # the outputs come back from study.db alone
    for name in ("trials.csv", "report.md", "recommended.yaml"):
        (out / name).unlink()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(out)], capture_output=True, text=True, timeout=120
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    rebuilt_rec = tunekit.load_recommended(out / "recommended.yaml")
    assert rebuilt_rec.dataloader_kwargs() == swept.dataloader_kwargs()  # the knee the sweep chose, from the study
    assert rebuilt_rec.evidence["rate"] == swept.evidence["rate"]
    assert sorted(pd.read_csv(out / "trials.csv")["number"]) == [n for n, _ in before]
    assert "## Recommendation" in (out / "report.md").read_text()
    missing = subprocess.run(
        [sys.executable, "-m", "tunekit", "report", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "no study.db here" in missing.stderr


@pytest.mark.slow
def test_a_data_bound_knee_moves_to_a_smaller_batch_end_to_end(write_config, tmp_path: Path):
    """Stage 4b end to end. The model's step costs 10 ms whatever the batch, so the compute ceiling prefers the
    largest batch (32 -> 3200/s); but 2 workers at 5 ms per sample give 400/s at any batch. The knee (12.5 % of its
    compute ceiling) is tried at batches 16 and 8 (1600/s and 800/s alone), which keep up, and the cheapest of them
    within noise wins."""
    config = write_config(
        _knee_config(
            **{
                "workload.model_args": {"step_wait_s": 0.01},
                "workload.dataset_args": {"sample_wait_s": 0.005},
                "search.num_workers": [2],
                "search.batch_size": [8, 16, 32],
                "search.pin_memory": [False],
            }
        )
    )
    run = tunekit.sweep(config, out=tmp_path / "run")
    assert run.recommendation is not None, run.reason
    trials = pd.read_csv(tmp_path / "run" / "trials.csv")
    assert list(trials["stage"].unique()) == ["compute", "loader", "end_to_end", "batch"]
    batch = trials[trials["stage"] == "batch"]
    # 16 first, then 8 while each keeps within the band (both deliver 400/s analytically; noise may end it at 16)
    assert list(batch["batch_size"]) in ([16, 8], [16]) and set(batch["status"]) == {"ok"}
    rec = tunekit.load_recommended(tmp_path / "run" / "recommended.yaml")
    assert rec.num_workers == 2 and rec.batch_size in (8, 16, 32)
    if rec.batch_size == 32:  # only when batch 16 was not shown within the 5 % tolerance: undecided, or below it
        floor = rec.evidence["best_rate"] * (1 - 0.05)
        assert rec.evidence["undecided"] or batch.iloc[0]["rate"] < floor, rec.evidence["reason"]
    assert rec.evidence["rate"] >= 0.95 * rec.evidence["best_rate"]
    assert rec.evidence["rate"] == pytest.approx(400, rel=0.15)  # 2 workers x 200 samples/s
    report = (tmp_path / "run" / "report.md").read_text()
    # the defaults ran at the swept batch, 32: "same batch" when the knee stayed there
    same = "same batch" if rec.batch_size == 32 else "batch 32"
    assert f"PyTorch defaults (0 workers, no pinning, {same})" in report
    # batch 8 costs 4x the per-sample compute time of batch 32, yet end to end it is not slower: no "grow the batch"
    assert rec.evidence["diagnosis"] and not any("overhead-bound" in d for d in rec.evidence["diagnosis"])
    assert (tmp_path / "run" / "plots" / "workers.png").exists()


@pytest.mark.slow
def test_user_knobs_the_cheaper_data_setting_is_chosen_and_a_result_changing_one_only_reported(
    write_config, tmp_path: Path
):
    """search.extra on the known-answer workload, made input-bound (10 ms per sample, a 10 ms step of 8: 4 workers
    give 400/s against the model's 800/s). A dataset argument that only changes the per-sample cost (2 ms instead of
    10) lifts the knee to the model's ceiling: it is chosen, and fewer workers are tried with it. A knob declared to
    change the training result is measured and reported, never chosen."""
    config = write_config(
        _knee_config(
            **{
                "workload.model_args": {"step_wait_s": 0.01},
                "search.num_workers": [0, 2, 4],
                "search.pin_memory": [False],
                "search.extra": {
                    "workload.dataset_args.sample_wait_s": {"values": [0.01, 0.002], "changes_result": False},
                    "workload.dataset_args.num_classes": {"values": [10, 5], "changes_result": True},
                },
            }
        )
    )
    done = tunekit.sweep(config, out=tmp_path / "run")
    assert done.recommendation is not None, done.reason
    rec = tunekit.load_recommended(tmp_path / "run" / "recommended.yaml")
    assert rec.config == {"workload.dataset_args.sample_wait_s": 0.002}  # the cheaper per-sample cost
    trials = pd.read_csv(tmp_path / "run" / "trials.csv")
    extra = trials[trials["stage"] == "extra"]
    assert set(extra["status"]) == {"ok"} and len(extra) >= 3  # each other value at the knee, then fewer workers
    other = extra[extra["workload.dataset_args.num_classes"] == 5]
    assert len(other) == 1 and other.iloc[0]["changes_result"] == "workload.dataset_args.num_classes"
    assert set(trials["workload.dataset_args.sample_wait_s"]) == {0.01, 0.002}
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Your knobs" in report and "reported, not chosen" in report
    assert "`workload.dataset_args.sample_wait_s: 0.002`" in report
    assert "→ dataset_args.sample_wait_s=0.002: " in report  # the verdict before the knob, and what it gave
    stored = study_trials(tmp_path / "run")
    assert {t.params["extra:workload.dataset_args.num_classes"] for t in stored} == {10, 5}
