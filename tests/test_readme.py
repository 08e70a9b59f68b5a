from __future__ import annotations

import re

from tests.conftest import REPO


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert block, "README.md must open with a code block holding the two commands"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.startswith("#")]


def test_readme_opens_with_exactly_two_commands():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert "tunekit" in commands[0] and "configs/quickstart.yaml" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci
