"""The contract between the driver and a trial: what goes in (spec.json) and what comes out (measurement.json).

Both sides import this module, so it imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Knobs",
    "TrialSpec",
    "STATUSES",
    "KNOB_NAMES",
    "write_json_atomic",
    "write_text_atomic",
    "read_json",
    "failed_measurement",
]

Status = Literal["ok", "oom", "timeout", "crashed", "illegal_access", "bad_output", "skipped"]
STATUSES: tuple[str, ...] = ("ok", "oom", "timeout", "crashed", "illegal_access", "bad_output", "skipped")
Mode = Literal["train", "compute", "loader"]


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

    def __post_init__(self) -> None:
        if self.num_workers == 0 and self.prefetch_factor is not None:
            object.__setattr__(self, "prefetch_factor", None)

    @property
    def non_blocking(self) -> bool:
        return self.pin_memory

    @property
    def effective_batch(self) -> int:
        return self.batch_size * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs))


@dataclass(kw_only=True)
class TrialSpec:
    """Everything a trial worker needs; written to trials/<n>/spec.json by the launcher."""

    number: int
    """Trial number within the run."""
    stage: str
    """Sweep stage that asked for this trial (``single`` for ``tunekit trial``)."""
    mode: Mode
    """train (end to end), compute (model on a pre-staged device batch) or loader (the loader alone)."""
    knobs: Knobs
    """The settings under test."""
    config: dict[str, Any]
    """The resolved config (Config.to_dict())."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["knobs"] = self.knobs.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        return cls(
            number=data["number"],
            stage=data["stage"],
            mode=data["mode"],
            knobs=Knobs(**data["knobs"]),
            config=data["config"],
        )


def write_text_atomic(path: str | os.PathLike[str], text: str | bytes) -> None:
    """Write a file so that readers see the old file or the whole new one, never a torn write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode() if isinstance(text, str) else text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path) as fh:
        return json.load(fh)


def failed_measurement(spec: TrialSpec, status: str, reason: str, **extra: Any) -> dict[str, Any]:
    """A measurement for a trial that produced no numbers: a failed trial is data, with its reason."""
    assert status in STATUSES and status != "ok", status
    return {
        "status": status,
        "reason": reason,
        "number": spec.number,
        "stage": spec.stage,
        "mode": spec.mode,
        "params": spec.knobs.to_dict(),
        "samples_per_s": None,
        **extra,
    }
