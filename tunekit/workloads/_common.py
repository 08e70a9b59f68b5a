"""Argument checks shared by the built-in workloads."""

from __future__ import annotations


def validate(minimum: int = 1, **values: int) -> None:
    """Raise ValueError naming the first argument that is not an integer >= ``minimum``."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def normalise_index(index: int, length: int) -> int:
    """A dataset index with Python's negative indexing, or IndexError."""
    index = int(index)
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for dataset of length {length}")
    return index
