"""A script command's grammar: its arguments, its ``{knob}`` placeholders and how a trial fills them, the torchrun
in front of it, and which loader knobs a trial sets on the training DataLoader instead. Pure text: nothing here
runs a command or imports torch."""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any

__all__ = ["split_command", "placeholders", "fill_command", "torchrun_split", "is_python", "LOADER_KNOBS",
           "set_on_loader"]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.]*)\}")


def split_command(command: str | list[str]) -> list[str]:
    """A command as its arguments: a string is split as a shell would (never run through one)."""
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def placeholders(command: str | list[str]) -> set[str]:
    """The ``{name}`` placeholders of a script command (knob names, or dotted ``search.extra`` keys)."""
    return {m.group(1) for part in split_command(command) for m in _PLACEHOLDER.finditer(part)}


def fill_command(command: str | list[str], values: dict[str, Any]) -> list[str]:
    """The command's arguments with each placeholder filled from ``values``. An argument whose placeholder has no
    value is left out, with the flag before it when it stands alone (``-j {num_workers}`` and
    ``--workers={num_workers}`` both go), so the script's own default applies: ``values = {}`` runs the script with
    its own settings."""
    parts, out = split_command(command), []
    for i, part in enumerate(parts):
        missing = [m.group(1) for m in _PLACEHOLDER.finditer(part) if m.group(1) not in values]
        following = _PLACEHOLDER.fullmatch(parts[i + 1]) if i + 1 < len(parts) else None
        if missing or (part.startswith("-") and following and following.group(1) not in values):
            continue
        out.append(_PLACEHOLDER.sub(lambda m: _as_text(values[m.group(1)]), part))
    return out


_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
"""torchrun's options that take no value (every other option before the program takes one)."""
_NPROC = ("--nproc-per-node", "--nproc_per_node")


def torchrun_split(command: str | list[str]) -> tuple[list[str], str | None, list[str]] | None:
    """A command that starts torchrun (``torchrun …`` or ``python -m torch.distributed.run …``) as (torchrun's
    options but ``--nproc-per-node``, that option's value, the program and its arguments); None for any other
    command. A script trial runs the program under torchrun with its own rank count in place of the value."""
    parts = split_command(command)
    if parts and os.path.basename(parts[0]) == "torchrun":
        rest = parts[1:]
    elif len(parts) >= 3 and is_python(parts[0]) and parts[1:3] == ["-m", "torch.distributed.run"]:
        rest = parts[3:]
    else:
        return None
    options, nproc, i = [], None, 0
    while i < len(rest) and rest[i].startswith("-"):
        name, has_value, value = rest[i].partition("=")
        takes = not has_value and rest[i] not in _TORCHRUN_FLAGS and i + 1 < len(rest)
        value = rest[i + 1] if takes else value
        if name in _NPROC:
            nproc = value
        else:
            options += [rest[i]] + ([rest[i + 1]] if takes else [])
        i += 2 if takes else 1
        if name in ("-m", "--module"):  # what follows is the module and its arguments
            break
    return options, nproc, rest[i:]


def is_python(program: str) -> bool:
    """Whether a command's first argument is a Python interpreter (``python``, ``python3.12``, a path to one)."""
    return re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(program)) is not None


LOADER_KNOBS = ("num_workers", "batch_size", "pin_memory", "prefetch_factor")
"""The knobs script mode can set on the training DataLoader itself."""


def set_on_loader(command: str | list[str]) -> tuple[str, ...]:
    """The loader knobs a script trial sets on the training DataLoader: those the command has no placeholder for."""
    filled = placeholders(command)
    return tuple(k for k in LOADER_KNOBS if k not in filled)


def _as_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)
