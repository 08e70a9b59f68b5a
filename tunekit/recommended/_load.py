"""recommended.yaml read back: YAML without duplicate keys, every section and value checked as a config's are,
an older version's names mapped to this one's."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import yaml

from tunekit.config import check_knobs
from tunekit.errors import ConfigError, UsageError
from tunekit.recommended._record import RECOMMENDED_VERSION, Recommended

_V1_EVIDENCE = {
    "samples_per_s": "rate",
    "best_samples_per_s": "best_rate",
    "defaults_samples_per_s": "defaults_rate",
    "samples_per_dollar": "items_per_money",
}


_V1_DISTRIBUTED = {"per_gpu_samples_per_s": "per_gpu_rate", "single_gpu_samples_per_s": "single_gpu_rate"}


def load_recommended(path: str | os.PathLike[str]) -> Recommended:
    """Load a recommended.yaml written by ``tunekit sweep``.

    Raises:
        ConfigError: the file is missing, not UTF-8, not YAML (a key given twice in one mapping included), has a
            section or setting tunekit does not write, a value of the wrong kind or out of range, ``non_blocking``
            without ``pin_memory``, or an empty ``evidence.machine`` (one line each, naming the file and key).
    """
    label = str(path)
    data = _read(path, label)
    _check(data, label)
    try:
        dl, tr = data["dataloader"], data["training"]
        return Recommended(
            batch_size=_count(dl, "batch_size", 1),
            num_workers=_count(dl, "num_workers", 0),
            prefetch_factor=dl.get("prefetch_factor"),
            pin_memory=bool(dl["pin_memory"]),
            persistent_workers=bool(dl.get("persistent_workers", False)),
            non_blocking=bool(tr.get("non_blocking", dl["pin_memory"])),
            grad_accum=int(tr.get("grad_accum", 1)),
            compile=str(tr.get("compile", "none")),
            evidence=_evidence(data),
            ranks=_count(tr, "ranks", 1, "training") if "ranks" in tr else 1,
            config=dict(data.get("config") or {}),
            threads=_count(tr, "threads", 1, "training") if tr.get("threads") is not None else None,
            worker_threads=(
                _count(dl, "worker_threads", 1, "dataloader") if dl.get("worker_threads") is not None else None
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError([f"{label}: not a tunekit recommendation: missing or bad key {exc}"]) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error (PyYAML keeps the last silently, so a
    hand edit appended below the original would win unseen)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor``: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                again = key in seen
            except TypeError:  # an unhashable key: PyYAML's own construct_mapping names it
                continue
            if again:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (a key may appear only once in a mapping)",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read(path: str | os.PathLike[str], label: str) -> Any:
    """The file's YAML, or one line saying why it cannot be read (unreadable, not UTF-8, not YAML)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError([f"{label}: cannot read recommendation: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [
                f"{label}: not valid UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start}): a "
                "recommendation is the YAML text tunekit sweep writes"
            ]
        ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # _UniqueKeyLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{label}: {where}invalid YAML: {problem}"]) from None


_TOP_LEVEL = ("version", "dataloader", "training", "config", "script", "evidence")
"""The sections recommendation_dict and report's recommendation_yaml write (``script`` for a script's run)."""


_SECTIONS = {
    "dataloader": ("batch_size", "num_workers", "prefetch_factor", "pin_memory", "worker_threads"),
    "training": ("grad_accum", "compile", "ranks", "threads"),
}
"""The knobs each section holds, checked as a config's are (config.check_knobs), the machine's bound aside."""


_FLAGS = {"dataloader": ("persistent_workers",), "training": ("non_blocking",)}
"""The booleans each section holds beside its knobs."""


_REQUIRED = {"dataloader": ("batch_size", "num_workers", "pin_memory"), "training": ()}


_SCRIPT = ("command", "set_on_dataloader", "dataloader_built_at", "dataloader_built_by")


_SCALAR = (str, int, float, bool, type(None))


def _kind(value: Any) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _check(data: Any, label: str) -> None:
    """As strict as a config: the version this tunekit reads, the sections and settings it writes and no other,
    every knob's type and range, the booleans, the evidence's machine."""
    if not isinstance(data, dict):
        raise ConfigError([f"{label}: not a tunekit recommendation: expected a mapping, got {type(data).__name__}"])
    version = data.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= RECOMMENDED_VERSION:
        raise ConfigError(
            [
                f"{label}: version: {version!r} is not one this tunekit reads (1 to "
                f"{RECOMMENDED_VERSION}); a newer tunekit wrote it, or it is not a recommendation"
            ]
        )
    problems, meant = [], set()
    for key in data:
        if key not in _TOP_LEVEL:
            close = difflib.get_close_matches(str(key), _TOP_LEVEL, n=1)
            meant.update(close)
            problems.append(
                f"{label}: {key}: not a section of a recommendation; allowed: {', '.join(_TOP_LEVEL)}"
                + (f" (did you mean {close[0]}?)" if close else "")
            )
    for section in _SECTIONS:
        if section not in data and section in meant:
            continue  # missing because misspelt: said once, above
        problems += _section_problems(data.get(section), section, label)
    problems += _pinning_problems(data.get("dataloader"), data.get("training"), label)
    problems += _config_problems(data.get("config"), label)
    problems += _script_problems(data.get("script"), label)
    problems += _evidence_problems(data.get("evidence"), label)
    if problems:
        raise ConfigError(problems)


def _section_problems(block: Any, section: str, label: str) -> list[str]:
    allowed = (*_SECTIONS[section], *_FLAGS[section])
    if block is None:
        return [f"{label}: {section}: missing (a mapping of {', '.join(allowed)})"]
    if not isinstance(block, dict):
        return [f"{label}: {section}: expected a mapping (of {', '.join(allowed)}), got {_kind(block)}"]
    problems = [
        f"{label}: {section}.{key}: not a setting of {section}; allowed: {', '.join(allowed)}"
        for key in block
        if key not in allowed
    ]
    problems += [f"{label}: {section}.{key}: missing" for key in _REQUIRED[section] if key not in block]
    for key in _FLAGS[section]:
        if key in block and not isinstance(block[key], bool):
            problems.append(f"{label}: {section}.{key} = {block[key]!r}: expected true or false")
    knobs = {k: block[k] for k in _SECTIONS[section] if k in block}
    try:
        check_knobs(knobs, where=f"{label}: {section}", bound=False)
    except UsageError as exc:
        problems.extend(str(exc).split("; "))
    return problems


def _pinning_problems(dl: Any, tr: Any, label: str) -> list[str]:
    """``non_blocking`` only with ``pin_memory``: a non_blocking copy from pageable memory is a synchronous one."""
    if not (isinstance(dl, dict) and isinstance(tr, dict)):
        return []  # _section_problems says so
    if tr.get("non_blocking") is True and dl.get("pin_memory") is False:
        return [
            f"{label}: training.non_blocking = true with dataloader.pin_memory = false: non_blocking copies "
            "need pinned memory; set both true, or non_blocking false"
        ]
    return []


def _scalars(block: dict[Any, Any], where: str, label: str) -> list[str]:
    return [
        f"{label}: {where}.{key}: expected a string, number, boolean or null, got {_kind(value)}"
        for key, value in block.items()
        if not isinstance(value, _SCALAR)
    ]


def _config_problems(block: Any, label: str) -> list[str]:
    """``config``: the user-defined knobs the recommendation sets, config key to value."""
    if block is None:
        return []
    if not isinstance(block, dict):
        return [
            f"{label}: config: expected a mapping of config keys to values (e.g. "
            f"workload.dataset_args.decode: gpu), got {_kind(block)}"
        ]
    return _scalars(block, "config", label)


def _script_problems(block: Any, label: str) -> list[str]:
    """``script``: how to run a script with the knee (the filled command, what to set on its DataLoader)."""
    if block is None:
        return []
    if not isinstance(block, dict):
        return [f"{label}: script: expected a mapping (of {', '.join(_SCRIPT)}), got {_kind(block)}"]
    problems = [
        f"{label}: script.{key}: not a setting of script; allowed: {', '.join(_SCRIPT)}"
        for key in block
        if key not in _SCRIPT
    ]
    command = block.get("command")
    if command is not None and not (isinstance(command, list) and all(isinstance(w, str) for w in command)):
        problems.append(
            f"{label}: script.command: expected a list of strings (the command's arguments), got {_kind(command)}"
        )
    problems += [
        f"{label}: script.{key}: expected a string (where the script builds its DataLoader), got {_kind(block[key])}"
        for key in _SCRIPT[2:]
        if key in block and not isinstance(block[key], str)
    ]
    loader = block.get("set_on_dataloader")
    if loader is not None and not isinstance(loader, dict):
        problems.append(
            f"{label}: script.set_on_dataloader: expected a mapping (DataLoader argument: value), got {_kind(loader)}"
        )
    elif loader:
        problems += _scalars(loader, "script.set_on_dataloader", label)
    return problems


def _evidence_problems(evidence: Any, label: str) -> list[str]:
    """``evidence``: free-form figures, but a mapping, with its unit a string and its machine a fingerprint that
    records something (an empty one would read as this machine, whatever it is)."""
    if evidence is None:
        return []
    if not isinstance(evidence, dict):
        return [f"{label}: evidence: expected a mapping (what the sweep measured), got {_kind(evidence)}"]
    problems = []
    unit = evidence.get("unit")
    if unit is not None and not isinstance(unit, str):
        problems.append(
            f"{label}: evidence.unit: expected a string (what the rates count, e.g. samples), got {_kind(unit)}"
        )
    machine = evidence.get("machine")
    if machine is None:  # older files: the machine comes from evidence.device and versions
        return problems
    if not isinstance(machine, dict):
        problems.append(
            f"{label}: evidence.machine: expected a mapping (the machine the sweep ran on), got {_kind(machine)}"
        )
    elif all(value is None for value in machine.values()):
        problems.append(
            f"{label}: evidence.machine: records nothing of the machine the sweep ran on (expected its "
            "fingerprint: device, GPUs, CPUs, memory, versions); leave the key out when it is not known"
        )
    else:
        problems += _scalars(machine, "evidence.machine", label)
    return problems


def _evidence(data: dict[str, Any]) -> dict[str, Any]:
    """The evidence under version 2's names: the one adapter for recommended.yaml files of version 1."""
    evidence = dict(data.get("evidence") or {})
    if int(data.get("version") or 1) > 1:
        return evidence
    evidence = {_V1_EVIDENCE.get(k, k): v for k, v in evidence.items()}
    if isinstance(evidence.get("distributed"), dict):
        evidence["distributed"] = {_V1_DISTRIBUTED.get(k, k): v for k, v in evidence["distributed"].items()}
    return evidence


def _count(section: dict[str, Any], key: str, minimum: int, where: str = "dataloader") -> int:
    """An integer setting (not a bool, not a float that int() would truncate)."""
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}.{key} = {value!r} (an integer >= {minimum})")
    return value
