"""The meter, shared by both trial modes: what one measurement is, around any stream of batches and the step that
consumes them (``_meter``: the first step, the fill set aside, warm-up, windows, epoch boundaries; ``_reading``: its
settings and what it records), the loader's batches it reads (``_loader``) and the process tree's CPU, memory and
GPU samples beside it (``_monitor``)."""

from tunekit.worker.meter._loader import JOIN_S, LoaderBatches, digest, epoch_batches, tensors
from tunekit.worker.meter._meter import EPOCH_WINDOWS, MIN_WINDOW_STEPS, Meter, checked_count
from tunekit.worker.meter._reading import (
    BOUNDARY_WAIT,
    FEW_BOUNDARIES,
    MeterSettings,
    OneProcess,
    Ranks,
    Reading,
    SourceEnded,
    Window,
    summarise,
    whole_epoch,
)

__all__ = [
    "Meter",
    "checked_count",
    "MeterSettings",
    "OneProcess",
    "Ranks",
    "Reading",
    "SourceEnded",
    "Window",
    "summarise",
    "whole_epoch",
    "LoaderBatches",
    "digest",
    "epoch_batches",
    "tensors",
    "JOIN_S",
    "MIN_WINDOW_STEPS",
    "EPOCH_WINDOWS",
    "BOUNDARY_WAIT",
    "FEW_BOUNDARIES",
]
