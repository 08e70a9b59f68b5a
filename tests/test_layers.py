"""The package's layering: every module imports only modules of lower layers (or its own subpackage), so the flow
reads bottom-up and no stage reaches back into a later one; and the tests' layout, which mirrors the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "contract", "command"),
    ("_files", "config"),
    ("records", "recommended", "workloads"),
    ("rules", "store", "launch"),
    ("analysis", "env"),
    ("diagnosis", "plan"),
    ("worker", "report"),
    ("fleet",),
    ("driver",),
    ("_api",),
    ("_check",),
    ("cli",),
    ("__main__",),
)
"""Bottom to top. Modules of one layer do not import each other: the plan does not read the diagnosis, the store
knows records but no analysis."""
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
PACKAGE = REPO / "tunekit"


def _unit(path: Path) -> str:
    """The layer unit of a module: its top-level module or subpackage under tunekit/."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported_units(path: Path) -> set[str]:
    units = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "tunekit" and len(parts) > 1 and parts[1] in RANK:
                units.add(parts[1])
    return units


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_every_module_has_a_layer():
    assert {_unit(p) for p in MODULES} <= set(RANK)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_one_above_it(path: Path):
    unit = _unit(path)
    above = sorted(u for u in _imported_units(path) if u != unit and RANK[u] >= RANK[unit])
    assert not above, f"{path.relative_to(REPO)} (layer {RANK[unit]}) imports {above}"


REPO_WIDE_TESTS = ("test_benchmarks.py", "test_gpu.py", "test_layers.py", "test_readme.py", "test_style.py")
"""The test files under tests/ that are the whole repository's, not one module's; every other is named for what it
tests."""


def _tested(path: Path) -> Path | None:
    """What of tunekit a test file is named for, or None: ``tests/<package>/test_<module>.py`` a module (or subpackage)
    of that package, ``tests/<package>/test_<package>.py`` the package itself, ``tests/test_<module>.py`` a top-level
    module or package; a leading underscore of a module or package is left out of the name."""
    rel = path.relative_to(REPO / "tests")
    folder: Path | None = PACKAGE
    for part in rel.parts[:-1]:
        folder = next((folder / n for n in (part, f"_{part}") if (folder / n).is_dir()), None)
        if folder is None:
            return None
    name = rel.stem.removeprefix("test_")
    if len(rel.parts) > 1 and name == rel.parts[-2]:
        return folder
    return next((folder / n for n in (f"{name}.py", f"_{name}.py", name, f"_{name}") if (folder / n).exists()), None)


def test_every_test_file_is_named_for_what_it_tests():
    """A module's tests are found by its name (docs/README.md, Tests), each test folder a package."""
    tests = REPO / "tests"
    files = sorted(p for p in tests.rglob("test_*.py") if p.parent != tests or p.name not in REPO_WIDE_TESTS)
    unnamed = [str(p.relative_to(REPO)) for p in files if _tested(p) is None]
    no_init = sorted({str(p.parent.relative_to(REPO)) for p in files if not (p.parent / "__init__.py").exists()})
    assert files and not unnamed and not no_init, f"named for nothing of tunekit: {unnamed}; no __init__.py: {no_init}"


def test_the_driver_side_never_imports_torch_at_module_level():
    """Modules the sweep driver loads keep torch out (it must not create a CUDA context); trials import it."""
    driver_side = [p for p in MODULES if _unit(p) not in ("worker", "workloads")]
    offenders = []
    for path in driver_side:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "torch"]
    assert not offenders


WORKER_PARTS = {"meter": set(), "factory": {"meter"}, "script": {"meter"}}
"""Inside ``worker``: the meter is shared and knows neither mode; factory mode and script mode each build on it and
never on each other (the entry, ``worker/__init__``, ``_record`` and ``_dist``, may use all three)."""


@pytest.mark.parametrize("part", sorted(WORKER_PARTS))
def test_worker_modes_build_on_the_meter_alone(part: str):
    root = PACKAGE / "worker" / part
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tunekit.worker."):
                other = node.module.split(".")[2]
                if other in WORKER_PARTS and other != part and other not in WORKER_PARTS[part]:
                    offenders.append(f"{path.relative_to(REPO)}: {node.module}")
    assert root.is_dir() and not offenders


def test_mode_and_strategy_names_are_written_only_in_their_home():
    """A trial mode (``train``, ``compute``, ``loader``) or a strategy (``staged``, ``grid``) is written as a string
    in ``contract/_words.py`` alone: everywhere else the code names the member (``Mode.compute``,
    ``Strategy.grid``), so a mode or strategy is added or renamed in one place and every use follows."""
    from tunekit.contract import Mode, Strategy

    words = {m.value for m in Mode} | {s.value for s in Strategy}
    home = PACKAGE / "contract" / "_words.py"
    offenders = []
    for path in MODULES:
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in words:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not offenders


def test_the_worker_asks_the_mode_object_and_never_compares_modes():
    """Inside ``worker`` a trial's mode is one object (``worker/_modes.py``, chosen once by ``trial_mode``) that the
    factory's step and the script's loop ask how to build, step and record: no other worker module names a member
    of ``Mode`` or compares ``spec.mode``, so a mode's behaviour is read, and changed, in one place."""
    from tunekit.contract import Mode

    home = PACKAGE / "worker" / "_modes.py"
    offenders = []
    for path in sorted((PACKAGE / "worker").rglob("*.py")):
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Mode"
            compared = isinstance(node, ast.Compare) and any(
                isinstance(n, ast.Attribute) and n.attr == "mode" for n in [node.left, *node.comparators]
            )
            if (named and node.attr in {m.name for m in Mode}) or compared:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert home.is_file() and not offenders
