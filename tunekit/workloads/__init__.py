"""Workloads: what a trial trains, assembled from ``module:attr`` import paths.

Built-in datasets: :mod:`tunekit.workloads.images` (JPEG decoding pipelines) and
:mod:`tunekit.workloads.synthetic` (workloads with a known answer, for tests and benchmarks).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["resolve", "check_paths"]


def resolve(path: str) -> Callable[..., Any]:
    """Import ``module:attr`` (attr may be dotted) and return the callable it names.

    Raises:
        ImportError: the module does not import.
        AttributeError: the attribute does not exist.
        TypeError: the attribute is not callable.
    """
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{attr} in module {module_name} is a {type(obj).__name__}, not a callable")
    return obj


def check_paths(paths: dict[str, str]) -> dict[str, str | None]:
    """For each key, None when its import path resolves to a callable, else why not (one line)."""
    problems: dict[str, str | None] = {}
    for key, path in paths.items():
        try:
            resolve(path)
            problems[key] = None
        except ModuleNotFoundError as exc:
            problems[key] = f"does not resolve: no module named '{exc.name}'"
        except AttributeError:
            module_name, _, attr = path.partition(":")
            problems[key] = f"does not resolve: module '{module_name}' has no attribute '{attr}'"
        except TypeError as exc:
            problems[key] = f"does not resolve to a callable: {exc}"
        except Exception as exc:  # noqa: BLE001 - a user module may raise anything on import
            first = (str(exc).splitlines() or [""])[0]
            problems[key] = f"failed to import: {type(exc).__name__}: {first}"
    return problems
