"""The plan's stages and the trials' modes: one enum each (``contract.Stage``, ``contract.Mode``), whose members are
the plain words every file holds, and the plan's skip decisions as values, not state."""

from __future__ import annotations

import functools
import io
import json

import pytest
import yaml

from tests.conftest import measurement, sleepy_config
from tunekit import config, rules
from tunekit.analysis import trials_frame
from tunekit.contract import Knobs, Measurement, Mode, Stage, TrialSpec, skipped_measurement
from tunekit.plan import Request, _finished, _staged, _walk
from tunekit.records import TrialRow, rows_from_measurements

_m = functools.partial(measurement, batch_size=8)


def test_the_enums_hold_what_the_parallel_lists_held():
    assert rules.KNEE_STAGES == ("end_to_end", "prefetch", "batch", "compile", "extra", "accumulation", "grid")
    assert tuple(s for s in Stage if s.raced) == (
        "baseline",
        "end_to_end",
        "prefetch",
        "batch",
        "compile",
        "extra",
        "grid",
    )
    assert tuple(m for m in Mode if m.ceiling) == ("compute", "loader")
    assert rules.knee_stages(Stage.compile) == ("end_to_end", "prefetch", "batch")
    # the staged plan walks its stages in the enum's order (a script's own baseline is planned inside end_to_end)
    # (the repeats, None, keep the stage of what they repeat)
    assert [stage for stage, _ in _staged.STAGES if stage is not None] == [
        s for s in Stage if s not in (Stage.grid, Stage.single, Stage.baseline)
    ]


def test_a_member_is_its_word_in_every_writer():
    spec = TrialSpec(number=1, stage="end_to_end", mode="train", knobs=Knobs(), config={})
    assert spec.stage is Stage.end_to_end and spec.mode is Mode.train  # the words given are parsed
    assert f"{spec.stage:<11}|{spec.mode}" == "end_to_end |train" and str(Stage.batch) == "batch"
    assert json.loads(json.dumps(spec.to_dict()))["stage"] == "end_to_end"
    measured = skipped_measurement(spec, "why").to_dict()
    assert type(measured["stage"]) is str and type(measured["mode"]) is str
    assert "end_to_end" in yaml.safe_dump(spec.to_dict()) and "stage: end_to_end" in yaml.safe_dump(measured)
    rows = rows_from_measurements([measured])
    buf = io.StringIO()
    trials_frame(rows).to_csv(buf, index=False)
    assert buf.getvalue().splitlines()[1].startswith("1,end_to_end,train,")


def test_a_word_no_stage_has_is_an_error_where_records_are_read():
    with pytest.raises(ValueError, match="'endtoend' is not a stage: one of baseline, compute, loader, end_to_end"):
        rows_from_measurements([_m(0, "endtoend", "train", 100.0)])
    with pytest.raises(ValueError, match="'training' is not a mode"):
        TrialRow.from_measurement(Measurement.from_dict(_m(0, "end_to_end", "training", 100.0)))
    with pytest.raises(ValueError, match="not a stage"):
        TrialSpec.from_dict({"number": 0, "stage": "test", "mode": "train", "knobs": {}, "config": {}})
    with pytest.raises(ValueError, match="not a mode"):
        Request(Stage.end_to_end, "trian", Knobs())


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
    ]
    finished = _finished._Finished(cfg, rows_from_measurements(ms), cuda=False)
    before = vars(finished).copy()
    up, plateau = _walk._climb(finished, 8, [0, 1, 2, 3, 4, 5], 1)
    assert up == [1, 2, 3, 4, 5]
    assert sorted(key[2].num_workers for key in plateau) == [3, 4, 5]
    assert all("on its plateau" in reason and bound is None for reason, bound in plateau.values())
    below = _walk._below_band(finished, 8, 3, [2, 1, 0])
    assert sorted(key[2].num_workers for key in below) == [0, 1, 2]
    assert all(
        "3 workers (trial 13, 300.0 samples/s) already fell out" in reason and bound == (300.0, 13)
        for reason, bound in below.values()
    )  # fewer workers deliver no more than trial 13
    assert vars(finished).keys() == before.keys() and finished.rows == before["rows"]
