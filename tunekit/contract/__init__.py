"""The contract between the driver and a trial: what goes in (spec.json), what comes out (measurement.json)
(``_records``), and the names both sides of the process boundary use: environment variables, the worker's command
lines, the trial folder's files, the fork server's messages (:mod:`tunekit.contract.process`).

Both sides import this package, so it imports nothing heavy. docs/measurement.md lists the measurement's fields (a
test holds the two equal).
"""

from tunekit.contract import process
from tunekit.contract._records import (
    KNOB_NAMES,
    MEASUREMENT_VERSION,
    REQUIRED_FIELDS,
    STATUSES,
    Knobs,
    Measurement,
    Mode,
    Stage,
    TrialSpec,
    failed_measurement,
    measurement_problem,
    skipped_measurement,
)

__all__ = ["Stage", "Mode", "Knobs", "TrialSpec", "Measurement", "MEASUREMENT_VERSION", "STATUSES", "KNOB_NAMES",
           "failed_measurement", "skipped_measurement", "measurement_problem", "REQUIRED_FIELDS", "process"]
