from __future__ import annotations

import sys
from typing import Any

import click

from tunekit.cli._outcome import config_source, split_sets
from tunekit.contract import KNOB_NAMES, Measurement, Mode


@click.command()
@click.argument("config_path", metavar="[CONFIG]", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--script",
    default=None,
    metavar="COMMAND",
    help='Your training command instead of a CONFIG, e.g. "python train.py -j {num_workers}" (knobs '
    "without a placeholder are set on its training DataLoader).",
)
@click.option("--name", default=None, help="The run's name with --script (default: the script's file name).")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help=f"A knob ({', '.join(KNOB_NAMES)}) or a dotted config key (e.g. trial.window_s=10).",
)
@click.option(
    "--mode",
    type=click.Choice([m.value for m in Mode]),
    default=Mode.train.value,
    show_default=True,
    help="train: end to end; compute: model on a pre-staged batch; loader: the loader alone.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Output folder (default results/<name>-trial).",
)
def trial(
    config_path: str | None, script: str | None, name: str | None, sets: tuple[str, ...], mode: str, out_dir: str | None
) -> None:
    """Run exactly one trial and write OUT/trials/<n>/measurement.json."""
    from tunekit import _api
    from tunekit.driver import interrupts_as_keyboard_interrupt

    knobs, overrides = split_sets(sets)

    def started(number: int, run: Any, cfg: Any) -> None:
        what = (
            "the script's own settings (no --set: nothing filled in or set on its DataLoader)"
            if run is None
            else run.describe()
        )
        click.echo(f"trial {number}: {what} ({mode}) on {cfg.device} ...", err=True)

    with interrupts_as_keyboard_interrupt():
        source = config_source(config_path, script, name, True)  # one trial: its batch is the knob's
        outcome = _api.trial(source, knobs=knobs, mode=mode, out=out_dir, overrides=overrides, on_start=started)
    click.echo(_summary(outcome.measurement))
    click.echo(f"-> {outcome.trial_dir / 'measurement.json'}")
    if not outcome.ok:
        sys.exit(1)


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
