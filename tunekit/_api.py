"""The Python API: ``tunekit.sweep(...)`` and ``tunekit.trial(...)``. The CLI's ``sweep`` and ``trial`` are thin
wrappers around these two functions, so both check the same values and write the same outputs.

Factories may be given as callables instead of import paths: one defined at the top level of an importable module
becomes ``module:attr``; one defined in the script being run becomes ``path/to/script.py:attr``, which the trial
process loads by path (so the script's ``if __name__ == "__main__":`` block does not run there).

Both functions work from any thread: they install no signal handlers (the CLI's main thread does, so that SIGTERM
and SIGHUP end a run as Ctrl-C does). A KeyboardInterrupt while a trial runs kills its process tree.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunekit import config as config_mod
from tunekit.config import Config
from tunekit.contract import WORKER_ONLY, Knobs, Measurement, Mode, Strategy, TrialSpec
from tunekit.errors import UsageError
from tunekit.recommended import Recommended, load_recommended

__all__ = ["sweep", "trial", "SweepOutcome", "TrialOutcome", "MODES", "knobs_markdown"]

MODES = tuple(m.value for m in Mode)
"""What one trial measures: train (end to end), compute (the step on a batch staged on the device: the compute
ceiling), loader (the loader alone, with its host-to-device copy: the loader ceiling)."""

_SEARCHED = {
    "num_workers": "search.num_workers",
    "prefetch_factor": "search.prefetch_factor",
    "pin_memory": "search.pin_memory",
    "batch_size": "search.batch_size",
    "grad_accum": "search.grad_accum",
    "compile": "search.compile",
    "threads": "search.threads",
    "worker_threads": "search.worker_threads",
}
"""A knob fixed for a whole sweep: its search list becomes that one value."""


def knobs_markdown() -> str:
    """The knobs as the README lists them (between its ``<!-- knobs -->`` markers), from ``config.KNOB_HELP``."""
    return "\n".join(f"- `{key}`: {help}" for key, help in config_mod.KNOB_HELP.items())


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
    summary: Any = None
    """The run's summary (``tunekit.report.RunSummary``): what report.md and the console table render."""


@dataclass(frozen=True)
class TrialOutcome:
    """One trial's measurement (measurement.json as a record) and its folder."""

    measurement: Measurement
    trial_dir: Path

    @property
    def ok(self) -> bool:
        return self.measurement.status == "ok"


def _budget(budget_min: float | None) -> float | None:
    if budget_min is not None and not budget_min > 0:
        raise UsageError(
            f"budget of {budget_min:g} minutes (--budget-min, budget_min): must be more than 0; leave it "
            "out for the config's budget.minutes"
        )
    return budget_min


def fixed_knobs(knobs: dict[str, Any] | None) -> dict[str, Any]:
    """A sweep's fixed knobs as config overrides (each knob's search list becomes its one value)."""
    chosen = config_mod.check_knobs(dict(knobs or {}))
    if "ranks" in chosen:
        raise UsageError(
            "knobs: ranks: a sweep's ranks come from its launch section (launch.nproc_per_node); "
            "tunekit trial runs one trial at 1 rank or all of them"
        )
    return {_SEARCHED[key]: [value] for key, value in chosen.items()}


def sweep(
    config: str | os.PathLike[str] | dict[str, Any],
    *,
    out: str | os.PathLike[str] | None = None,
    budget_min: float | None = None,
    strategy: str | None = None,
    overrides: dict[str, Any] | None = None,
    knobs: dict[str, Any] | None = None,
    resume: bool = True,
    quiet: bool = True,
    storage: str | None = None,
    join: bool = False,
) -> SweepOutcome:
    """Run (or resume) a sweep, as ``tunekit sweep``, and return what it found.

    Args:
        config: a config file, or the config as a mapping (callables allowed where import paths go).
        out: the run folder (default ``results/<name>``).
        budget_min: wall-clock budget in minutes, more than 0 (default ``budget.minutes``).
        strategy: ``staged`` or ``grid`` (default the config's).
        overrides: dotted config keys to set first, e.g. ``{"trial.window_s": 5}``.
        knobs: knobs to hold at one value for the whole sweep, e.g. ``{"pin_memory": True}`` (each one's search
            list becomes that value; the knobs are listed in ``tunekit.config.KNOB_HELP``).
        resume: keep the finished trials of an earlier sweep in the same folder (or database).
        quiet: no progress bar or trial log.
        storage: a database URL for the run's studies (the config's ``storage``), e.g.
            ``postgresql://USER:PASSWORD@HOST/DB``; its password is never written or shown.
        join: take trials of a sweep that another machine of the same type started in ``storage``.

    Raises:
        ConfigError, UsageError: a bad config, value, run folder or storage URL (one line each).
        StorageError: the database cannot be reached, or refuses.
    """
    if strategy is not None and strategy not in tuple(Strategy):
        raise UsageError(f"strategy={strategy!r}: choose one of: {', '.join(s.value for s in Strategy)}")
    minutes = _budget(budget_min)
    from tunekit.launch import resolve_paths  # through the fork server the sweep's trials then use

    given = {**(overrides or {}), **fixed_knobs(knobs), **({"storage": storage} if storage else {})}
    cfg = config_mod.load(config, overrides=given, resolve=resolve_paths)
    return sweep_config(cfg, out=out, budget_min=minutes, strategy=strategy, resume=resume, quiet=quiet, join=join)


def sweep_config(
    cfg: config_mod.Config,
    *,
    out: str | os.PathLike[str] | None = None,
    budget_min: float | None = None,
    strategy: str | None = None,
    resume: bool = True,
    quiet: bool = True,
    seed: Sequence[Measurement] = (),
    join: bool = False,
) -> SweepOutcome:
    """:func:`sweep` of a config already loaded; ``seed`` holds finished trials measured elsewhere, recorded first
    in a run that holds none yet (``tunekit check --retune``: the reused ceilings and the check's own trial)."""
    import pandas as pd

    from tunekit.driver import run_sweep

    minutes = _budget(budget_min)
    run_dir = Path(out or Path("results") / cfg.name)
    cfg, storage = _storage_apart(cfg, join)
    result = run_sweep(
        cfg,
        run_dir,
        strategy=strategy or cfg.strategy,
        budget_minutes=minutes if minutes is not None else cfg.budget.minutes,
        resume=resume,
        quiet=quiet,
        seed=seed,
        storage=storage,
        join=join,
    )
    rec_path = run_dir / "recommended.yaml"
    return SweepOutcome(
        run_dir,
        load_recommended(rec_path) if rec_path.exists() else None,
        pd.read_csv(run_dir / "trials.csv"),
        result.summary.choice.reason,
        result.interrupted,
        result.summary,
    )


def _storage_apart(cfg: Config, join: bool) -> tuple[Config, str | None]:
    """The config as the run records it (its storage URL without the password) and the URL to connect with.

    Raises:
        UsageError: a malformed URL, another scheme, its driver missing, or ``join`` without a URL.
    """
    if cfg.storage is None:
        if join:
            raise UsageError(
                "--join takes trials of a sweep in a shared database: give its URL (--storage URL, or storage: in "
                "the config)"
            )
        return cfg, None
    from tunekit import store

    url = store.parse_url(cfg.storage)
    return dataclasses.replace(cfg, storage=url.recorded), cfg.storage


def trial(
    config: str | os.PathLike[str] | dict[str, Any],
    *,
    knobs: dict[str, Any] | None = None,
    mode: str = Mode.train.value,
    out: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
    on_start: Callable[[int, Any, Any], None] | None = None,
) -> TrialOutcome:
    """Run exactly one trial, as ``tunekit trial``.

    Args:
        config: a config file, or the config as a mapping.
        knobs: the knobs to run, checked as ``--set`` checks them (the knobs are listed in
            ``tunekit.config.KNOB_HELP``); the rest are the first value of each ``search`` list.
        mode: ``train`` (end to end), ``compute`` (the step on a batch staged on the device) or ``loader`` (the
            loader alone).
        out: the folder (default ``results/<name>-trial``).
        overrides: dotted config keys to set first.
        on_start: called as ``on_start(number, knobs, config)`` once the trial's folder is held (``knobs`` None:
            a script run with no knob given runs its own settings).

    Raises:
        ConfigError, UsageError: a bad config, knob value, mode or folder (one line each).
    """

    if mode not in MODES:
        raise UsageError(f"mode={mode!r}: choose one of: {', '.join(MODES)}")
    chosen = config_mod.check_knobs(dict(knobs or {}))
    from tunekit.launch import resolve_paths

    cfg = config_mod.load(config, overrides=overrides, resolve=resolve_paths)
    run = first_knobs(cfg, **chosen)
    own = cfg.own_settings and not chosen  # a script alone runs its own settings, not the search's first
    measurement, trial_dir = run_single(
        cfg,
        run,
        mode,
        Path(out or Path("results") / f"{cfg.name}-trial"),
        announce=lambda number: on_start(number, None if own else run, cfg) if on_start else None,
        own=own,
    )
    return TrialOutcome(measurement, trial_dir)


_KNOBS_DOC = "\n".join(f"        {key}: {help}" for key, help in config_mod.KNOB_HELP.items())
for _function in (sweep, trial):  # the knobs listed once (config.KNOB_HELP), rendered into both docstrings
    _function.__doc__ = f"{_function.__doc__}\n    Knobs:\n{_KNOBS_DOC}\n"


def first_knobs(cfg: Config, **chosen: Any) -> Knobs:
    """The knobs of a single trial: ``chosen`` ones, the rest the first value of each search list (and the config's
    ranks: ``launch`` runs the job on every rank)."""
    s = cfg.search
    world = cfg.launch.world
    if chosen.get("ranks", world) not in (1, world):
        raise UsageError(
            f"ranks={chosen['ranks']}: {cfg.source} launches {world} rank(s) (launch.nproc_per_node x "
            f"launch.nnodes); choose {'1 or ' if world > 1 else ''}{world}"
        )
    if chosen.get("num_workers", s.num_workers[0]) == 0:  # asked for, these need workers: said, not dropped
        given = [f"{k}={chosen[k]}" for k in WORKER_ONLY if chosen.get(k) is not None]
        if given:
            raise UsageError(
                f"{', '.join(given)}: a loader without workers has none (num_workers=0); set num_workers too"
            )
    first = {
        "num_workers": s.num_workers[0],
        "prefetch_factor": s.prefetch_factor[0],
        "pin_memory": s.pin_memory[0],
        "batch_size": s.batch_size[0],
        "grad_accum": s.grad_accum[0],
        "compile": s.compile[0],
        "ranks": world,
    }
    return Knobs.of(**{**first, **chosen})


def run_single(
    cfg: Config,
    knobs: Knobs,
    mode: str,
    out: Path,
    announce: Callable[[int], None] = lambda number: None,
    own: bool = False,
) -> tuple[Measurement, Path]:
    """Exactly one trial into ``out/trials/<n>/`` (``tunekit trial``): its measurement and its folder. A sweep's run
    folder is refused (a resumed sweep would reuse the number). ``announce(number)`` runs once the folder is held.
    ``own``: a script's own settings (stage ``baseline``: no knob filled in or set on its loader)."""
    import yaml

    from tunekit import store
    from tunekit._files import write_text_atomic
    from tunekit.launch import lock_run, run_trial

    with lock_run(out):  # no other sweep or trial writes here meanwhile
        if (out / store.STUDY_FILE).exists():
            raise UsageError(
                f"{out}: a sweep's run folder (it holds {store.STUDY_FILE}), whose trial numbers a "
                "resumed sweep would reuse; give the trial another --out"
            )
        trials = out / "trials"
        number = max((int(p.name) for p in trials.glob("*") if p.name.isdigit()), default=-1) + 1
        write_text_atomic(out / "config.resolved.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        spec = TrialSpec(
            number=number, stage="baseline" if own else "single", mode=mode, knobs=knobs, config=cfg.to_dict()
        )
        announce(number)
        result = run_trial(spec, trials / str(number), cfg.trial.timeout_s)
        return result, trials / str(number)
