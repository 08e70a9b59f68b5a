"""``tunekit check RECOMMENDED.yaml (--config CONFIG | --script COMMAND)``: one line (or ``--json``, ``--junit``) and
the exit code a CI job reads: 0 it holds, 1 it regressed (or its trial did not complete), 2 bad usage or config,
3 it was tuned on another machine, 4 inconclusive (the evidence decides neither way, or the host was busy), 130
interrupted."""

from __future__ import annotations

import json
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import click

from tunekit._files import write_text_atomic
from tunekit.cli._outcome import config_source, split_sets
from tunekit.contract import KNOB_NAMES
from tunekit.errors import TunekitError, UsageError


@click.command()
@click.argument("recommended", metavar="RECOMMENDED.yaml", type=click.Path(dir_okay=False))
@click.option(
    "--config",
    "config_path",
    default=None,
    metavar="CONFIG",
    type=click.Path(dir_okay=False),
    help="The config the recommendation was tuned with.",
)
@click.option(
    "--script",
    default=None,
    metavar="COMMAND",
    help='Or the training command it was tuned with, e.g. "python train.py -j {num_workers}".',
)
@click.option("--name", default=None, help="The run's name with --script (default: the script's file name).")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help=f"A knob that replaces the recommendation's ({', '.join(KNOB_NAMES)}) or a dotted config key "
    "(e.g. --set trial.window_s=5).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder of the check's trials (default results/<name>-check); a retune runs in OUT/retune.",
)
@click.option(
    "--retune",
    is_flag=True,
    help="Also sweep a search narrowed around the committed knee and write recommended.retuned.yaml "
    "beside RECOMMENDED.yaml (the exit code stays the check's).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout instead of the line.")
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(),
    default=None,
    help="Also write JUnit XML here: one test case per check (machine, throughput).",
)
@click.option("--quiet", is_flag=True, help="No progress bar or trial log for the retune.")
@click.option(
    "--runs",
    type=click.IntRange(1, 20),
    default=1,
    show_default=True,
    help="Trials of the committed config to measure: more runs narrow the test's interval (an inconclusive check "
    "says how many).",
)
def check(
    recommended: str,
    config_path: str | None,
    script: str | None,
    name: str | None,
    sets: tuple[str, ...],
    out_dir: str | None,
    retune: bool,
    as_json: bool,
    junit_path: str | None,
    quiet: bool,
    runs: int,
) -> None:
    """Re-measure a committed recommended.yaml with full-fidelity trials and test them against what it records:
    exit 0 it holds, 1 it regressed (with the likely cause), 3 it was tuned on another machine, 4 inconclusive
    (the interval straddles the tolerance, or the host was busy)."""
    from tunekit import _check
    from tunekit.driver import interrupts_as_keyboard_interrupt

    if junit_path is not None:
        _writable(junit_path)  # before the trial: a CI job learns of a typo now, not after minutes of measuring
    knobs, overrides = split_sets(sets)
    source = config_source(config_path, script, name, "search.batch_size" in overrides or "batch_size" in knobs)

    with interrupts_as_keyboard_interrupt():
        outcome = _check.check(
            recommended, source, knobs=knobs, overrides=overrides, out=out_dir, retune=retune,
            quiet=quiet or as_json, on_start=_started, runs=runs,
        )  # fmt: skip
    lines = [outcome.line, *_retune_lines(outcome.retune)]
    if as_json:
        click.echo("\n".join(lines), err=True)
        click.echo(json.dumps(_as_json(outcome), default=str))
    else:
        click.echo("\n".join(lines))
    if junit_path is not None:
        try:
            write_text_atomic(junit_path, _junit(outcome))
        except TunekitError as exc:  # the report is lost, the check's answer is not: its exit code stands
            click.echo(f"tunekit: warning: --junit: {exc}; the exit code is the check's", err=True)
    sys.exit(outcome.exit_code)


def _started(number: int, run: Any, cfg: Any) -> None:
    click.echo(f"check: trial {number}: {run.describe()} on {cfg.device} ...", err=True)


def _writable(path: str) -> None:
    """--junit's FILE can be written: not a folder, in a folder that exists and takes a new file (the atomic write
    puts one beside it first)."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--junit {path}: is a folder; name the XML file to write")
    folder = target.parent
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"--junit {path}: its folder {folder} {why}; create it or name another file")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"--junit {path}: cannot write in its folder {folder}: {exc.strerror or exc}") from None


def _retune_lines(r: Any) -> list[str]:
    if r is None:
        return []
    if r.interrupted:
        return [f"retune: interrupted; its trials so far are in {r.run_dir}"]
    cost = f"{r.trials_run} trial(s) run" + (
        f" against the {r.full_trials} of the committed sweep" if r.full_trials is not None else ""
    )
    seeded = [f"{r.reused} ceiling(s)"] if r.reused else []
    seeded += ["the check's trial"] if r.check_trial_reused else []
    if seeded:
        cost += f" ({' and '.join(seeded)} reused)"
    if r.after is None:
        return [f"retune: no recommendation: {r.reason} ({cost}; {r.run_dir})"]
    what = (
        "the knee moved: " + ", ".join(f"{k} {old} → {new}" for k, old, new in r.changes)
        if r.changes
        else "the knee holds"
    )
    stopped = f"; {r.stop_reason}" if r.stop_reason else ""
    return [f"retune: {what} ({r.rate:.1f} {r.unit}/s; {cost}{stopped})", f"-> {r.written} (run: {r.run_dir})"]


def _changes(changes: Any) -> list[dict[str, Any]]:
    return [{"key": key, "recorded": old, "current": new} for key, old, new in changes]


def _measured_json(o: Any) -> dict[str, Any] | None:
    """The last check trial's figures and verdict."""
    m, v = o.measurement, o.verdict
    if m is None:
        return None
    return {
        "status": m.status,
        "reason": m.reason,
        "rate": m.rate,
        "noise_cv": m.noise_cv,
        "rate_interval": m.rate_interval,
        "data_wait_frac": m.data_wait_frac,
        "trial_dir": str(o.trial_dir),
        "verdict": v.name if v else None,
        "verdict_evidence": v.evidence if v else None,
    }


def _as_json(o: Any) -> dict[str, Any]:
    r = o.retune
    return {
        "status": o.status,
        "exit_code": o.exit_code,
        "line": o.line,
        "recommended": str(o.recommended),
        "unit": o.unit,
        "recorded": o.recorded,
        "knobs": o.knobs,
        "change": o.change,
        "tolerance": o.tolerance,
        "bounds": None if o.test is None else [o.test.lower, o.test.upper],
        "rates": list(o.rates),
        "measured": _measured_json(o),
        "machine": {
            "same": o.machine.same,
            "recorded": o.machine.recorded,
            "current": o.machine.current,
            "hardware": _changes(o.machine.hardware),
            "software": _changes(o.machine.software),
        },
        "retune": None
        if r is None
        else {
            "run_dir": str(r.run_dir),
            "written": str(r.written) if r.written else None,
            "before": r.before,
            "after": r.after,
            "changes": _changes(r.changes),
            "rate": r.rate,
            "trials_run": r.trials_run,
            "reused_ceilings": r.reused,
            "check_trial_reused": r.check_trial_reused,
            "full_sweep_trials": r.full_trials,
            "reason": r.reason,
            "stop_reason": r.stop_reason,
            "interrupted": r.interrupted,
        },
    }


def _junit(o: Any) -> str:
    """JUnit XML: a test case per check, ``machine`` and ``throughput``, under the recommendation's path; a
    regression is a failure, another machine fails ``machine`` and skips ``throughput``, a trial that did not
    complete is an error."""
    classname = f"tunekit.check.{Path(o.recommended).as_posix()}"
    cases = []
    machine = ET.Element("testcase", classname=classname, name="machine", time="0")
    if not o.machine.same:
        ET.SubElement(machine, "failure", message=o.line, type="other_machine").text = o.line
    cases.append(machine)
    seconds = (o.measurement.launcher_wall_s or 0.0) if o.measurement is not None else 0.0
    throughput = ET.Element("testcase", classname=classname, name="throughput", time=f"{seconds:.1f}")
    if o.status == "other_machine":
        ET.SubElement(throughput, "skipped", message="the recorded figure does not apply on another machine")
    elif o.status == "regressed":
        ET.SubElement(throughput, "failure", message=o.line, type="regressed").text = o.line
    elif o.status == "failed":
        ET.SubElement(throughput, "error", message=o.line, type="failed").text = o.line
    elif o.status == "inconclusive":
        ET.SubElement(throughput, "skipped", message=o.line)
    ET.SubElement(throughput, "system-out").text = o.line
    cases.append(throughput)
    counts = {
        "tests": "2",
        "failures": str(sum(1 for c in cases if c.find("failure") is not None)),
        "errors": str(sum(1 for c in cases if c.find("error") is not None)),
        "skipped": str(sum(1 for c in cases if c.find("skipped") is not None)),
        "time": f"{seconds:.1f}",
    }
    suites = ET.Element("testsuites", name="tunekit check", **counts)
    suite = ET.SubElement(suites, "testsuite", name="tunekit check", **counts)
    suite.extend(cases)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
