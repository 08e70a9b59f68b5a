"""The knobs of one trial, as a frozen record: what spec.json and measurement.json's ``params`` hold."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """One point of the search space: the settings a trial runs with."""

    num_workers: int = 0
    """DataLoader worker processes."""
    prefetch_factor: int | None = None
    """Batches prefetched per worker; None when num_workers is 0."""
    pin_memory: bool = False
    """Pinned host memory, paired with non_blocking host-to-device copies."""
    batch_size: int = 32
    """Micro-batch size."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    compile: str = "none"
    """torch.compile mode, or none."""
    ranks: int = 1
    """Training processes (one per GPU, DDP) the trial runs on, all nodes together; num_workers and prefetch_factor
    are per rank. 1 is a single process without torch.distributed."""
    threads: int | None = None
    """Intra-op threads of the training process (``torch.set_num_threads``); None leaves PyTorch's default (one
    per core)."""
    worker_threads: int | None = None
    """Intra-op threads of each loader worker (``torch.set_num_threads`` in the worker, before the workload's own
    ``worker_init_fn``); None leaves PyTorch's one thread per worker."""
    extra: tuple[tuple[str, Any], ...] = ()
    """The user-defined knobs (``search.extra``) set to other values than their baseline, as sorted
    ``(config key, value)`` pairs; () runs every one at its baseline."""

    def __post_init__(self) -> None:
        for name in WORKER_ONLY:
            value = getattr(self, name)
            if self.num_workers == 0 and value is not None:
                raise ValueError(
                    f"Knobs.{name} = {value!r} with num_workers = 0: a loader without workers has no {name} "
                    "(None; Knobs.of leaves it out)"
                )
        pairs = self.extra.items() if isinstance(self.extra, dict) else self.extra  # JSON gives lists of lists
        object.__setattr__(self, "extra", tuple(sorted((str(k), v) for k, v in pairs)))

    @classmethod
    def of(cls, **values: Any) -> Knobs:
        """Knobs made from values a search or a recorded config gives for every knob (the search's first prefetch
        factor, say, beside 0 workers): the worker-only knobs are left out when there are no workers. The plain
        constructor refuses them instead."""
        if not values.get("num_workers"):
            values = {**values, **dict.fromkeys(WORKER_ONLY)}
        return cls(**values)

    def without_workers(self) -> Knobs:
        """These knobs with the loading in the main process (the worker-only knobs left out)."""
        return dataclasses.replace(self, num_workers=0, **dict.fromkeys(WORKER_ONLY))

    @property
    def non_blocking(self) -> bool:
        return self.pin_memory

    @property
    def effective_batch(self) -> int:
        return self.batch_size * self.grad_accum

    @property
    def loader_defaults(self) -> bool:
        """PyTorch's DataLoader defaults: loading in the main process, no pinned memory."""
        return self.num_workers == 0 and not self.pin_memory

    @property
    def pytorch_defaults(self) -> bool:
        """PyTorch's defaults for the job's own pipeline: the loader's (:attr:`loader_defaults`), eager, no user knob
        set and no thread count (a 0-worker trial of another decode path is another pipeline): what every report's
        speed-up over the defaults is over (``analysis.defaults_trial``)."""
        return (
            self.loader_defaults
            and self.compile == "none"
            and not self.extra
            and self.threads is None
            and self.worker_threads is None
        )

    def describe(self) -> str:
        """The knobs in words, e.g. ``8 workers, prefetch 2, pinned, batch 256``."""
        parts = [
            f"{self.num_workers} workers"
            if self.ranks == 1
            else f"{self.num_workers} workers per rank x {self.ranks} ranks"
        ]
        if self.num_workers:
            parts.append(f"prefetch {self.prefetch_factor}")
        parts.append("pinned" if self.pin_memory else "not pinned")
        parts.append(f"batch {self.batch_size}")
        if self.grad_accum > 1:
            parts.append(f"accumulation {self.grad_accum}")
        if self.compile != "none":
            parts.append(f"compile {self.compile}")
        if self.threads is not None:
            parts.append(f"{self.threads} torch threads")
        if self.worker_threads is not None:
            parts.append(f"{self.worker_threads} threads per worker")
        parts.extend(f"{key.removeprefix('workload.')}={value}" for key, value in self.extra)
        return ", ".join(parts)

    def with_extra(self, key: str, value: Any, baseline: Any) -> Knobs:
        """These knobs with one user-defined knob set (dropped from ``extra`` at its baseline)."""
        pairs = {k: v for k, v in self.extra if k != key}
        if value != baseline:
            pairs[key] = value
        return dataclasses.replace(self, extra=tuple(pairs.items()))

    def to_dict(self) -> dict[str, Any]:
        """The knobs as plain data (``extra`` as a mapping of config key to value), for JSON, YAML and optuna."""
        data = dataclasses.asdict(self)
        data["extra"] = dict(self.extra)
        return data


WORKER_ONLY: tuple[str, ...] = ("prefetch_factor", "worker_threads")
"""The knobs that only a loader with workers has: None when num_workers is 0."""

KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs) if f.name != "extra")
"""The built-in knobs (``tunekit trial --set``); a user-defined knob is set by its config key."""
