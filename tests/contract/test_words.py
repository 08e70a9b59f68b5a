"""The plan's stages and the trials' modes (tunekit/contract/_words.py): one enum each (``contract.Stage``,
``contract.Mode``), whose members are the plain words every file holds."""

from __future__ import annotations

import functools
import io
import json

import pytest
import yaml

from tests.conftest import measurement
from tunekit import rules
from tunekit.analysis import trials_frame
from tunekit.contract import Knobs, Measurement, Mode, Stage, TrialSpec, skipped_measurement
from tunekit.plan import Request, _staged
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
