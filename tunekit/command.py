"""A script command's grammar: its arguments, its ``{knob}`` placeholders and how a trial fills them, the torchrun
in front of it, which loader knobs a trial sets on the training DataLoader instead, and what a fork server runs
for it (the program, the modules it imports). Nothing here runs a command or imports torch."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
from typing import Any

__all__ = [
    "split_command",
    "placeholders",
    "fill_command",
    "torchrun_split",
    "is_python",
    "LOADER_KNOBS",
    "set_on_loader",
    "script_entry",
    "script_imports",
]

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


def script_entry(command: list[str], cwd: str, path_env: str | None, interpreter: str) -> dict[str, Any] | None:
    """What a fork server runs for ``command`` (``path`` or ``module``, its ``args``, the ``cwd``), or None when the
    command is not ``interpreter`` (the same file, symlinks resolved, in the same folder; ``path_env`` is the PATH
    it is looked up on) running a script or a module without interpreter options, starts torchrun, or runs a file
    of its own that sets up the environment or ``sys.path`` before its imports."""
    if len(command) < 2 or not is_python(command[0]) or torchrun_split(command) is not None:
        return None
    found = shutil.which(command[0], path=path_env) if os.sep not in command[0] else os.path.join(cwd, command[0])
    # the same file, and in the same folder: a virtualenv's python is a symlink to the interpreter it was made
    # from, yet another environment (its own site-packages)
    if (
        not found
        or os.path.realpath(found) != os.path.realpath(interpreter)
        or os.path.dirname(os.path.abspath(found)) != os.path.dirname(os.path.abspath(interpreter))
    ):
        return None
    if command[1] == "-m" and len(command) >= 3:
        source = _module_source(command[2], cwd)
        entry = {"module": command[2], "args": command[3:], "cwd": cwd}
    elif command[1].startswith("-"):
        return None
    else:
        source = os.path.join(cwd, command[1])
        if not os.path.isfile(source):
            return None
        entry = {"path": source, "args": command[2:], "cwd": cwd}
    return None if source and _sets_up_before_imports(source) else entry


def _module_source(module: str, cwd: str) -> str | None:
    """The file ``python -m MODULE`` runs from ``cwd``'s own modules, or None (an installed module)."""
    base = os.path.join(cwd, *module.split("."))
    for path in (base + ".py", os.path.join(base, "__main__.py")):
        if os.path.isfile(path):
            return path
    return None


_MUTATORS = {
    "insert",
    "append",
    "extend",
    "remove",
    "pop",
    "popitem",
    "clear",
    "update",
    "setdefault",
    "__setitem__",
    "__delitem__",
}


def _env_or_path(node: ast.AST) -> bool:
    """``os.environ``, ``environ`` (imported from os) or ``sys.path``."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return (node.value.id, node.attr) in (("os", "environ"), ("sys", "path"))
    return isinstance(node, ast.Name) and node.id == "environ"


def _sets_up(node: ast.AST) -> bool:
    """Whether ``node`` changes the environment or ``sys.path``: a mutating call on them, ``os.putenv`` /
    ``unsetenv``, or an assignment to (an item of) them. Reading them is not."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr in _MUTATORS and _env_or_path(func.value):
                return True
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("putenv", "unsetenv"):
                return True
        targets = (
            sub.targets
            if isinstance(sub, (ast.Assign, ast.Delete))
            else [sub.target]
            if isinstance(sub, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        for target in targets:
            if _env_or_path(target.value if isinstance(target, ast.Subscript) else target):
                return True
    return False


def _top_level(path: str) -> list[ast.stmt]:
    """The top-level statements of a Python file; none when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as fh:
            return ast.parse(fh.read()).body
    except (OSError, SyntaxError, ValueError):
        return []


def _sets_up_before_imports(path: str) -> bool:
    """Whether the script's top level changes ``os.environ`` or ``sys.path`` (or calls ``os.putenv``) before its
    last top-level import: a fork server imported torch and the script's installed imports before the script ran,
    so what they read when imported (OMP_NUM_THREADS, MKL_NUM_THREADS, the folders on sys.path) would not be what
    the script set; such a script runs itself, as a fresh interpreter would run it. A file that cannot be read or
    parsed counts as not (it fails alike either way)."""
    body = _top_level(path)
    imports = [i for i, node in enumerate(body) if isinstance(node, (ast.Import, ast.ImportFrom))]
    return any(_sets_up(node) for node in body[: imports[-1] if imports else 0])


def script_imports(entry: dict[str, Any]) -> list[str]:
    """The installed modules a script imports at its top level, for a fork server to import once: none of the
    script's own folder (the server's ``sys.path`` does not hold it, and another module of that name would be
    taken for it), and none for a module run with ``-m``."""
    path = entry.get("path")
    if not path:
        return []
    names = []
    for node in _top_level(path):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    folders = {os.path.dirname(os.path.realpath(path)), entry["cwd"]}  # sys.path[0]: the script's real folder
    local = {
        name.split(".")[0]
        for name in names
        for folder in folders
        if os.path.exists(os.path.join(folder, name.split(".")[0] + ".py"))
        or os.path.isdir(os.path.join(folder, name.split(".")[0]))
    }
    return sorted({name for name in names if name.split(".")[0] not in local and name != "__future__"})
