"""The contract between the driver and a trial: what goes in (spec.json), what comes out (measurement.json), as
typed records (``_words``: the stages and modes; ``_knobs``; ``_spec``; ``_measurement``), and the names both sides
of the process boundary use: environment variables, the worker's command lines, the trial folder's files, the fork
server's messages (:mod:`tunekit.contract.process`).

Both sides import this package, so it imports nothing heavy. docs/measurement.md lists the measurement's fields (a
test holds the two equal).
"""

from tunekit.contract import process
from tunekit.contract._knobs import KNOB_NAMES, WORKER_ONLY, Knobs
from tunekit.contract._measurement import MEASUREMENT_VERSION, STATUSES, Measurement
from tunekit.contract._spec import TrialSpec
from tunekit.contract._unmeasured import (
    REQUIRED_FIELDS,
    failed_measurement,
    measurement_problem,
    skipped_measurement,
)
from tunekit.contract._words import Mode, Stage, Strategy

__all__ = [
    "Stage",
    "Mode",
    "Strategy",
    "Knobs",
    "TrialSpec",
    "Measurement",
    "MEASUREMENT_VERSION",
    "STATUSES",
    "KNOB_NAMES",
    "WORKER_ONLY",
    "failed_measurement",
    "skipped_measurement",
    "measurement_problem",
    "REQUIRED_FIELDS",
    "process",
]
