"""Workloads named by import path (tunekit/workloads/): where a path that does not resolve was looked for."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_an_import_path_that_does_not_resolve_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tunekit.workloads import check_paths

    monkeypatch.chdir(tmp_path)
    problems = check_paths({"workload.model": "mytask_nowhere:make_model", "workload.dataset": "sub/task.py:make"})
    assert f"looked in {tmp_path}" in problems["workload.model"] and "PYTHONPATH" in problems["workload.model"]
    assert f"relative to the folder tunekit runs in, {tmp_path}" in problems["workload.dataset"]
