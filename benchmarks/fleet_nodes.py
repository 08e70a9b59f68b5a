"""One sweep on several identical machines: the wall time of one sweep of a sleep workload run by 1, 2 and 3 node
processes sharing its study in PostgreSQL (``tunekit sweep --storage URL`` on the first, ``--join`` on the others),
on this machine, and the speed-up over one node.

    python benchmarks/fleet_nodes.py [--storage postgresql://USER@HOST/DB] [--nodes 1 2 3] \
        [--strategy staged grid] [--out results/fleet-nodes]

The workload sleeps (test_check's known-answer job: the model 53.3 ms a step, each worker 5 ms a sample), so node
processes on one machine do not compete for its CPUs as trials on separate machines would not: the speed-up is the
plan's, what the nodes may run side by side. Each trial measures three 1-s windows, without repeats (whose number
follows the noise: the knee and the best may be one config or two). Without ``--storage`` a throwaway PostgreSQL
server is started in a temporary folder (tests/_postgres.py: initdb and postgres from PATH, else the pgserver
wheel's). Each sweep is a run of its own in the database (``--set name=...``); the joining nodes start once the
sweep's run is there.
Prints one row per strategy and node count (wall time, speed-up, trials run, the knee's workers) and writes
``fleet_nodes.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _common import write_csv

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/_postgres.py and tests/conftest.py

CONFIG: dict[str, Any] = {
    "device": "cpu",
    "workload": {
        "model": "tunekit.workloads.synthetic:sleepy_model",
        "model_args": {"step_wait_s": 0.0533},
        "dataset": "tunekit.workloads.synthetic:sleepy_dataset",
        "dataset_args": {"sample_wait_s": 0.005},
    },
    "search": {"num_workers": [0, 1, 2, 3, 4], "batch_size": [8, 16], "pin_memory": [False], "prefetch_factor": [2]},
    "trial": {"warmup_steps": 1, "measure_windows": 3, "window_s": 1.0, "precision": None},
    "selection": {"tolerance": 0.05, "repeats": 0},
    "fleet": {"heartbeat_s": 2, "grace_s": 10, "poll_s": 0.5},
}


def _node(cfg: Path, url: str, out: Path, name: str, strategy: str, join: bool) -> subprocess.Popen[Any]:
    cmd = [sys.executable, "-m", "tunekit", "sweep", str(cfg), "--storage", url, "--out", str(out), "--quiet"]
    cmd += ["--set", f"name={name}", "--strategy", strategy, "--join" if join else "--no-resume"]
    log = open(out.parent / f"{out.name}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    log.close()
    return proc


def sweep(cfg: Path, url: str, root: Path, nodes: int, strategy: str) -> dict[str, Any]:
    """One sweep run by ``nodes`` node processes: its wall time, trials run and knee."""
    from tunekit import load_recommended, store

    name = f"fleet-{strategy}-{nodes}"
    t0 = time.monotonic()
    procs = [_node(cfg, url, root / f"{name}-0", name, strategy, join=False)]
    while nodes > 1 and not any(r.name == name and r.machine for r in store.runs_in(url)):
        if procs[0].poll() is not None:
            raise SystemExit(f"the sweep's node ended early: {(root / f'{name}-0.log').read_text()[-2000:]}")
        time.sleep(0.5)
    procs += [_node(cfg, url, root / f"{name}-{k}", name, strategy, join=True) for k in range(1, nodes)]
    codes = [p.wait() for p in procs]
    wall = time.monotonic() - t0
    if any(codes):
        raise SystemExit(f"{name}: exit codes {codes}; see {root}/{name}-*.log")
    rows = store.load_stored(url, name).rows()
    knee = load_recommended(root / f"{name}-0" / "recommended.yaml")
    return {
        "strategy": strategy,
        "nodes": nodes,
        "wall_s": round(wall, 1),
        "trials_run": sum(1 for r in rows if r.status != "skipped"),
        "skipped": sum(1 for r in rows if r.status == "skipped"),
        "knee_workers": knee.num_workers,
        "knee_batch": knee.batch_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", default=None, help="a PostgreSQL URL (default: a throwaway local server)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--strategy", nargs="+", default=["staged", "grid"], choices=["staged", "grid"])
    parser.add_argument("--out", type=Path, default=Path("results/fleet-nodes"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    server = None
    if args.storage is None:
        from tests._postgres import start

        server = start()
    url = args.storage or server.database()  # type: ignore[union-attr]
    try:
        with tempfile.TemporaryDirectory(prefix="fleet-nodes-") as tmp:
            cfg = Path(tmp) / "sleepy.yaml"
            cfg.write_text(yaml.safe_dump({"name": "fleet", **CONFIG}, sort_keys=False))
            results = [sweep(cfg, url, Path(tmp), n, s) for s in args.strategy for n in args.nodes]
    finally:
        if server is not None:
            server.stop()
    for row in results:
        one = next(r["wall_s"] for r in results if r["strategy"] == row["strategy"] and r["nodes"] == min(args.nodes))
        row["speedup"] = round(one / row["wall_s"], 2)
    write_csv(args.out / "fleet_nodes.csv", results)
    print("| strategy | nodes | wall s | speed-up | trials run (skipped) | knee |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['strategy']} | {r['nodes']} | {r['wall_s']} | {r['speedup']}x | {r['trials_run']} ({r['skipped']}) "
            f"| {r['knee_workers']} workers, batch {r['knee_batch']} |"
        )


if __name__ == "__main__":
    main()
