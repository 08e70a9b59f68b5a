"""Command-line interface: ``tunekit sweep | trial | validate | report | env``.

Errors are one line each on stderr (``--debug`` shows the traceback); exit 0 success, 1 runtime failure,
2 usage or config error. Nothing here imports torch: trials run in subprocesses.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import click
import yaml

from tunekit import config as config_mod
from tunekit.contract import KNOB_NAMES, Knobs, TrialSpec
from tunekit.errors import TunekitError, UsageError

__all__ = ["main", "cli"]

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
               "off": False}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="tunekit")
def cli(debug: bool) -> None:
    """Tune a PyTorch training input pipeline: short isolated trials, the throughput knee, recommended.yaml."""
    # --debug is read by main() before click runs, so that errors raised while parsing also get a traceback


@cli.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Run folder (default results/<name>).")
@click.option("--budget-min", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Wall-clock budget in minutes (default: budget.minutes).")
@click.option("--strategy", type=click.Choice(["staged", "grid"]), default=None,
              help="staged (default from the config) or grid (every combination).")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Keep the finished trials of an earlier sweep in the same folder, or start again.")
@click.option("--quiet", is_flag=True, help="No progress bar or trial log.")
def sweep(config_path: str, out_dir: str | None, budget_min: float | None, strategy: str | None, resume: bool,
          quiet: bool) -> None:
    """Run short isolated trials, pick the throughput knee, write plots, report.md, trials.csv, study.db and
    recommended.yaml under results/<name>/."""
    from tunekit.driver import make_console, run_sweep
    from tunekit.report import summary_table

    cfg = config_mod.load(config_path)
    run_dir = Path(out_dir or Path("results") / cfg.name)
    result = run_sweep(cfg, run_dir, strategy=strategy or cfg.strategy,
                       budget_minutes=budget_min or cfg.budget.minutes, resume=resume, quiet=quiet)
    console = make_console(quiet)
    console.print(summary_table(result.rows, result.summary))
    _print_outcome(result.summary, run_dir)
    if result.interrupted:
        sys.exit(130)
    if result.summary.knee.knee is None:
        sys.exit(1)


@cli.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(file_okay=False))
def report(run_dir: str) -> None:
    """Rebuild a run's outputs (trials.csv, report.md, recommended.yaml) from its study; re-runs nothing."""
    from tunekit.driver import make_console
    from tunekit.report import rebuild, summary_table

    _, rows, summary = rebuild(Path(run_dir))
    make_console().print(summary_table(rows, summary))
    _print_outcome(summary, Path(run_dir))


def _print_outcome(summary: Any, run_dir: Path) -> None:
    knee = summary.knee
    if knee.knee is None:
        click.echo(knee.reason)
        return
    click.echo(knee.reason)
    if summary.speedup_vs_defaults:
        click.echo(f"{summary.speedup_vs_defaults:.2f}x the PyTorch defaults (0 workers, no pinning).")
    click.echo(f"-> {run_dir / 'recommended.yaml'}")


@cli.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
def validate(config_path: str) -> None:
    """Check a config file strictly (keys, types, ranges, choices, import paths). Needs no GPU."""
    cfg = config_mod.load(config_path)
    s = cfg.search
    click.echo(
        f"{config_path}: ok — {cfg.name}: workers {s.num_workers}, batch {s.batch_size}, "
        f"pin_memory {s.pin_memory}, prefetch {s.prefetch_factor}, compile {s.compile}, strategy {cfg.strategy}"
    )


@cli.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help=f"A knob ({', '.join(KNOB_NAMES)}) or a dotted config key (e.g. trial.window_s=10).")
@click.option("--mode", type=click.Choice(["train", "compute", "loader"]), default="train", show_default=True,
              help="train: end to end; compute: model on a pre-staged batch; loader: the loader alone.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder (default results/<name>-trial).")
def trial(config_path: str, sets: tuple[str, ...], mode: str, out_dir: str | None) -> None:
    """Run exactly one trial and write OUT/trials/<n>/measurement.json."""
    from tunekit.analysis import describe_knobs
    from tunekit.contract import write_json_atomic, write_text_atomic
    from tunekit.driver import interrupts_as_keyboard_interrupt
    from tunekit.launcher import run_trial

    knob_sets, config_sets = _split_sets(sets)
    raw = config_mod.read_yaml(config_path)
    for key, value in config_sets.items():
        _set_dotted(raw, key, value)
    cfg = config_mod.from_dict(raw, source=config_path, check_imports=True, default_name=Path(config_path).stem)
    knobs = _knobs(cfg, knob_sets)
    out = Path(out_dir or Path("results") / f"{cfg.name}-trial")
    number = _next_trial_number(out / "trials")
    (out / "trials").mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "config.resolved.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    spec = TrialSpec(number=number, stage="single", mode=mode, knobs=knobs, config=cfg.to_dict())
    click.echo(f"trial {number}: {describe_knobs(knobs)} ({mode}) on {cfg.device} ...", err=True)
    with interrupts_as_keyboard_interrupt():  # SIGTERM/SIGHUP kill the trial's process tree too
        result = run_trial(spec, out / "trials" / str(number), cfg.trial.timeout_s)
    write_json_atomic(out / "trials" / str(number) / "measurement.json", result)
    click.echo(_summary(result))
    click.echo(f"-> {out / 'trials' / str(number) / 'measurement.json'}")
    if result["status"] != "ok":
        sys.exit(1)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default="results/env.json", show_default=True,
              help="Where to write the JSON snapshot.")
def env(as_json: bool, out_file: str) -> None:
    """Print and save the environment: Python, torch, CUDA, driver, CPUs, RAM, /dev/shm, GPUs via NVML."""
    from tunekit.contract import write_json_atomic
    from tunekit.envinfo import format_text, snapshot

    snap = snapshot()
    write_json_atomic(out_file, snap)
    click.echo(json.dumps(snap, indent=2) if as_json else format_text(snap))


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


def _set_dotted(raw: Any, key: str, value: str) -> None:
    if not isinstance(raw, dict):
        return
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UsageError(f"--set {key}: {part} is not a mapping in the config")
    node[parts[-1]] = yaml.safe_load(value)


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
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--set {key}={text}: expected an integer >= {minimum}") from None
    if value < minimum:
        raise UsageError(f"--set {key}={text}: expected an integer >= {minimum}")
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
        f"samples/s: {m['samples_per_s']:.1f} (windows {', '.join(f'{r:.1f}' for r in m['samples_per_s_windows'])};"
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


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``tunekit`` console script and ``python -m tunekit``."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="tunekit", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except click.Abort:
        click.echo("tunekit: aborted", err=True)
        sys.exit(130)
    except TunekitError as exc:
        if debug:
            traceback.print_exc()
        for line in exc.lines():
            click.echo(f"tunekit: error: {line}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("tunekit: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - one line unless --debug
        if debug:
            traceback.print_exc()
        click.echo(f"tunekit: error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
        sys.exit(1)
