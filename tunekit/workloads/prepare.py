"""``python -m tunekit.workloads.prepare CONFIG_JSON``: build the dataset once before a sweep's first trial.

Datasets that build a cache on first use (synthetic_jpeg writes its JPEG files) would otherwise spend that time
inside the first trial, against its timeout. Prints the dataset's length (or that it is an iterable one).
"""

from __future__ import annotations

import json
import sys

from tunekit.workloads import resolve

if __name__ == "__main__":
    workload = json.loads(sys.argv[1])
    dataset = resolve(workload["dataset"])(**workload.get("dataset_args", {}))
    try:
        print(len(dataset))
    except TypeError:  # an IterableDataset has no length, and needs none: built is all that was asked
        print("an iterable of")
