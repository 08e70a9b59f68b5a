"""What the benchmark scripts share: one trial through the real CLI, and an atomic CSV."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tunekit._files import atomic_path, read_json
from tunekit.contract import Measurement


def run_trial(
    config: str | Path, out: Path, sets: list[str], *, mode: str = "train", echo: bool = False
) -> tuple[Measurement, Path | None]:
    """``tunekit trial CONFIG --out OUT --mode MODE --set …``: its measurement and trial folder. A command that left no
    measurement (killed, or failed before its trial began) gives a crashed one and no folder, never an earlier
    trial's."""
    cmd = [sys.executable, "-m", "tunekit", "trial", str(config), "--out", str(out), "--mode", mode]
    for item in sets:
        cmd += ["--set", item]
    trials = out / "trials"
    before = {p.name for p in trials.iterdir()} if trials.is_dir() else set()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if echo:
        print(proc.stdout.strip(), file=sys.stderr)
    made = [p for p in trials.iterdir() if p.name not in before] if trials.is_dir() else []
    if len(made) != 1 or not (made[0] / "measurement.json").exists():
        return Measurement(status="crashed", reason=(proc.stderr.strip().splitlines() or ["no measurement"])[-1]), None
    return Measurement.from_dict(read_json(made[0] / "measurement.json")), made[0]


def merged_sets(*lists: list[str]) -> list[str]:
    """KEY=VALUE items for ``--set``, each key once, a later list's value winning (``tunekit trial`` refuses a key
    given twice)."""
    items: dict[str, str] = {}
    for item in (i for part in lists for i in part):
        key, _, value = item.partition("=")
        items[key.strip()] = value
    return [f"{key}={value}" for key, value in items.items()]


_CLOCK = Path(__file__).resolve().parent / "_plain_clock"


def plain_rate(
    command: list[str], cwd: str | Path, loader: dict[str, Any], skip: int, count: int, timeout_s: float = 1800
) -> float:
    """A training script's own throughput by the plain clock (benchmarks/_plain_clock: a timestamp per batch
    request, nothing else) over batches ``skip``+1 … ``skip``+``count`` of its training loader, with ``loader``'s
    attributes set on it as a trial would."""
    from tunekit.launch import child_env

    env = {**child_env(), "TUNEKIT_PLAIN_CLOCK": f"{skip} {count}", "TUNEKIT_PLAIN_LOADER": json.dumps(loader)}
    env["PYTHONPATH"] = os.pathsep.join([str(_CLOCK), env.get("PYTHONPATH", "")])
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    found = re.search(r"plain-clock rate ([0-9.]+)", run.stderr)
    if not found:
        raise SystemExit(f"the plain run of {command} printed no rate: {run.stderr.strip().splitlines()[-3:]}")
    return float(found.group(1))


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as CSV, written atomically (a cut-off benchmark leaves the previous table, never half of one)."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
