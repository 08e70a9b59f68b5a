"""The package's layering: every module imports only modules of lower layers (or its own subpackage), so the flow
reads bottom-up and no stage reaches back into a later one."""

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
