"""Every rule the sweep decides by, defined once with its named thresholds.

The plan, the analysis, the diagnosis, the environment warnings and the benchmarks import these; none re-derives
them.
docs/rules.md explains each with the measurements behind it.

Two kinds of noise appear here and nowhere else:

* the **run's band**, ``max(tolerance, run noise, run-to-run spread)``: how far below the best a config may fall
  and still count as "within noise" of it. The run noise is the median window CV of the comparable trials at or
  above their median throughput, where the knee and the best compete: one erratic trial widens the band neither for
  itself nor for the rest once that half holds three trials, and the steady, data-starved low end does not narrow
  it. The spread is what the repeats of the configs a decision rests on measured between runs.
* a **trial's margin**, ``max(tolerance, the trials' own window CVs)``: how much one or two single measurements may
  be off, used where one trial is compared with another (a ceiling's upper bound, pinned against unpinned).

By concept: ``_selection`` (the knee's band, gains, what a trial must reach), ``_measurement`` (a trial's rate,
its interval, its windows' stop and settling), ``_environment`` (a busy host, warnings), ``_diagnosis`` (the
verdicts' thresholds and predicates, FLOPs, scaling) and ``_check`` (a committed recommendation against a fresh
trial). Import them from here: ``from tunekit import rules; rules.band(...)``.
"""

from tunekit.rules._check import (
    MACHINE_HARDWARE,
    MACHINE_SOFTWARE,
    SAME_MEMORY,
    check_margin,
    machine_changes,
    rate_check,
)
from tunekit.rules._diagnosis import (
    CPU_BUSY,
    CPU_SATURATED,
    FLOP_BACKWARD_BAND,
    MATMUL_SHARE_HIGH,
    MEMORY_WALL_MARGIN,
    NEAR_CEILING,
    NO_WAIT,
    NOISY_CV,
    OVERHEAD_RATIO,
    SCALING_HEALTHY,
    STARVED_WAIT,
    STREAM_FULL,
    SYNC_SHARE,
    WORKER_WAITING,
    communication_bound,
    disturbed,
    flop_share,
    flops_per_item,
    flops_uncertain,
    input_bound,
    keeps_cpus_busy,
    machine_noise,
    of_ceiling,
    peak_trial,
    scaling_efficiency,
    waits_on_data,
    worker_core_share,
)
from tunekit.rules._environment import (
    BENIGN_THROTTLE,
    BUSY_HOST,
    DISTURBED_BAND,
    HOST_MEMORY_WARN,
    HOT_GPU_C,
    SHM_WARN,
    busy_host,
    other_cpu_share,
)
from tunekit.rules._measurement import (
    CLAIM_PRECISION,
    epoch_rate,
    rate_interval,
    settling,
    window_rate,
    window_stop,
)
from tunekit.rules._selection import (
    KNEE_STAGES,
    MIN_POINTS,
    band,
    can_reach,
    changes_result,
    fits,
    gain_interval,
    gain_margin,
    knee_stages,
    needed,
    past_memory_limit,
    run_noise,
    run_spread,
    runs_interval,
    trial_margin,
)

__all__ = [
    "KNEE_STAGES",
    "MIN_POINTS",
    "NEAR_CEILING",
    "OVERHEAD_RATIO",
    "STARVED_WAIT",
    "NO_WAIT",
    "STREAM_FULL",
    "NOISY_CV",
    "CLAIM_PRECISION",
    "changes_result",
    "CPU_SATURATED",
    "CPU_BUSY",
    "WORKER_WAITING",
    "MEMORY_WALL_MARGIN",
    "HOST_MEMORY_WARN",
    "SHM_WARN",
    "HOT_GPU_C",
    "BENIGN_THROTTLE",
    "fits",
    "past_memory_limit",
    "run_noise",
    "run_spread",
    "runs_interval",
    "band",
    "gain_margin",
    "gain_interval",
    "needed",
    "trial_margin",
    "can_reach",
    "knee_stages",
    "of_ceiling",
    "SYNC_SHARE",
    "SCALING_HEALTHY",
    "scaling_efficiency",
    "communication_bound",
    "rate_interval",
    "window_rate",
    "epoch_rate",
    "settling",
    "window_stop",
    "input_bound",
    "worker_core_share",
    "waits_on_data",
    "machine_noise",
    "disturbed",
    "keeps_cpus_busy",
    "BUSY_HOST",
    "DISTURBED_BAND",
    "other_cpu_share",
    "busy_host",
    "MATMUL_SHARE_HIGH",
    "FLOP_BACKWARD_BAND",
    "flops_uncertain",
    "flops_per_item",
    "peak_trial",
    "flop_share",
    "SAME_MEMORY",
    "MACHINE_HARDWARE",
    "MACHINE_SOFTWARE",
    "machine_changes",
    "check_margin",
    "rate_check",
]
