"""What a trial of each mode does, for both runners: the factory's built-in step (``factory/``) and the script's
own loop (``script/``). One object per ``contract.Mode``, chosen once per trial by :func:`trial_mode`; the runners ask
it how to build, step and record, and no other worker module compares modes (``tests/test_layers.py`` keeps it so).

* build: whether the model is wrapped for the trial's ranks, the knobs its loader runs with;
* step: whether one batch is staged on the device and stepped again and again (the compute ceiling), whether the
  step trains or only copies the batch to the device (the loader ceiling), whether epoch boundaries are measured
  apart, whether a training loader the script builds anew is followed;
* record: the batches the trial read from its data, whether the input work on the device counts as the job's.
"""

from __future__ import annotations

from typing import ClassVar

from tunekit.contract import Knobs, Mode

__all__ = ["TrialMode", "trial_mode"]


class TrialMode:
    """The contract of a trial mode. Subclasses set the class attributes and override the methods that differ."""

    mode: ClassVar[Mode]
    end_to_end: ClassVar[bool] = False
    """The job as it trains: the loader's batches into the training step, the model wrapped for the trial's ranks
    (DDP), the dataset's own input work on the device part of the step, a loader built anew each epoch followed."""
    staged: ClassVar[bool] = False
    """One batch staged on the device before warm-up, stepped again and again: the loader stands aside (no
    workers, no fill, no epochs)."""
    trains: ClassVar[bool] = True
    """The step is the training step; otherwise the batch's host-to-device copy alone."""

    def loader_knobs(self, knobs: Knobs) -> Knobs:
        """The knobs the trial's loader runs with."""
        return knobs

    def fill(self, workers: int, prefetch_factor: int | None, queued: int = 0) -> int:
        """Batches the loader's workers (and a stream ahead, ``queued``) hold before the first window: set aside."""
        return 0 if self.staged else workers * (prefetch_factor or 2) + queued

    @property
    def epoch_aware(self) -> bool:
        """Whether epoch boundaries can fall inside the trial, to be measured apart from the steady rate."""
        return not self.staged

    def batches_read(self, consumed: int) -> int:
        """Batches the trial read from its data, of the ``consumed`` its steps ran on."""
        return 1 if self.staged else consumed


class _Train(TrialMode):
    mode = Mode.train
    end_to_end = True


class _Compute(TrialMode):
    mode = Mode.compute
    staged = True

    def loader_knobs(self, knobs: Knobs) -> Knobs:
        # the staged batch is made once: no loader workers may compete with the model for the CPUs
        return knobs.without_workers()


class _Loader(TrialMode):
    mode = Mode.loader
    trains = False


_MODES: dict[Mode, TrialMode] = {m.mode: m for m in (_Train(), _Compute(), _Loader())}


def trial_mode(mode: Mode | str) -> TrialMode:
    """The object of ``mode`` (a ``Mode`` or its word)."""
    return _MODES[Mode(mode)]
