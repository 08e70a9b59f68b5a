"""spec.json as a typed record: everything a trial's worker needs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tunekit.contract._knobs import Knobs
from tunekit.contract._words import Mode, Stage


@dataclass(kw_only=True)
class TrialSpec:
    """Everything a trial worker needs; written to trials/<n>/spec.json by the launcher."""

    number: int
    """Trial number within the run."""
    stage: Stage
    """Sweep stage that asked for this trial (``single`` for ``tunekit trial``)."""
    mode: Mode
    """train (end to end), compute (model on a pre-staged device batch) or loader (the loader alone)."""
    knobs: Knobs
    """The settings under test."""
    config: dict[str, Any]
    """The resolved config (Config.to_dict())."""
    needed: float | None = None
    """The throughput (all ranks) this trial must reach to come within the band of the best config so far; with
    trial.precision it stops measuring once its windows' interval lies wholly below (None: no such bound)."""
    probe_peak: bool = False
    """Measure the device's matmul peak after the windows (``Measurement.matmul_peak_flops``): the driver asks it of
    the sweep's first one-rank compute or end-to-end trial, and of the next ones until a figure is recorded."""
    run: int = 0
    """0 for a config's first measurement; k for its k-th repeat (the plan's repeats of the configs a decision rests
    on, run in alternation with each other: the run-to-run spread). A repeat keeps its config's stage."""

    def __post_init__(self) -> None:
        # callers may pass the words (``tunekit trial --mode``); a typo is an error here, not in the trial
        self.stage, self.mode = Stage(self.stage), Mode(self.mode)

    @property
    def baseline(self) -> bool:
        """A sweep's trial every gain is measured against: a script's own settings (stage ``baseline``) or PyTorch's
        defaults trained in a raced stage (``Knobs.pytorch_defaults``: the end-to-end walk's, a grid's);
        it races the band only to a precise enough figure (``rules.window_stop``)."""
        return self.stage == Stage.baseline or (
            self.stage.raced and self.mode == Mode.train and self.knobs.pytorch_defaults
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["knobs"] = self.knobs.to_dict()
        data["stage"], data["mode"] = self.stage.value, self.mode.value  # plain words: YAML refuses an Enum
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        return cls(
            number=data["number"],
            stage=Stage(data["stage"]),
            mode=Mode(data["mode"]),
            knobs=Knobs(**data["knobs"]),
            config=data["config"],
            needed=data.get("needed"),
            probe_peak=bool(data.get("probe_peak", False)),
            run=int(data.get("run", 0)),
        )
