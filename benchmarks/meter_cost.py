"""The meter's own cost per batch: a loop over ready batches whose step is a busy wait holding the GIL (as a Python
training loop launching kernels does), bare and inside the meter (tunekit.worker.meter._meter.Meter, with and without
the trial's monitor thread), alternated; optionally with child processes in the monitor's tree.

    python benchmarks/meter_cost.py --step-ms 2 --rounds 4 --children 12

Prints steps/s for each and the meter's share.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterator

import torch

from tunekit.worker.meter import Meter, MeterSettings
from tunekit.worker.meter._monitor import Monitor, TreeCpu

_BATCH = (torch.zeros(8, 3), torch.zeros(8))


def _endless() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield _BATCH


def _step(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _bare(step_s: float, steps: int) -> float:
    batches, t0 = _endless(), time.perf_counter()
    for _ in range(steps):
        next(batches)
        _step(step_s)
    return steps / (time.perf_counter() - t0)


def _metered(step_s: float, monitor: bool) -> float:
    mon = Monitor(None).start() if monitor else None
    settings = MeterSettings(
        window_s=1.0,
        measure_windows=3,
        max_windows=3,
        precision=None,
        warmup_steps=5,
        compiling=False,
        grad_accum=1,
        round_batches=1,
        fill=0,
        needed=None,
    )
    meter = Meter(_endless(), settings, device=torch.device("cpu"), count=lambda batch: 8, cpu=TreeCpu())
    for _ in meter:
        _step(step_s)
    if mon is not None:
        mon.stop()
    windows = meter.reading.windows
    return sum(w.steps for w in windows) / sum(w.wall_s for w in windows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--children", type=int, default=0, help="sleeping processes in the monitor's tree")
    args = parser.parse_args()
    step_s = args.step_ms / 1000
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(args.children)]
    try:
        for rnd in range(args.rounds):
            bare = _bare(step_s, int(3 / step_s))
            meter, monitored = _metered(step_s, False), _metered(step_s, True)
            print(
                f"round {rnd}: bare {bare:.1f} steps/s, meter {meter:.1f} ({1 - meter / bare:+.2%}), meter and "
                f"monitor {monitored:.1f} ({1 - monitored / bare:+.2%})",
                flush=True,
            )
    finally:
        for kid in kids:
            kid.kill()


if __name__ == "__main__":
    main()
