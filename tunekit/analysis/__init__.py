"""From finished trials to decisions: the knee, the batch for the end-to-end stages, and the trials table.

Selection: among completed end-to-end trials that fit the headroom limit, ordered by cost (workers, then prefetch,
pin_memory, compile time, then batch and accumulation), the knee is the cheapest config whose throughput is within
the run's band of the best (:mod:`tunekit.rules`). Too few points, or none completed, gives no recommendation and
a sentence why — never a guess. A config measured more than once (the repeats of the configs a decision rests on)
is one row of its runs pooled (:func:`pooled`), whose spread widens the band. One job's sweeps on several machine
types compared, each type's knee with its rate and items per unit of money: :func:`compare`.
"""

from __future__ import annotations

from tunekit.analysis._compare import Cheapest, Comparison, TypeFigures, TypeRun, compare, job_difference
from tunekit.analysis._frame import trials_frame
from tunekit.analysis._knee import (
    Choice,
    choose_batch,
    cost_key,
    defaults_trial,
    select,
    select_knee,
    single_gpu_twin,
    working_knee,
)
from tunekit.analysis._runs import Evidence, pooled

__all__ = [
    "Choice",
    "select",
    "select_knee",
    "choose_batch",
    "cost_key",
    "defaults_trial",
    "single_gpu_twin",
    "trials_frame",
    "pooled",
    "Evidence",
    "working_knee",
    "TypeRun",
    "TypeFigures",
    "Cheapest",
    "Comparison",
    "compare",
    "job_difference",
]
