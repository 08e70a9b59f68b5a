"""Selection with a target effective batch (summarize), on fixtures."""

from __future__ import annotations

from tests.conftest import sleepy_config
from tests.test_plan import _m
from tunekit import config
from tunekit.analysis import rows_from_measurements
from tunekit.report import summarize


def _cfg():
    return config.from_dict(sleepy_config(**{"search.batch_size": [64, 128, 256],
                                             "search.target_effective_batch": 256}))


def test_target_with_one_fitting_micro_batch_still_recommends():
    rows = rows_from_measurements([_m(0, "compute", "compute", 900, batch_size=64),
                                   _m(1, "compute", "compute", None, status="oom", batch_size=128),
                                   _m(2, "accumulation", "train", 700, batch_size=64, grad_accum=4, num_workers=4)])
    s = summarize(_cfg(), rows, strategy="staged")
    assert s.knee.knee is not None and (s.knee.knee.knobs.batch_size, s.knee.knee.knobs.grad_accum) == (64, 4)


def test_target_never_reached_gives_no_recommendation():
    rows = rows_from_measurements([_m(0, "end_to_end", "train", 700, batch_size=64, num_workers=4),
                                   _m(1, "end_to_end", "train", 300, batch_size=64)])
    s = summarize(_cfg(), rows, strategy="staged")
    assert s.knee.knee is None and "target_effective_batch = 256" in s.knee.reason
