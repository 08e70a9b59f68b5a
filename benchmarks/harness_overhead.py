"""Harness overhead: the trial worker's measured loop against a plain training loop, same config, same process
shape (a fresh subprocess each), interleaved A/B to cancel drift.

The plain loop builds the workload with the same code (tunekit.worker.factory._build), warms up the same number of
batches, then times a fixed wall-clock span with the device synchronised only at its ends — no events, no
monitor thread, no window bookkeeping.

    python benchmarks/harness_overhead.py configs/resnet.yaml --set num_workers=16 --set batch_size=256 \
        --set pin_memory=true --repeats 3 --out results/overhead

Target: overhead = 1 - trial / plain <= 1 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import run_trial, write_csv

_PLAIN = r"""
import json, sys, time, torch
from tunekit import config
from tunekit.contract import Knobs
from tunekit.worker.factory._build import build, make_loader, pick_device, to_device

raw, knobs = json.loads(sys.argv[1]), Knobs(**json.loads(sys.argv[2]))
seconds, warm = float(sys.argv[3]), int(sys.argv[4])
cfg = config.from_dict(raw)
torch.manual_seed(0)
device = pick_device(cfg.device)
b = build(cfg, knobs, device)
it = iter(make_loader(b.dataset, knobs, device, cfg))

def step(n):
    batch = to_device(next(it), b.ctx, knobs.non_blocking)
    with b.autocast():
        loss = b.step_fn(b.model, batch, b.ctx) / knobs.grad_accum
    (b.scaler.scale(loss) if b.scaler else loss).backward()
    if (n + 1) % knobs.grad_accum == 0:
        (b.scaler.step(b.optimizer), b.scaler.update()) if b.scaler else b.optimizer.step()
        b.optimizer.zero_grad(set_to_none=True)

for n in range(warm):
    step(n)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
sync(); t0 = time.perf_counter(); n = 0
while True:
    for _ in range(knobs.grad_accum):
        step(n); n += 1
    if time.perf_counter() - t0 >= seconds:
        break
sync()
print(json.dumps({"samples_per_s": n * knobs.batch_size / (time.perf_counter() - t0)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/overhead")
    args = parser.parse_args()
    out = Path(args.out)
    rows = []
    for i in range(args.repeats):
        m, trial_dir = run_trial(args.config, out / "trial", args.sets)
        if m.status != "ok":
            sys.exit(f"trial failed: {m.status}: {m.reason}")
        cfg = json.loads((trial_dir / "spec.json").read_text())
        # the plain loop: same warm-up batches, as long as the trial's windows together
        t0 = time.perf_counter()
        plain = subprocess.run(
            [
                sys.executable,
                "-c",
                _PLAIN,
                json.dumps(cfg["config"]),
                json.dumps(cfg["knobs"]),
                str(m.measured_s),
                str(m.warmup_batches),
            ],
            capture_output=True,
            text=True,
        )
        if plain.returncode != 0:
            sys.exit(plain.stderr.strip().splitlines()[-1])
        p = json.loads(plain.stdout.strip().splitlines()[-1])
        rows.append(
            {
                "repeat": i,
                "trial_samples_per_s": m.rate,
                "trial_mean_of_windows": statistics.fmean(m.rate_windows or []),
                "plain_samples_per_s": p["samples_per_s"],
                "plain_wall_s": time.perf_counter() - t0,
                "device": m.device_name,
            }
        )
    write_csv(out / "overhead.csv", rows)
    trial = statistics.median(r["trial_mean_of_windows"] for r in rows)
    plain = statistics.median(r["plain_samples_per_s"] for r in rows)
    print("repeat | trial samples/s (median, mean of windows) | plain loop samples/s")
    for r in rows:
        print(
            f"{r['repeat']} | {r['trial_samples_per_s']:.1f}, {r['trial_mean_of_windows']:.1f} | "
            f"{r['plain_samples_per_s']:.1f}"
        )
    print(
        f"overhead = 1 - trial/plain = {1 - trial / plain:+.2%} (medians over {len(rows)} repeats, {rows[0]['device']})"
    )


if __name__ == "__main__":
    main()
