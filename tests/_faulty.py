"""A tiny CPU training script with a ``--fault`` switch: each fault is something real scripts do that a trial's
process boundary must survive (the tests of tests/launch/ and tests/worker/script/ run it in script mode).

Faults:
  setsid      run a Python child to its end, and start one in a session of its own that outlives the script (as
              wandb's and tensorboard's helpers do)
  daemon      double-fork a daemon (setsid, fork again, the middle process exits) that outlives the script
  workers1    hard-code ``num_workers=1`` whatever ``-j`` says
  spawn-crash evaluate with a spawn-context DataLoader before training, train with a forkserver-context one (Python
              3.14's default on Linux), then crash in training
  exit5       ``os._exit(5)`` after two training batches
  gil         after training starts, hold the GIL in one long C call (the sweep is then killed)
  nobatch     build the training DataLoader, iterate it, and exit before its first batch arrives
  threads2    set its own intra-op thread count (2) before training
  stream      train on an IterableDataset without a length
  none        no fault
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Stream(torch.utils.data.IterableDataset):
    """Samples without a length, as a streamed corpus gives them."""

    def __iter__(self):
        i = 0
        while True:
            time.sleep(0.002)
            yield torch.full((8,), float(i % 7)), torch.tensor(i % 2)
            i += 1


class Squares(Dataset):
    def __init__(self, n: int = 1 << 20, wait_s: float = 0.0):  # an epoch outlasts every trial
        self.n, self.wait_s = n, wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.wait_s:
            time.sleep(self.wait_s)
        x = torch.full((8,), float(i % 7))
        return x, torch.tensor(i % 2)


def _linger(seconds: int) -> str:
    """A helper process that outlives the script: it writes its pid beside the script, then sleeps."""
    code = f"import os, time; open({PIDS!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep({seconds})"
    return code


PIDS = os.environ.get("FAULTY_PIDS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "faulty.pids"))


def _daemon() -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(PIDS, "a") as out:
                out.write(f"{os.getpid()}\n")
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0,):  # keeps stdout/stderr: the trial's output pipe, as a careless daemon does
                os.dup2(devnull, fd)
            time.sleep(600)
            os._exit(0)
        os._exit(0)
    os.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-j", type=int, default=0)
    parser.add_argument("-b", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--fault", default="none")
    parser.add_argument("--pin", type=lambda v: v.lower() in ("1", "true"), default=False)
    parser.add_argument("--cuda", action="store_true", help="train on the GPU (pinned copies with --pin 1)")
    args = parser.parse_args()
    fault = args.fault
    if fault == "setsid":
        out = subprocess.run([sys.executable, "-c", "print('child ok')"], capture_output=True, text=True)
        print(out.stdout.strip())
        subprocess.Popen([sys.executable, "-c", _linger(600)], start_new_session=True)
    elif fault == "daemon":
        _daemon()
    elif fault == "threads2":
        torch.set_num_threads(2)
    device = torch.device("cuda" if args.cuda else "cpu")
    model = torch.nn.Linear(8, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if fault == "spawn-crash":
        with torch.no_grad():
            for x, _ in DataLoader(Squares(64), batch_size=16, num_workers=1, multiprocessing_context="spawn"):
                model(x.to(device))
    workers = 1 if fault == "workers1" else args.j
    context = "forkserver" if fault == "spawn-crash" and workers else None
    data = Stream() if fault == "stream" else Squares(wait_s=0.002)
    train = DataLoader(
        data,
        batch_size=args.b,
        num_workers=workers,
        shuffle=fault != "stream",
        multiprocessing_context=context,
        pin_memory=args.pin,
    )
    if fault == "nobatch":
        iter(train)
        os._exit(0)
    step = 0
    for _ in range(args.epochs):
        for x, y in train:
            x, y = x.to(device, non_blocking=args.pin), y.to(device, non_blocking=args.pin)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if fault == "spawn-crash" and step == 3:
                raise RuntimeError("faulty: a crash in training")
            if fault == "exit5" and step == 2:
                os._exit(5)
            if fault == "gil" and step == 3:
                with open(PIDS, "a") as out:
                    out.write(f"gil {os.getpid()}\n")
                sum(range(10**12))  # one long C call: the GIL is never released


if __name__ == "__main__":
    main()
