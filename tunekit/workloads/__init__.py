"""Workloads: what a trial trains, assembled from ``module:attr`` import paths.

Built-in datasets: :mod:`tunekit.workloads.images` (JPEG decoding pipelines) and
:mod:`tunekit.workloads.synthetic` (workloads with a known answer, for tests and benchmarks).
"""

from __future__ import annotations

import importlib
import os
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
    module_name, _, attr = path.rpartition(":")
    obj: Any = _load_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{attr} in module {module_name} is a {type(obj).__name__}, not a callable")
    return obj


def _load_file(path: str) -> Any:
    """A Python file as a module of its own name (not ``__main__``: a script's ``if __name__ == "__main__":`` block
    does not run), loaded once per process."""
    import importlib.util
    import os
    import sys

    full = os.path.abspath(os.path.expanduser(path))
    name = "tunekit_user_" + "".join(c if c.isalnum() else "_" for c in full)
    if name in sys.modules:
        return sys.modules[name]
    if not os.path.isfile(full):
        raise ModuleNotFoundError(f"no file {full}", name=path)
    spec = importlib.util.spec_from_file_location(name, full)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(full))  # the script's own imports, as when it runs
    spec.loader.exec_module(module)
    return module


def check_paths(paths: dict[str, str]) -> dict[str, str | None]:
    """For each key, None when its import path resolves to a callable, else why not (one line)."""
    problems: dict[str, str | None] = {}
    for key, path in paths.items():
        try:
            resolve(path)
            problems[key] = None
        except ModuleNotFoundError as exc:
            # say where it looked: a module (or a relative file) is found from the folder tunekit runs in
            where = (
                f"a file path is relative to the folder tunekit runs in, {os.getcwd()}"
                if path.rpartition(":")[0].endswith(".py")
                else f"looked in {os.getcwd()} (the folder tunekit runs in) and on PYTHONPATH; run tunekit from the "
                "folder that holds it, or add that folder to PYTHONPATH"
            )
            problems[key] = f"does not resolve: no module named '{exc.name}' ({where})"
        except AttributeError:
            module_name, _, attr = path.rpartition(":")
            problems[key] = f"does not resolve: module '{module_name}' has no attribute '{attr}'"
        except TypeError as exc:
            problems[key] = f"does not resolve to a callable: {exc}"
        except Exception as exc:  # noqa: BLE001 - a user module may raise anything on import
            first = (str(exc).splitlines() or [""])[0]
            problems[key] = f"failed to import: {type(exc).__name__}: {first}"
    return problems
