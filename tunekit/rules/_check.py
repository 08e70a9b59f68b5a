"""``tunekit check``: what changed on the machine a committed recommendation was tuned on (the test of its figure is
``rules.check_test``, with the other evidence rules)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MACHINE_HARDWARE: tuple[str, ...] = ("device", "gpu", "gpus", "cpu", "cpus", "memory_bytes")
"""The keys of a machine fingerprint (``env.machine_fingerprint``) that make another machine: the device the trial
ran on, the GPU model(s) and count, the CPU model and usable count, the host memory. The host name is not one: the
runners of a CI pool, or the VMs of one type, are one machine to a recommendation."""


MACHINE_SOFTWARE: tuple[str, ...] = ("torch", "cuda", "driver", "python")
"""The keys of a fingerprint that the same machine may change (an upgrade): compared, and named, not refused."""


SAME_MEMORY = 0.05
"""Host memory that differs by at most this share is the same (a VM type's RAM varies by the firmware's reserve;
another machine type differs by far more)."""


def machine_changes(
    recorded: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[list[tuple[str, Any, Any]], list[tuple[str, Any, Any]]]:
    """What differs between the machine a recommendation was tuned on and this one, as ``(key, recorded, current)``:
    the hardware (:data:`MACHINE_HARDWARE`: another machine, on which the recorded figure does not apply) and the
    software (:data:`MACHINE_SOFTWARE`: the same machine upgraded). A key that either side does not know (None, or
    missing from an older recommendation) is not compared; host memory within :data:`SAME_MEMORY` is the same."""

    def differs(key: str) -> bool:
        old, new = recorded.get(key), current.get(key)
        if old is None or new is None:
            return False
        if key == "memory_bytes":
            return abs(float(new) - float(old)) > SAME_MEMORY * max(float(old), 1.0)
        return old != new

    return (
        [(k, recorded.get(k), current.get(k)) for k in MACHINE_HARDWARE if differs(k)],
        [(k, recorded.get(k), current.get(k)) for k in MACHINE_SOFTWARE if differs(k)],
    )
