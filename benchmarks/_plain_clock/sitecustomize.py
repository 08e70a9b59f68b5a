"""The plain clock of benchmarks/script_overhead.py: on PYTHONPATH, it times a training script's first DataLoader
iterated with autograd enabled, nothing else — a timestamp per batch request, no meter, no synchronisation, no
monitor — and prints the rate of batches SKIP+1 ... SKIP+COUNT (items = the loader's batch size), then ends the
script. Off unless TUNEKIT_PLAIN_CLOCK="SKIP COUNT" is set; TUNEKIT_PLAIN_LOADER (JSON) sets the loader attributes
the trial set (workers, prefetch, pinning, persistent workers), so both run the same loader."""

import os

if os.environ.get("TUNEKIT_PLAIN_CLOCK"):
    import json
    import sys
    import time

    import torch
    from torch.utils.data import DataLoader

    _skip, _count = (int(v) for v in os.environ["TUNEKIT_PLAIN_CLOCK"].split())
    _settings = json.loads(os.environ.get("TUNEKIT_PLAIN_LOADER") or "{}")
    _original = DataLoader.__iter__
    _chosen = []

    _state = {"seen": 0, "start": 0.0}  # across the script's epochs: its next iter() goes on counting

    def _sync():
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def _timed(loader):
        for batch in _original(loader):
            if _state["seen"] == _skip:
                _sync()
                _state["start"] = time.perf_counter()
            if _state["seen"] == _skip + _count:
                _sync()
                rate = _count * loader.batch_size / (time.perf_counter() - _state["start"])
                sys.stderr.write(f"plain-clock rate {rate:.3f}\n")
                sys.stderr.flush()
                os._exit(0)
            _state["seen"] += 1
            yield batch

    def _iter(self):
        if not _chosen and torch.is_grad_enabled():
            _chosen.append(self)
            for key, value in _settings.items():
                object.__setattr__(self, key, value)
        return _timed(self) if _chosen and _chosen[0] is self else _original(self)

    DataLoader.__iter__ = _iter
