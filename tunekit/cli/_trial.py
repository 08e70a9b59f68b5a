from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tunekit import config as config_mod
from tunekit.cli._outcome import parse_value
from tunekit.contract import KNOB_NAMES, Measurement
from tunekit.errors import UsageError

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
               "off": False}


@click.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help=f"A knob ({', '.join(KNOB_NAMES)}) or a dotted config key (e.g. trial.window_s=10).")
@click.option("--mode", type=click.Choice(["train", "compute", "loader"]), default="train", show_default=True,
              help="train: end to end; compute: model on a pre-staged batch; loader: the loader alone.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder (default results/<name>-trial).")
def trial(config_path: str, sets: tuple[str, ...], mode: str, out_dir: str | None) -> None:
    """Run exactly one trial and write OUT/trials/<n>/measurement.json."""

    from tunekit.driver import first_knobs, run_single

    knob_sets, config_sets = _split_sets(sets)
    overrides = {key: parse_value(key, value) for key, value in config_sets.items()}
    cfg = config_mod.load(config_path, overrides=overrides)
    knobs = first_knobs(cfg, **{key: _parse_knob(key, text) for key, text in knob_sets.items()})
    out = Path(out_dir or Path("results") / f"{cfg.name}-trial")
    result, trial_dir = run_single(cfg, knobs, mode, out, announce=lambda number: click.echo(
        f"trial {number}: {knobs.describe()} ({mode}) on {cfg.device} ...", err=True))
    click.echo(_summary(result))
    click.echo(f"-> {trial_dir / 'measurement.json'}")
    if result.status != "ok":
        sys.exit(1)


def _split_sets(sets: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    knobs: dict[str, str] = {}
    config: dict[str, str] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set num_workers=4")
        if key in KNOB_NAMES:
            knobs[key] = value.strip()
        elif "." in key:
            config[key] = value
        else:
            raise UsageError(
                f"--set {key}: unknown knob; allowed: {', '.join(KNOB_NAMES)}, or a dotted config key"
            )
    return knobs, config


def _parse_knob(key: str, text: str) -> Any:
    if key == "pin_memory":
        if text.lower() not in _BOOL_WORDS:
            raise UsageError(f"--set pin_memory={text}: expected true or false")
        return _BOOL_WORDS[text.lower()]
    if key == "compile":
        if text not in config_mod.COMPILE_MODES:
            raise UsageError(f"--set compile={text}: choose one of: {', '.join(config_mod.COMPILE_MODES)}")
        return text
    minimum = 0 if key == "num_workers" else 1
    maximum = config_mod.max_workers() if key == "num_workers" else None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum} (config.max_workers on this machine)" if maximum is not None else ""
        raise UsageError(f"--set {key}={text}: expected an integer >= {minimum}{upper}")
    return value


def _fmt(value: Any, spec: str = ".3f", scale: float = 1.0, unit: str = "") -> str:
    return "n/a" if value is None else f"{value * scale:{spec}}{unit}"


def _summary(m: Measurement) -> str:
    if m.status != "ok":
        return f"status: {m.status} — {m.reason}"
    gib = 1 / 2**30
    lines = [
        f"status: ok on {m.device_name} ({m.device})",
        f"{m.unit or 'samples'}/s: {m.rate:.1f} "
        f"(windows {', '.join(f'{r:.1f}' for r in m.rate_windows or [])};"
        f" noise cv {(m.noise_cv or 0.0) * 100:.1f} %)",
        f"step time: {_fmt(m.step_time_s, '.4f', unit=' s')}; data wait {_fmt(m.data_wait_frac, '.1%')};"
        f" gpu busy {_fmt(m.gpu_busy_frac, '.1%')};"
        f" nvml util {_fmt(m.nvml_util_gpu_pct, '.0f', unit=' %')}",
        f"device memory peak: {_fmt(m.device_mem_peak_reserved_bytes, '.2f', gib, ' GiB')} reserved of "
        f"{_fmt(m.device_mem_total_bytes, '.1f', gib, ' GiB')}; headroom {_fmt(m.headroom, '.1%')} "
        f"({m.headroom_basis})",
        f"host memory peak: {_fmt(m.host_mem_peak_bytes, '.2f', gib, ' GiB')} over "
        f"{m.host_processes} processes; cpu {m.cpu_util_cores or 0:.2f} cores",
        f"warm-up: {_fmt(m.warmup_s, '.2f', unit=' s')} over {m.warmup_batches} batches; compile "
        f"{m.compile_s or 0:.2f} s",
    ]
    return "\n".join(lines)
