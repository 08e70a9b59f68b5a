"""contract.Knobs: a bad value is refused, naming the field; the values a search gives are made into knobs by
``Knobs.of`` alone."""

from __future__ import annotations

import pytest

from tunekit.contract import WORKER_ONLY, Knobs, TrialSpec


@pytest.mark.parametrize("field", WORKER_ONLY)
def test_a_worker_only_knob_without_workers_is_refused_naming_it(field: str):
    with pytest.raises(ValueError, match=rf"Knobs\.{field} = 2 with num_workers = 0"):
        Knobs(num_workers=0, **{field: 2})
    assert getattr(Knobs(num_workers=3, **{field: 2}), field) == 2  # with workers it is kept as given


def test_of_leaves_the_worker_only_knobs_out_without_workers():
    """A search's first prefetch factor beside 0 workers: one trial, not one per prefetch factor."""
    made = Knobs.of(num_workers=0, prefetch_factor=4, worker_threads=2, batch_size=8)
    assert made == Knobs(num_workers=0, batch_size=8)
    assert Knobs.of(num_workers=2, prefetch_factor=4).prefetch_factor == 4
    assert Knobs(num_workers=2, prefetch_factor=4, worker_threads=1).without_workers() == Knobs()


def test_a_spec_file_with_a_bad_knob_is_refused_not_rewritten():
    data = TrialSpec(number=0, stage="single", mode="train", knobs=Knobs(), config={}).to_dict()
    data["knobs"]["prefetch_factor"] = 2
    with pytest.raises(ValueError, match="prefetch_factor"):
        TrialSpec.from_dict(data)


def test_a_single_trial_asked_for_prefetch_without_workers_is_one_line(tmp_path):
    """``tunekit trial --set num_workers=0 --set prefetch_factor=4``: said, not silently dropped."""
    from tests.conftest import sleepy_config
    from tunekit._api import first_knobs
    from tunekit.config import from_dict
    from tunekit.errors import UsageError

    cfg = from_dict(sleepy_config())
    with pytest.raises(UsageError, match=r"prefetch_factor=4: a loader without workers has none"):
        first_knobs(cfg, num_workers=0, prefetch_factor=4)
    assert first_knobs(cfg, num_workers=0).prefetch_factor is None  # the search's first factor left out
