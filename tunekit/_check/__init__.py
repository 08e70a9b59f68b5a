"""``tunekit check``: keep a committed recommended.yaml true as the pipeline, the code and the machine change.

One full-fidelity trial of the committed config, through :func:`tunekit.trial` (the path of ``tunekit trial``),
compared with the figures the file records by a one-sided test (``rules.check_test``); the machine it was
tuned on compared with this one first (``env.machine_fingerprint``, ``rules.machine_changes``): on another machine
the recorded figure does not apply, and no trial runs. ``retune``: a sweep on a search narrowed around the
committed knee (``plan.retune_search``), seeded with the check's own trial and, on the same machine, the ceilings
of the sweep that wrote the file, writing ``recommended.retuned.yaml`` beside it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunekit import _api, plan, rules
from tunekit import config as config_mod
from tunekit._check._retune import Change, RetuneOutcome, _ceilings, _with_retune
from tunekit._files import read_json
from tunekit.contract import Measurement, Mode
from tunekit.diagnosis import Verdict, trial_verdicts
from tunekit.env import describe_machine, machine_fingerprint, snapshot
from tunekit.errors import ConfigError
from tunekit.recommended import Recommended, load_recommended
from tunekit.records import TrialRow

__all__ = ["check", "CheckOutcome", "MachineCheck", "RetuneOutcome", "EXIT_CODES"]

EXIT_CODES = {"holds": 0, "faster": 0, "regressed": 1, "failed": 1, "other_machine": 3, "inconclusive": 4}
"""The exit code of each outcome: the recommendation holds (or the job got faster), it regressed beyond the
noise or its trial did not complete, it was recorded on another machine (the figure does not apply), or the
evidence decides neither way (the interval straddles the tolerance, or other processes kept the CPUs busy during
the check: measure again, on a quiet machine or with more ``--runs``)."""


@dataclass(frozen=True)
class MachineCheck:
    """The machine the recommendation was tuned on against this one (``env.machine_fingerprint`` each)."""

    recorded: dict[str, Any]
    current: dict[str, Any]
    hardware: tuple[Change, ...]
    """What makes this another machine (``rules.MACHINE_HARDWARE``), as (key, recorded, current)."""
    software: tuple[Change, ...]
    """What was upgraded on the same machine (``rules.MACHINE_SOFTWARE``)."""

    @property
    def same(self) -> bool:
        return not self.hardware


@dataclass(frozen=True)
class CheckOutcome:
    """One check of a committed recommendation: what it found, the figures behind it, and its one line."""

    status: str
    """``holds``, ``faster``, ``regressed``, ``inconclusive``, ``failed`` (a trial did not complete) or
    ``other_machine``."""
    line: str
    recommended: Path
    unit: str
    recorded: dict[str, Any]
    """The recorded figures compared with: ``rate``, ``band``, ``noise_cv``, ``rate_interval``."""
    knobs: dict[str, Any]
    machine: MachineCheck
    measurement: Measurement | None = None
    trial_dir: Path | None = None
    change: float | None = None
    """The runs' mean rate over the recorded one, less 1."""
    tolerance: float | None = None
    """The tolerance the test decides against (``rules.CHECK_TOLERANCE``, or the config's when wider)."""
    test: rules.CheckTest | None = None
    """The one-sided test the outcome comes from (``rules.check_test``)."""
    rates: tuple[float, ...] = ()
    """Each check run's rate."""
    verdict: Verdict | None = None
    retune: RetuneOutcome | None = None

    @property
    def exit_code(self) -> int:
        """:data:`EXIT_CODES`'s; with a retune, 130 when it was interrupted, and 1 for a check that held when the
        retune found no recommendation."""
        code = EXIT_CODES[self.status]
        if self.retune is not None and self.retune.interrupted:
            return 130
        return 1 if code == 0 and self.retune is not None and self.retune.after is None else code


def check(
    recommended: str | os.PathLike[str],
    config: str | os.PathLike[str] | dict[str, Any],
    *,
    knobs: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    out: str | os.PathLike[str] | None = None,
    retune: bool = False,
    quiet: bool = True,
    on_start: Callable[[int, Any, Any], None] | None = None,
    runs: int = 1,
) -> CheckOutcome:
    """Re-measure a committed recommendation on this machine and compare it with what it records.

    Args:
        recommended: the recommended.yaml a sweep wrote.
        config: the config it was tuned with (a file, a mapping, or ``--script``'s config).
        knobs, overrides: ``--set`` knobs (they replace the recommendation's) and dotted config keys.
        out: the folder of the check's trials (default ``results/<name>-check``); a retune's run goes to
            ``out/retune``.
        retune: also run a sweep narrowed around the committed knee and write recommended.retuned.yaml beside the
            committed file.
        quiet: no progress bar or trial log for the retune.
        on_start: called as ``on_start(number, knobs, config)`` when each of the check's trials starts.
        runs: trials of the committed config to measure (more evidence: each narrows the test's interval).

    Raises:
        ConfigError, UsageError: a bad recommendation, config, knob value or folder (one line each).
    """
    rec_path = Path(recommended)
    rec = load_recommended(rec_path)
    recorded = _recorded(rec, rec_path)
    cfg = _tuned_config(config, overrides, recorded["unit"], rec_path)
    run_knobs = config_mod.check_knobs({**{k: v for k, v in rec.knobs.items() if v is not None}, **(knobs or {})})
    out_dir = Path(out or Path("results") / f"{cfg.name}-check")
    env = snapshot()
    tuned_on = _recorded_machine(rec, rec_path)
    hardware, _ = rules.machine_changes(tuned_on, machine_fingerprint(env))
    base = {"recommended": rec_path, "unit": recorded["unit"], "recorded": recorded, "knobs": run_knobs}
    if hardware:  # another machine: no trial (the figure would not apply), unless a retune needs one
        machine = MachineCheck(tuned_on, machine_fingerprint(env), tuple(hardware), ())
        outcome = CheckOutcome("other_machine", _other_machine_line(recorded, machine), machine=machine, **base)
    else:
        overrides_r = {**(overrides or {}), **plan.knee_values(cfg, rec.config)}
        trials = _trials(config, run_knobs, out_dir, overrides_r, on_start, runs)
        outcome = _measured(base, trials, env, tuned_on, cfg)
    return _with_retune(outcome, rec, config, cfg, overrides, knobs, out_dir, quiet) if retune else outcome


def _trials(
    config: Any,
    knobs: dict[str, Any],
    out_dir: Path,
    overrides: dict[str, Any],
    on_start: Callable[[int, Any, Any], None] | None,
    runs: int,
) -> list[Any]:
    """``runs`` trials of the committed config, one after another (``_api.trial``), until one does not complete."""
    trials: list[Any] = []
    while len(trials) < runs and (not trials or trials[-1].ok):
        trials.append(
            _api.trial(config, knobs=knobs, mode=Mode.train.value, out=out_dir, overrides=overrides, on_start=on_start)
        )
    return trials


def _tuned_config(config: Any, overrides: dict[str, Any] | None, unit: str, rec_path: Path) -> config_mod.Config:
    """The config the recommendation is checked with; one that counts another unit than the file recorded is
    refused (the figures cannot be compared)."""
    cfg = config_mod.load(config, overrides=overrides, check_imports=False)
    if cfg.unit != unit:
        raise ConfigError(
            [
                f"{rec_path}: evidence.unit = {unit}, but {cfg.source} counts {cfg.unit}: "
                "the figures cannot be compared; check it with the config it was tuned with"
            ]
        )
    return cfg


def _measured(
    base: dict[str, Any], trials: list[Any], env: dict[str, Any], tuned_on: dict[str, Any], cfg: config_mod.Config
) -> CheckOutcome:
    """The check's outcome once its trials ran: another machine after all (its device), a failure, or the
    comparison with the recorded figures."""
    trial = trials[-1]
    m, recorded = trial.measurement, base["recorded"]
    current = machine_fingerprint(
        env, device=m.device_name, cpus=m.cpu_count, memory_bytes=m.host_mem_total_bytes, versions=m.versions
    )
    hardware, software = rules.machine_changes(tuned_on, current)
    machine = MachineCheck(tuned_on, current, tuple(hardware), tuple(software))
    base = {**base, "machine": machine, "measurement": m, "trial_dir": trial.trial_dir}
    if hardware:  # the trial ran on another device than the recorded one
        return CheckOutcome("other_machine", _other_machine_line(recorded, machine), **base)
    if not trial.ok:
        return CheckOutcome(
            "failed", f"failed: the committed config did not complete here: {m.status} — {m.reason}", **base
        )
    return _compared(base, recorded, [t.measurement for t in trials], _ceilings(base["recommended"], machine), cfg)


# --- the recorded side ---------------------------------------------------------------------------------------


def _number(evidence: dict[str, Any], key: str, path: Path, *, required: bool = False) -> float | None:
    value = evidence.get(key)
    if value is None and not required:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok or (required and value <= 0):
        raise ConfigError(
            [
                f"{path}: evidence.{key} = {value!r}: expected a {'positive ' if required else ''}number "
                "(the figure the sweep recorded, which tunekit check compares with)"
            ]
        )
    return float(value)


def _recorded(rec: Recommended, path: Path) -> dict[str, Any]:
    ev = rec.evidence
    return {
        "rate": _number(ev, "rate", path, required=True),
        "unit": str(ev.get("unit") or "samples"),
        "band": _number(ev, "band", path) or 0.0,
        "noise_cv": _number(ev, "noise_cv", path),
        "rate_interval": _number(ev, "rate_interval", path),
        "run_spread": _number(ev, "run_spread", path),
        "spread_df": _number(ev, "spread_df", path),
        "disturbed": bool(ev.get("disturbed")),
    }


def _recorded_machine(rec: Recommended, path: Path) -> dict[str, Any]:
    """The recorded fingerprint; for a file written before it was recorded, what its evidence and the run's
    env.json beside it (a committed run folder) still say."""
    ev = rec.evidence
    machine = ev.get("machine")
    if machine is not None:  # a mapping that records something (load_recommended)
        if all(machine.get(key) is None for key in rules.MACHINE_HARDWARE):  # it would pass for any machine
            raise ConfigError(
                [
                    f"{path}: evidence.machine: records none of the hardware tunekit check compares "
                    f"({', '.join(rules.MACHINE_HARDWARE)}); leave the key out when it is not known"
                ]
            )
        return dict(machine)
    env_json = path.parent / "env.json"
    try:
        env = read_json(env_json) if env_json.is_file() else None
    except (OSError, ValueError):
        env = None
    versions = ev.get("versions") if isinstance(ev.get("versions"), dict) else None
    device = ev.get("device") if isinstance(ev.get("device"), str) else None
    return machine_fingerprint(env if isinstance(env, dict) else None, device=device, versions=versions)


# --- the comparison ------------------------------------------------------------------------------------------


def _recorded_spread(recorded: dict[str, Any]) -> rules.Spread:
    """The run-to-run spread the recorded figure rests on; for a file that records none, the prior (and never
    less than the prior when it records only a prior's degrees of freedom)."""
    sd, df = recorded["run_spread"], recorded["spread_df"]
    if sd is None or not df:
        return rules.Spread(rules.RUN_SPREAD_PRIOR, rules.PRIOR_DF)
    return rules.Spread(sd, int(df), int(df) if df >= rules.MIN_SPREAD_DF else 0)


def _compared(
    base: dict[str, Any],
    recorded: dict[str, Any],
    ms: list[Measurement],
    ceilings: list[TrialRow],
    cfg: config_mod.Config,
) -> CheckOutcome:
    """The runs against the recorded figure by ``rules.check_test``; a run on a busy host
    (``rules.busy_host``) makes the check inconclusive whatever its figure."""
    m = ms[-1]
    rates = [float(x.rate or 0.0) for x in ms]
    window = rules.mean_windows([x.rate_interval for x in ms])
    tolerance = max(rules.CHECK_TOLERANCE, cfg.selection.tolerance)
    test = rules.check_test(recorded["rate"], recorded["rate_interval"], _recorded_spread(recorded), rates, window,
                            tolerance)  # fmt: skip
    busy = [x for x in ms if rules.busy_host(TrialRow.from_measurement(x))]
    status = "inconclusive" if busy else test.status
    verdict = _verdict(m, ceilings, cfg)
    line = _test_line(status, test, rates, recorded["rate"], base["unit"], busy, verdict)
    software = base["machine"].software
    if software:
        line += "; since the sweep: " + ", ".join(f"{key} {old} → {new}" for key, old, new in software)
    if recorded["disturbed"]:  # recommended.yaml says its own figures were disturbed: the comparison is weaker
        line += "; the recorded figures were disturbed when tuned (see the file's DISTURBED lines)"
    return CheckOutcome(
        status, line, change=test.change, tolerance=tolerance, verdict=verdict, test=test, rates=tuple(rates), **base
    )


def _test_line(
    status: str,
    test: rules.CheckTest,
    rates: list[float],
    recorded: float,
    unit: str,
    busy: list[Measurement],
    verdict: Verdict | None,
) -> str:
    """The check's one line: the runs' figure against the recorded one, the test's bounds and what it decided."""
    rate, tolerance = sum(rates) / len(rates), _pct(test.tolerance)
    runs = f" over {len(rates)} runs" if len(rates) > 1 else ""
    bounds = f"{_pct(test.lower, 1, sign=True)} to {_pct(test.upper, 1, sign=True)} at 95 %"
    figures = f"{rate:.1f} {unit}/s{runs} against {recorded:.1f} recorded, {_pct(test.change, 1, sign=True)}"
    if busy:
        worst = max(busy, key=lambda x: x.other_cpu_cores or 0.0)
        return (
            f"inconclusive: {figures}, but other processes kept {worst.other_cpu_cores:.1f} of "
            f"{worst.cpu_count} usable CPUs busy during the check: its figure is disturbed; check again on a quiet "
            "machine"
        )
    if status == "holds":
        return f"holds: {figures} ({bounds}), within the {tolerance} tolerance"
    if status == "faster":
        return (
            f"holds, faster: {figures} ({bounds}), beyond the {tolerance} tolerance: the job got faster, so a "
            "cheaper config may now do as well (--retune finds it)"
        )
    if status == "inconclusive":
        return (
            f"inconclusive: {figures} ({bounds}) straddles the {tolerance} tolerance; --runs "
            f"{max(2, 2 * len(rates))} measures more evidence"
        )
    return (
        f"regressed: {rate:.1f} against {recorded:.1f} {unit}/s recorded ({_pct(test.change, 0, sign=True)}, "
        f"{bounds}, beyond the {tolerance} tolerance): {_cause(verdict)}"
    )


def _verdict(m: Measurement, ceilings: list[TrialRow], cfg: config_mod.Config) -> Verdict | None:
    """The trial's verdict, against the committed sweep's compute ceiling at its batch when this is its machine."""
    row = TrialRow.from_measurement(m)
    compute = [
        dataclasses.replace(c, number=-1 - i)
        for i, c in enumerate(ceilings)
        if c.mode == Mode.compute and c.knobs.batch_size == row.knobs.batch_size
    ][:1]
    return trial_verdicts([row, *compute], cfg.selection).get(row.number)


def _cause(verdict: Verdict | None) -> str:
    if verdict is None:
        return "no verdict"
    facts = [f"{key} {_fact(value)}" for key, value in list(verdict.evidence.items())[:2]]
    return ", ".join([verdict.name, *facts])


def _fact(value: Any) -> str:
    if isinstance(value, float):
        return _pct(value, 0) if 0 <= value <= 1.5 else f"{value:.1f}"
    return str(value)


def _pct(share: float, digits: int = 1, sign: bool = False) -> str:
    """A share as the README writes it: ``−0.4 %`` (a true minus sign), ``3.0 %``."""
    text = f"{share * 100:{'+' if sign else ''}.{digits}f} %"
    return text.replace("-", "−")


def _other_machine_line(recorded: dict[str, Any], machine: MachineCheck) -> str:
    diffs = ", ".join(
        f"{_KEY_WORDS.get(key, key)} {_value(key, old)} → {_value(key, new)}" for key, old, new in machine.hardware
    )
    return (
        f"another machine: tuned on {describe_machine(machine.recorded)}; here {diffs}: the recorded "
        f"{recorded['rate']:.1f} {recorded['unit']}/s does not apply, and --retune tunes it for this machine"
    )


_KEY_WORDS = {"gpus": "GPUs", "gpu": "GPU", "cpus": "usable CPUs", "cpu": "CPU", "memory_bytes": "host memory"}


def _value(key: str, value: Any) -> str:
    return f"{value / 2**30:.1f} GiB" if key == "memory_bytes" and value is not None else str(value)


# --- retune --------------------------------------------------------------------------------------------------
