"""``tunekit check``'s command line (tunekit/cli/_check.py): a --junit FILE that cannot be written is
refused before the trial, and one whose write fails after the check leaves the check's exit code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.check.test_check import MACHINE, _cli


def _outcome(rec: Path, status: str = "holds") -> Any:
    """A check's outcome, as tunekit._check.check returns it (the check itself is not the subject)."""
    from tunekit._check import CheckOutcome, MachineCheck

    hardware = (("cpus", 64, 2),) if status == "other_machine" else ()
    return CheckOutcome(
        status,
        f"{status}: as recorded",
        recommended=rec,
        unit="samples",
        recorded={"rate": 100.0},
        knobs={},
        machine=MachineCheck(MACHINE, MACHINE, hardware, ()),
    )


def _unwritable(tmp_path: Path, kind: str) -> Path:
    if kind == "missing folder":
        return tmp_path / "reports" / "check.xml"
    if kind == "a folder":
        (tmp_path / "check.xml").mkdir()
        return tmp_path / "check.xml"
    if kind == "folder is a file":
        (tmp_path / "reports").write_text("")
        return tmp_path / "reports" / "check.xml"
    if os.geteuid() == 0:
        pytest.skip("root writes in a read-only folder")
    (tmp_path / "reports").mkdir(mode=0o555)
    return tmp_path / "reports" / "check.xml"


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("missing folder", "does not exist"),
        ("a folder", "is a folder"),
        ("folder is a file", "is not a folder"),
        ("read-only folder", "cannot write in its folder"),
    ],
)
def test_a_junit_file_that_cannot_be_written_is_refused_before_the_trial(tmp_path: Path, monkeypatch, kind, words):
    """--junit FILE in a folder that does not exist or takes no file, or FILE a folder: refused in one line, exit 2,
    before anything is measured (the CI job learns of it now, not after the trial)."""
    from tunekit import _check

    checked = []
    monkeypatch.setattr(_check, "check", lambda rec, *args, **kwargs: checked.append(rec) or _outcome(Path(rec)))
    junit = _unwritable(tmp_path, kind)
    code, out, err = _cli(
        "check", str(tmp_path / "recommended.yaml"), "--config", str(tmp_path / "cfg.yaml"), "--junit", str(junit)
    )
    assert code == 2 and not out and not checked, out + err
    (line,) = err.splitlines()
    assert line.startswith(f"tunekit: error: --junit {junit}: ") and words in line, line


@pytest.mark.parametrize("status", ["holds", "regressed", "other_machine"])
def test_a_junit_write_that_fails_after_the_check_leaves_its_exit_code(tmp_path: Path, monkeypatch, status):
    """The folder was writable when the check began, but the file cannot be written when it ends (here its name
    became a folder meanwhile): a warning on stderr, and the exit code is still the check's."""
    from tunekit import _check

    junit = tmp_path / "check.xml"

    def check(rec: str, *args: Any, **kwargs: Any) -> Any:
        junit.mkdir()
        return _outcome(Path(rec), status)

    monkeypatch.setattr(_check, "check", check)
    code, out, err = _cli(
        "check", str(tmp_path / "recommended.yaml"), "--config", str(tmp_path / "cfg.yaml"), "--junit", str(junit)
    )
    assert code == _check.EXIT_CODES[status], out + err
    assert out.splitlines() == [f"{status}: as recorded"]
    (warning,) = err.splitlines()
    assert warning.startswith(f"tunekit: warning: --junit: {junit}: cannot write: ") and "exit code" in warning
