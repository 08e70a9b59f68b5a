"""Strict loading: YAML read, dotted overrides, the validation engine that walks the dataclasses and collects every
problem, then the cross checks and the import paths."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from tunekit.command import split_command
from tunekit.config._checks import _check_startable, _cross_checks, _launch_from_torchrun
from tunekit.config._imports import Resolver, _check_import_paths
from tunekit.config._schema import _IMPORT_PATH, Config, Script, Search, _kind, _show, auto_workers, cpu_count
from tunekit.errors import ConfigError


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set ``value`` at a dotted key path (``trial.window_s``) of unvalidated config data, making mappings on the way.

    Raises:
        ConfigError: a part of the path is not a mapping.
    """
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError([f"{key}: {part} is not a mapping in the config"])
    node[last] = value


def load(
    path: str | os.PathLike[str] | dict[str, Any],
    *,
    check_imports: bool = True,
    overrides: dict[str, Any] | None = None,
    resolve: Resolver | None = None,
) -> Config:
    """Load and validate a config file (or already-parsed config data), with dotted-key overrides applied first.

    Args:
        path: the YAML file, or a mapping of config keys.
        check_imports: also resolve every import path (in a subprocess, so this process never imports torch).
        overrides: ``{"trial.window_s": 10, ...}``, applied before validation.
        resolve: runs the import-path check (a factory config's; ``launch.resolve_paths`` runs it through the
            sweep's fork server); default: a subprocess of its own.

    Raises:
        ConfigError: listing every problem found, one line each.
    """
    if isinstance(path, dict):
        raw: Any = json.loads(json.dumps(path, default=_import_path))  # a copy; callables become import paths
        source, name = "<config>", "run"
    else:
        raw, source, name = read_yaml(path), str(path), Path(path).stem
    if overrides:
        if not isinstance(raw, dict):
            raise ConfigError([f"{source}: the top level must be a mapping of keys, got {_kind(raw)}"])
        for key, value in overrides.items():
            set_dotted(raw, key, json.loads(json.dumps(value, default=_import_path)))
    return from_dict(raw, source=source, check_imports=check_imports, default_name=name, resolve=resolve)


def _import_path(obj: Any) -> str:
    """A callable given in place of an import path (Python API): ``module:qualname``, or ``file.py:qualname`` for
    one defined in the script being run, which the trial process loads by path (its ``__main__`` block does not
    run there)."""
    if not callable(obj):
        raise ConfigError([f"<config>: {obj!r} is neither plain data nor a callable"])
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or "<locals>" in name or "<lambda>" in name:
        raise ConfigError(
            [f"<config>: {name or obj!r} is not importable: define it at the top level of a module or of your script"]
        )
    if module == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if not main_file:
            raise ConfigError([f"<config>: {name} lives in an interactive session; define it in a file"])
        return f"{os.path.abspath(main_file)}:{name}"
    return f"{module}:{name}"


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The parsed YAML of a config file, unvalidated.

    Raises:
        ConfigError: the file cannot be read or is not valid YAML (one line, with the position).
    """
    label = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError([f"{label}: cannot read config: {exc.strerror or exc}"]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{label}: {where}invalid YAML: {problem}"]) from None


def from_dict(
    raw: Any,
    *,
    source: str = "<dict>",
    check_imports: bool = False,
    default_name: str = "run",
    resolve: Resolver | None = None,
) -> Config:
    """Validate already-parsed data (see :func:`load`)."""
    errors: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}: the top level must be a mapping of keys, got {_kind(raw)}"])
    raw = dict(raw)
    raw.setdefault("name", default_name)
    cfg = _load_dataclass(Config, raw, "", source, errors)
    if cfg is not None:
        cfg.source = source
        _launch_from_torchrun(cfg, raw, source, errors)
        search = raw.get("search")
        if isinstance(search, dict) and search.get("num_workers") == "auto" and cfg.launch.nproc_per_node > 1:
            # per rank: the ranks of a node share its CPUs
            cfg.search.num_workers = auto_workers(max(1, cpu_count() // cfg.launch.nproc_per_node))
        _cross_checks(cfg, source, errors)
        if cfg.script is not None:  # the command runs where the config lives, unless it says otherwise
            base = Path(source).parent if source not in ("<dict>", "<config>") else Path.cwd()
            cfg.script.cwd = str((base / (cfg.script.cwd or ".")).resolve())
        if check_imports:  # every problem in one pass, the import paths' and the command's too
            errors.extend(_check_import_paths(cfg, source, resolve))
            if cfg.script is not None and cfg.script.command:
                errors.extend(_check_startable(cfg.script, source))
    if errors:
        raise ConfigError(errors)
    assert cfg is not None
    return cfg


# --- validation engine -------------------------------------------------------------------------------------


def _load_dataclass(cls: type, raw: Any, path: str, source: str, errors: list[str]) -> Any:
    where = path or "top level"
    if not isinstance(raw, dict):
        errors.append(f"{source}: {where}: expected a mapping, got {_kind(raw)}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    for key in raw:
        if key not in fields:
            hint = difflib.get_close_matches(str(key), fields, n=1)
            maybe = f" (did you mean '{hint[0]}'?)" if hint else ""
            errors.append(f"{source}: {_join(path, key)}: unknown key{maybe}; allowed keys: {', '.join(fields)}")
    values: dict[str, Any] = {}
    ok = True
    for name, f in fields.items():
        key_path = _join(path, name)
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                errors.append(f"{source}: {key_path}: required key is missing")
                ok = False
            continue
        value = raw[name]
        if cls is Script and name == "command" and isinstance(value, str):
            try:
                value = split_command(value)
            except ValueError as exc:  # an unclosed quote
                errors.append(f"{source}: {key_path}: cannot split {_show(value)} into arguments: {exc}")
                ok = False
                continue
        if cls is Search and name == "num_workers" and value == "auto":
            values[name] = auto_workers()
            continue
        before = len(errors)
        values[name] = _coerce(value, hints[name], key_path, f.metadata.get("check", {}), source, errors)
        ok = ok and len(errors) == before
    return cls(**values) if ok else None


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _coerce(value: Any, tp: Any, path: str, check: dict[str, Any], source: str, errors: list[str]) -> Any:
    if tp is Any:  # checked by the section's own cross-checks (script.loader: auto or N)
        return value
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _load_dataclass(tp, value, path, source, errors)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path, check, source, errors)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = value if isinstance(value, list) else [value]
        if not items and not check.get("empty_ok"):
            errors.append(f"{source}: {path}: must list at least one value")
            return []
        before = len(errors)
        out = [_coerce(v, item_tp, f"{path}[{i}]", check, source, errors) for i, v in enumerate(items)]
        if len(errors) > before:
            return out
        out = list(dict.fromkeys(out))
        return sorted(out) if item_tp in (int, float) else out
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            errors.append(f"{source}: {path}: expected a mapping of keyword arguments, got {_kind(value)}")
        return dict(value) if isinstance(value, dict) else {}
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            errors.append(f"{source}: {path}: {_show(value)} is not allowed; choose one of: {', '.join(allowed)}")
        return value
    return _scalar(value, tp, path, check, source, errors)


def _scalar(value: Any, tp: Any, path: str, check: dict[str, Any], source: str, errors: list[str]) -> Any:
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[tp]
    good = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not good:
        errors.append(f"{source}: {path}: expected {expected}, got {_kind(value)} {_show(value)}")
        return value
    if tp is float:
        value = float(value)
    bounds = [
        ("min", lambda v, b: v >= b, "at least"),
        ("gt", lambda v, b: v > b, "greater than"),
        ("lt", lambda v, b: v < b, "less than"),
    ]
    for key, ok, words in bounds:
        if key in check and not ok(value, check[key]):
            errors.append(f"{source}: {path}: {_show(value)} is out of range; must be {words} {check[key]}")
    if check.get("import_path") and not _IMPORT_PATH.match(value):
        errors.append(
            f"{source}: {path}: {_show(value)} is not an import path; write it as 'module:attr' (e.g. "
            "'torchvision.models:resnet50') or 'path/to/file.py:attr'"
        )
    if "pattern" in check and not check["pattern"].match(value):
        errors.append(f"{source}: {path}: {_show(value)} is not allowed; choose one of: {check['allowed']}")
    return value
