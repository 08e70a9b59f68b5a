"""The Python API: ``tunekit.sweep(...)`` and ``tunekit.trial(...)``, the same runs and outputs as the CLI.

Factories may be given as callables instead of import paths: one defined at the top level of an importable module
becomes ``module:attr``; one defined in the script being run becomes ``path/to/script.py:attr``, which the trial
process loads by path (so the script's ``if __name__ == "__main__":`` block does not run there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunekit import config as config_mod
from tunekit.contract import KNOB_NAMES, Measurement
from tunekit.errors import UsageError
from tunekit.recommended import Recommended, load_recommended

__all__ = ["sweep", "trial", "SweepOutcome", "TrialOutcome"]


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep found, and where its outputs are."""

    run_dir: Path
    recommendation: Recommended | None
    """recommended.yaml as loaded by :func:`tunekit.load_recommended`; None when there is no recommendation."""
    trials: Any
    """trials.csv as a pandas DataFrame."""
    reason: str
    """Why the knee is the knee, or why there is none."""
    interrupted: bool


@dataclass(frozen=True)
class TrialOutcome:
    """One trial's measurement (measurement.json as a :class:`tunekit.contract.Measurement`) and its folder."""

    measurement: Measurement
    trial_dir: Path

    @property
    def ok(self) -> bool:
        return self.measurement.status == "ok"


def sweep(config: str | os.PathLike[str] | dict[str, Any], *, out: str | os.PathLike[str] | None = None,
          budget_min: float | None = None, strategy: str | None = None, overrides: dict[str, Any] | None = None,
          resume: bool = True, quiet: bool = True) -> SweepOutcome:
    """Run (or resume) a sweep, as ``tunekit sweep``, and return what it found.

    Args:
        config: a config file, or the config as a mapping (callables allowed where import paths go).
        out: the run folder (default ``results/<name>``).
        budget_min: wall-clock budget in minutes (default ``budget.minutes``).
        strategy: ``staged`` or ``grid`` (default the config's).
        overrides: dotted config keys to set first, e.g. ``{"trial.window_s": 5}``.
        resume: keep the finished trials of an earlier sweep in the same folder.
        quiet: no progress bar.

    Raises:
        ConfigError, UsageError: a bad config or run folder (one line each).
    """
    import pandas as pd

    from tunekit.driver import run_sweep

    if strategy not in (None, "staged", "grid"):
        raise UsageError(f"strategy={strategy!r}: choose staged or grid")
    cfg = config_mod.load(config, overrides=overrides)
    run_dir = Path(out or Path("results") / cfg.name)
    result = run_sweep(cfg, run_dir, strategy=strategy or cfg.strategy,
                       budget_minutes=budget_min or cfg.budget.minutes, resume=resume, quiet=quiet)
    rec_path = run_dir / "recommended.yaml"
    return SweepOutcome(run_dir, load_recommended(rec_path) if rec_path.exists() else None,
                        pd.read_csv(run_dir / "trials.csv"), result.summary.choice.reason, result.interrupted)


def trial(config: str | os.PathLike[str] | dict[str, Any], *, knobs: dict[str, Any] | None = None,
          mode: str = "train", out: str | os.PathLike[str] | None = None,
          overrides: dict[str, Any] | None = None) -> TrialOutcome:
    """Run exactly one trial, as ``tunekit trial``.

    Args:
        config: a config file, or the config as a mapping.
        knobs: the knobs to run (num_workers, prefetch_factor, pin_memory, batch_size, grad_accum, compile); the
            rest come from the first value of each ``search`` list.
        mode: ``train`` (end to end), ``compute`` (model on a staged batch) or ``loader`` (the loader alone).
        out: the folder (default ``results/<name>-trial``).
        overrides: dotted config keys to set first.
    """
    from tunekit.driver import first_knobs, run_single

    if mode not in ("train", "compute", "loader"):
        raise UsageError(f"mode={mode!r}: choose train, compute or loader")
    unknown = sorted(set(knobs or {}) - set(KNOB_NAMES))
    if unknown:
        raise UsageError(f"knobs: unknown {', '.join(unknown)}; allowed: {', '.join(KNOB_NAMES)}")
    cfg = config_mod.load(config, overrides=overrides)
    measurement, trial_dir = run_single(cfg, first_knobs(cfg, **(knobs or {})), mode,
                                        Path(out or Path("results") / f"{cfg.name}-trial"))
    return TrialOutcome(measurement, trial_dir)
