"""Why the GPU is not producing: verdicts with their evidence and the first fix.

This automates the symptom -> cause -> fix tables of the field's troubleshooting guides: look at throughput against
the ceilings, at where the loop waits and what the CPUs do, at memory, and only then at utilization. Every verdict
names the numbers behind it. docs/diagnosis.md states each rule.
"""

from __future__ import annotations

from tunekit.diagnosis._run import run_verdicts
from tunekit.diagnosis._trial import trial_verdicts
from tunekit.diagnosis._verdicts import FIXES, VERDICTS, Verdict

__all__ = ["VERDICTS", "FIXES", "Verdict", "trial_verdicts", "run_verdicts"]
