"""Is the machine itself still speeding up after a trial's warm-up? Throughput every 5 s of plain loops, with no
trial harness around them: (a) the loader alone in the main process (0 workers), (b) a 0-worker training loop,
(c) the loader alone again with torch limited to one intra-op thread.

    python benchmarks/warmup_ramp.py configs/resnet.yaml --batch 256 --seconds 45

On the H200 machine (16 vCPUs) of 2026-11-29, (a) rose from ~290 to ~340 samples/s over 40 s and (b) started at
217 then held 266-290: the first seconds of any window after warm-up run slow on that machine, harness or not.
"""

from __future__ import annotations

import argparse
import time

import torch

from tunekit import config
from tunekit.contract import Knobs
from tunekit.worker.factory._build import build, make_loader, pick_device, to_device


def _phase(name: str, seconds: float, step, batch: int) -> None:
    t0 = last = time.perf_counter()
    n = n_last = 0
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
        now = time.perf_counter()
        if now - last >= 5:
            load = open("/proc/loadavg").read().split()[0]
            print(
                f"{name:16s} t={now - t0:5.1f} s  {(n - n_last) * batch / (now - last):8.1f} samples/s  load {load}",
                flush=True,
            )
            last, n_last = now, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=45.0)
    args = parser.parse_args()
    cfg = config.load(args.config, check_imports=False)
    device = pick_device(cfg.device)
    knobs = Knobs(
        num_workers=0, prefetch_factor=None, pin_memory=False, batch_size=args.batch, grad_accum=1, compile="none"
    )
    b = build(cfg, knobs, device)
    it = iter(make_loader(b.dataset, knobs, device, cfg))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def train() -> None:
        batch = to_device(next(it), b.ctx, False)
        with b.autocast():
            loss = b.step_fn(b.model, batch, b.ctx)
        loss.backward()
        b.optimizer.step()
        b.optimizer.zero_grad(set_to_none=True)
        sync()

    print(f"{device}, torch intra-op threads {torch.get_num_threads()}", flush=True)
    _phase("loader", args.seconds, lambda: next(it), args.batch)
    _phase("train", args.seconds, train, args.batch)
    torch.set_num_threads(1)
    _phase("loader, 1 thread", args.seconds * 2 / 3, lambda: next(it), args.batch)


if __name__ == "__main__":
    main()
