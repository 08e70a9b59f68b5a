"""Import paths checked in a subprocess (it imports torch; this process never does)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable

from tunekit.config._schema import Config, Workload, _show
from tunekit.contract import process as names

Resolver = Callable[["Config", dict[str, str]], "dict[str, str | None] | str"]
"""Checks import paths for a config (its ``to_dict()``): each path's problem or None, or why the check failed."""


IMPORT_PATH_KEYS = tuple(f.name for f in dataclasses.fields(Workload) if f.metadata.get("check", {}).get("import_path"))
"""The workload keys that name a ``module:attr`` import path."""


def _check_import_paths(cfg: Config, source: str, resolve: Resolver | None = None) -> list[str]:
    if cfg.script is not None:
        paths = {"script.count": cfg.script.count} if cfg.script.count else {}
    elif cfg.workload is None:
        return []
    else:
        paths = {
            f"workload.{key}": getattr(cfg.workload, key)
            for key in IMPORT_PATH_KEYS
            if getattr(cfg.workload, key) is not None
        }
    if not paths:
        return []
    if resolve is not None and cfg.script is None:
        found = resolve(cfg, paths)
        if isinstance(found, str):
            return [f"{source}: workload: could not check import paths: {found}"]
        return [f"{source}: {key}: {_show(paths[key])} {msg}" for key, msg in found.items() if msg]
    cmd = [sys.executable, "-m", names.WORKER_MODULE, names.RESOLVE, json.dumps(paths)]  # imports torch: not here
    # a script's count resolves where the script runs (its folder is on its path), a factory's where tunekit does
    cwd = cfg.script.cwd if cfg.script is not None else None
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return [f"{source}: workload: could not check import paths: {tail}"]
    problems = json.loads(proc.stdout.strip().splitlines()[-1])
    return [f"{source}: {key}: {_show(paths[key])} {msg}" for key, msg in problems.items() if msg]
