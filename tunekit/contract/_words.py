"""The closed sets of words the files hold: the plan's stages and the trials' modes, each a ``str`` enum whose
members say what they imply."""

from __future__ import annotations

from enum import Enum


class _Word(str, Enum):
    """A closed set of words that files hold as plain strings: a member is the str itself, so JSON, optuna's user
    attributes, CSV and f-strings see its value; an unknown word is a ValueError naming the ones there are."""

    # Python 3.11 formats a mixed-in enum as ``Stage.compute``; the files and the console want the word
    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def _missing_(cls, value: object) -> None:
        raise ValueError(f"{value!r} is not a {cls.__name__.lower()}: one of {', '.join(m.value for m in cls)}")


class Stage(_Word):
    """The plan stage that asked for a trial (docs/plan.md). The staged plan runs the first ten in this order
    (``baseline`` only in script mode: the user's script run with its own settings, ``launcher.script_command``);
    ``grid`` is the grid plan's one stage, ``single`` a ``tunekit trial``."""

    baseline = "baseline"
    compute = "compute"
    loader = "loader"
    end_to_end = "end_to_end"
    prefetch = "prefetch"
    batch = "batch"
    compile = "compile"
    extra = "extra"
    accumulation = "accumulation"
    scaling = "scaling"
    grid = "grid"
    single = "single"

    @property
    def knee(self) -> bool:
        """Whether its trials run the job end to end and may be chosen as the knee: not the ceilings, not the
        scaling trial (the knee's config on one GPU: another job), not a lone trial, not a script's own baseline
        (it runs the script's settings, not its knobs)."""
        return self not in (Stage.compute, Stage.loader, Stage.scaling, Stage.single, Stage.baseline)

    @property
    def raced(self) -> bool:
        """Whether its trials stop measuring once clearly below the band of the best knee candidate so far: every
        knee stage but ``accumulation``, whose trials are judged among themselves, against the target effective
        batch; and a script's own baseline, which a staged sweep runs after the start of its end-to-end walk (as the
        PyTorch defaults are; a baseline stops below the band only once its figure can carry a gain,
        ``TrialSpec.baseline``)."""
        return (self.knee and self is not Stage.accumulation) or self is Stage.baseline


class Mode(_Word):
    """What a trial measures."""

    train = "train"
    """The job end to end: the loader feeding the training step."""
    compute = "compute"
    """The model alone on one batch staged on the device: the compute ceiling."""
    loader = "loader"
    """The loader alone, with its host-to-device copy: the loader ceiling."""

    @property
    def ceiling(self) -> bool:
        """Whether the trial measures a bound (the model or the loader alone), not a config to choose."""
        return self is not Mode.train


class Strategy(_Word):
    """How a sweep plans its trials (docs/plan.md): the stages in order, or every combination of the search."""

    staged = "staged"
    """The staged plan: ceilings, the end-to-end walk, the refinements, the repeats."""
    grid = "grid"
    """Every combination of the search space once (a script's own settings first)."""
