"""The tree's style, checked by the test command itself: ``ruff check`` (the rules in pyproject.toml) and ``ruff
format --check`` over the package, its tests, benchmarks, examples and the scripts in results/."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

PATHS = ("tunekit", "tests", "benchmarks", "examples", "results")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff(command: list[str]):
    run = subprocess.run(
        [sys.executable, "-m", "ruff", *command, *PATHS], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_module_is_over_450_lines():
    """A module holds one concept; past 450 lines it holds several (split it by concept, as worker/ and rules/)."""
    long = {
        str(p.relative_to(REPO)): n
        for p in sorted((REPO / "tunekit").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 450
    }
    assert not long
