from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunekit.config import Config
from tunekit.contract import Knobs, Mode, Stage
from tunekit.records import TrialRow


@dataclass(frozen=True)
class Request:
    """One trial the plan wants: its stage, mode and knobs. Equal requests are the same trial."""

    stage: Stage
    mode: Mode
    knobs: Knobs
    skip: str | None = None
    """Why this trial need not run (it is recorded as skipped with this reason), or None."""
    bound: tuple[float, int] | None = None
    """A skipped trial's upper bound, as the plan inferred it: the throughput (``unit``/s) it cannot exceed and the
    trial that shows it (a loader ceiling, a count that fell out of the band), drawn at that height in the plots."""
    run: int = 0
    """0 for a config's first measurement, k for its k-th repeat (``TrialSpec.run``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage", Stage(self.stage))  # a word given for a stage must name one
        object.__setattr__(self, "mode", Mode(self.mode))

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.stage, self.mode, self.knobs, self.run)

    def skipped(self, reason: str, bound: tuple[float, int] | None = None) -> Request:
        return Request(self.stage, self.mode, self.knobs, skip=reason, bound=bound, run=self.run)


def pending(requests: list[Request], rows: list[TrialRow]) -> list[Request]:
    """The requests that have no finished trial yet (asked for and run with other knobs is finished too)."""
    finished = {r.key for r in rows} | {r.asked_key for r in rows if r.asked_key is not None}
    return [q for q in requests if q.key not in finished]


def pins(cfg: Config, cuda: bool) -> list[bool]:
    """The pin_memory values to try, unpinned first (pinned is the costlier)."""
    # Pinned memory only means something with a CUDA device; on the CPU it would be the same trial twice.
    return sorted({p for p in cfg.search.pin_memory if cuda or not p}) or [False]


def base_knobs(cfg: Config) -> dict[str, Any]:
    """The knobs a stage holds fixed until a later stage varies them."""
    s = cfg.search
    return {
        "prefetch_factor": s.prefetch_factor[0],
        "grad_accum": 1 if s.target_effective_batch else s.grad_accum[0],
        "compile": "none" if "none" in s.compile else s.compile[0],
    }
