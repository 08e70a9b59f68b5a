"""What reading host memory as PSS costs a CUDA training process: one psutil memory_full_info (smaps_rollup, a
walk of every mapping under the process's memory-map lock) timed, then ResNet-101 training steps (bf16, batch 128,
a fresh pinned batch copied in per step) with and without a thread that reads it once a second, alternated over
six rounds. Needs a CUDA device.

    python benchmarks/host_sampling_cost.py

On one H200 (results/h200-script-mode-2026-12-02/host-sampling-cost.txt): 17.6 ms per read; steps 3.6 % slower
sampled (median of the rounds). Why the trial monitor reads PSS only every 10 s inside the windows.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import psutil
import torch
import torchvision

BATCH = 128


def _training_step(dev: torch.device) -> Callable[[], None]:
    model = torchvision.models.resnet101().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(BATCH, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        batch = torch.empty(BATCH * 3 * 224 * 224, pin_memory=True)  # a fresh pinned batch (the host allocator)
        x.copy_(batch.view(BATCH, 3, 224, 224).to(dev, non_blocking=True))
        torch.cuda.synchronize()

    return step


def _mean_step_s(step: Callable[[], None], steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.fmean(times)


def main() -> None:
    step = _training_step(torch.device("cuda"))
    for _ in range(5):
        step()
    me = psutil.Process()
    with open("/proc/self/maps") as maps:
        print("VMAs in /proc/self/maps:", sum(1 for _ in maps))
    reads = []
    for _ in range(10):
        t0 = time.perf_counter()
        me.memory_full_info()
        reads.append(time.perf_counter() - t0)
    print(
        f"memory_full_info of the CUDA training process: median {statistics.median(reads) * 1e3:.2f} ms, "
        f"max {max(reads) * 1e3:.2f} ms"
    )

    stop = threading.Event()

    def sampler() -> None:  # what the trial monitor did: a PSS read every second
        while not stop.is_set():
            me.memory_full_info()
            stop.wait(1.0)

    res: dict[str, list[float]] = {"bare": [], "sampled": []}
    for rnd in range(6):
        for mode in ("bare", "sampled") if rnd % 2 == 0 else ("sampled", "bare"):
            thread = threading.Thread(target=sampler, daemon=True)
            if mode == "sampled":
                stop.clear()
                thread.start()
            res[mode].append(_mean_step_s(step, 60))
            if mode == "sampled":
                stop.set()
                thread.join()
        print(
            f"round {rnd}: mean step bare {res['bare'][-1] * 1e3:.2f} ms, sampling every 1 s "
            f"{res['sampled'][-1] * 1e3:.2f} ms",
            flush=True,
        )
    bare, sampled = statistics.median(res["bare"]), statistics.median(res["sampled"])
    print(f"median of rounds: bare {bare * 1e3:.2f} ms, sampled {sampled * 1e3:.2f} ms, {sampled / bare - 1:+.2%}")


if __name__ == "__main__":
    main()
