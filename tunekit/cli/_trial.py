from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import yaml

from tunekit import config as config_mod
from tunekit.contract import KNOB_NAMES, Knobs, TrialSpec
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
    from tunekit._files import write_json_atomic, write_text_atomic
    from tunekit.driver import interrupts_as_keyboard_interrupt
    from tunekit.launcher import run_trial

    knob_sets, config_sets = _split_sets(sets)
    raw = config_mod.read_yaml(config_path)
    if not isinstance(raw, dict):
        raise UsageError(f"{config_path}: the top level must be a mapping of keys")
    for key, value in config_sets.items():
        config_mod.set_dotted(raw, key, _parse_value(key, value))
    cfg = config_mod.from_dict(raw, source=config_path, check_imports=True, default_name=Path(config_path).stem)
    knobs = _knobs(cfg, knob_sets)
    out = Path(out_dir or Path("results") / f"{cfg.name}-trial")
    from tunekit.store import lock_run

    with lock_run(out):  # held until the trial ends: no sweep or other trial writes here meanwhile
        if (out / "study.db").exists():
            raise UsageError(f"{out}: a sweep's run folder (it holds study.db), whose trial numbers a resumed sweep "
                             "would reuse; give tunekit trial another --out")
        number = _next_trial_number(out / "trials")
        (out / "trials").mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "config.resolved.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        spec = TrialSpec(number=number, stage="single", mode=mode, knobs=knobs, config=cfg.to_dict())
        click.echo(f"trial {number}: {knobs.describe()} ({mode}) on {cfg.device} ...", err=True)
        with interrupts_as_keyboard_interrupt():  # SIGTERM/SIGHUP kill the trial's process tree too
            result = run_trial(spec, out / "trials" / str(number), cfg.trial.timeout_s)
        write_json_atomic(out / "trials" / str(number) / "measurement.json", result)
        click.echo(_summary(result))
        click.echo(f"-> {out / 'trials' / str(number) / 'measurement.json'}")
        if result["status"] != "ok":
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


def _knobs(cfg: config_mod.Config, sets: dict[str, str]) -> Knobs:
    s = cfg.search
    values: dict[str, Any] = {
        "num_workers": s.num_workers[0],
        "prefetch_factor": s.prefetch_factor[0],
        "pin_memory": s.pin_memory[0],
        "batch_size": s.batch_size[0],
        "grad_accum": s.grad_accum[0],
        "compile": s.compile[0],
    }
    for key, text in sets.items():
        values[key] = _parse_knob(key, text)
    return Knobs(**values)


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


def _next_trial_number(trials: Path) -> int:
    numbers = [int(p.name) for p in trials.glob("*") if p.name.isdigit()] if trials.exists() else []
    return max(numbers, default=-1) + 1


def _fmt(value: Any, spec: str = ".3f", scale: float = 1.0, unit: str = "") -> str:
    return "n/a" if value is None else f"{value * scale:{spec}}{unit}"


def _summary(m: dict[str, Any]) -> str:
    if m["status"] != "ok":
        return f"status: {m['status']} — {m['reason']}"
    gib = 1 / 2**30
    lines = [
        f"status: ok on {m.get('device_name')} ({m.get('device')})",
        f"{m.get('unit', 'samples')}/s: {m['samples_per_s']:.1f} "
        f"(windows {', '.join(f'{r:.1f}' for r in m['samples_per_s_windows'])};"
        f" noise cv {m['noise_cv'] * 100:.1f} %)",
        f"step time: {_fmt(m['step_time_s'], '.4f', unit=' s')}; data wait {_fmt(m['data_wait_frac'], '.1%')};"
        f" gpu busy {_fmt(m.get('gpu_busy_frac'), '.1%')};"
        f" nvml util {_fmt(m.get('nvml_util_gpu_pct'), '.0f', unit=' %')}",
        f"device memory peak: {_fmt(m.get('device_mem_peak_reserved_bytes'), '.2f', gib, ' GiB')} reserved of "
        f"{_fmt(m.get('device_mem_total_bytes'), '.1f', gib, ' GiB')}; headroom {m['headroom']:.1%} "
        f"({m.get('headroom_basis')})",
        f"host memory peak: {_fmt(m.get('host_mem_peak_bytes'), '.2f', gib, ' GiB')} over "
        f"{m.get('host_processes')} processes; cpu {m.get('cpu_util_cores', 0):.2f} cores",
        f"warm-up: {m['warmup_s']:.2f} s over {m.get('warmup_batches')} batches; compile {m.get('compile_s', 0):.2f} s",
    ]
    return "\n".join(lines)


def _parse_value(key: str, text: str) -> Any:
    """A --set value as YAML (one line naming the key when it is not valid YAML)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"--set {key}={text}: not a valid YAML value ({problem})") from None
