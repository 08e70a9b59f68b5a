"""The measurement record (contract.Measurement): its fields are the documented ones, readers use only them, and
files of every version read through its one adapter without losing a value."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import REPO
from tunekit.contract import (
    MEASUREMENT_VERSION,
    REQUIRED_FIELDS,
    Knobs,
    Measurement,
    TrialSpec,
    failed_measurement,
    skipped_measurement,
)

FIELDS = {f.name for f in dataclasses.fields(Measurement)}
METHODS = {"to_dict", "held"}
"""What a reader may use of a record besides its fields: the dict it writes, and which fields its file held."""
V1_NAMES = {"samples_per_s": "rate", "samples_per_s_windows": "rate_windows", "measured_samples": "measured_items",
            "sample_time_s": "item_time_s", "worker_cpu_per_sample_s": "worker_cpu_per_item_s",
            "worker_wall_per_sample_s": "worker_wall_per_item_s"}


# --- the docs and the record ----------------------------------------------------------------------------------


def _field_tables(path: Path, heading: str) -> set[str]:
    """The backticked names in the first column of the ``| field | …`` tables under the ``## `` sections whose
    title holds ``heading``."""
    names: set[str] = set()
    for section in re.split(r"^## ", path.read_text(), flags=re.M)[1:]:
        if heading not in section.splitlines()[0]:
            continue
        in_table = False
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
            if not cells:
                in_table = False
            elif cells[0] == "field":
                in_table = True
            elif in_table and not set(cells[0]) <= {"-", " "}:
                names |= set(re.findall(r"`([a-z_0-9]+)`", cells[0]))
    return names


def test_the_documented_fields_are_the_record_s():
    measurement_md = _field_tables(REPO / "docs" / "measurement.md", "measurement.json")
    distributed_md = _field_tables(REPO / "docs" / "distributed.md", "The measurement")
    assert distributed_md <= FIELDS, f"docs/distributed.md names fields the record lacks: {distributed_md - FIELDS}"
    documented = measurement_md | distributed_md
    assert documented == FIELDS, (f"documented, not in the record: {sorted(documented - FIELDS)}; in the record, "
                                  f"not documented: {sorted(FIELDS - documented)}")


def test_every_field_has_a_docstring_and_a_default_but_status():
    source = ast.parse((REPO / "tunekit" / "contract.py").read_text())
    cls = next(n for n in source.body if isinstance(n, ast.ClassDef) and n.name == "Measurement")
    documented = {stmt.target.id for stmt, after in zip(cls.body, cls.body[1:], strict=False)
                  if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr)
                  and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}
    assert documented == FIELDS
    required = {f.name for f in dataclasses.fields(Measurement)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert required == {"status"}


def test_the_launcher_requires_fields_of_the_record():
    assert set(REQUIRED_FIELDS) <= FIELDS


# --- readers read fields, by attribute --------------------------------------------------------------------------


def _is_measurement(node: ast.AST) -> bool:
    """``<expr>.measurement``, or a record made here (``Measurement(...)``, ``Measurement.from_dict(...)``,
    ``failed_measurement(...)``, ``skipped_measurement(...)``)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "measurement"
    if isinstance(node, ast.IfExp):
        return _is_measurement(node.body) or _is_measurement(node.orelse)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f"{getattr(f.value, 'id', '')}.{f.attr}" if isinstance(
            f, ast.Attribute) else ""
        return name in ("Measurement", "Measurement.from_dict", "failed_measurement", "skipped_measurement")
    return False


def _aliases(scope: ast.AST) -> set[str]:
    """Names a function binds to a measurement: ``m = row.measurement`` (in a tuple too), an argument annotated
    ``Measurement``."""
    names: set[str] = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts, strict=False)
                         if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                         else [(target, node.value)])
                names |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _is_measurement(v)}
        elif isinstance(node, ast.arg) and node.annotation is not None:
            # one record (``Measurement``, ``Measurement | None``), not a sequence of them, which is sliced
            if re.fullmatch(r"Measurement( \| None)?", ast.unparse(node.annotation)):
                names.add(node.arg)
    return names


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every read of a measurement by string key or by a name the record does not define."""
    bad = []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in [tree, *scopes]:
        aliases = _aliases(scope) if scope is not tree else set()

        def record(node: ast.AST, names: set[str] = aliases) -> bool:
            return _is_measurement(node) or (isinstance(node, ast.Name) and node.id in names)

        for node in ast.walk(scope):
            if isinstance(node, ast.Subscript) and record(node.value):
                bad.append((node.lineno, f"{ast.unparse(node)}: a measurement read by key"))
            elif isinstance(node, ast.Attribute) and record(node.value):
                if node.attr in ("get", "items", "keys", "values"):
                    bad.append((node.lineno, f"{ast.unparse(node)}: a measurement read as a dict"))
                elif node.attr not in FIELDS | METHODS:
                    bad.append((node.lineno, f"{ast.unparse(node)}: not a field of Measurement"))
    return sorted(set(bad))


def test_the_scan_finds_key_reads_and_unknown_fields():
    code = '''
def f(row, other):
    m = row.measurement
    a = row.measurement.get("data_wait_frac")
    b = row.measurement["rate"]
    c = m.samples_per_s
    d, e = row.measurement, other
    return d.get("x"), m.rate, row.measurement.cpu_count, e.get("fine")
'''
    found = [line for line, _ in _reads(ast.parse(code))]
    assert found == [4, 5, 6, 8]


PACKAGE_MODULES = sorted(p for p in (REPO / "tunekit").rglob("*.py") if p.name != "contract.py")


@pytest.mark.parametrize("path", PACKAGE_MODULES, ids=lambda p: str(p.relative_to(REPO / "tunekit")))
def test_readers_use_only_the_record_s_fields(path: Path):
    bad = _reads(ast.parse(path.read_text()))
    assert not bad, "\n".join(f"{path.relative_to(REPO)}:{line}: {what}" for line, what in bad)


# --- the one adapter: every version in, version 2 out ----------------------------------------------------------


def _kept(old: dict, new: dict) -> None:
    """Every value of a version-1 dict is in its version-2 dict, under the new name."""
    assert new["version"] == MEASUREMENT_VERSION
    for key, value in old.items():
        name = V1_NAMES.get(key, key)
        if name == "per_rank":
            assert [{V1_NAMES.get(k, k): v for k, v in p.items()} for p in value] == new[name]
        else:
            assert new[name] == value, key
    assert not set(V1_NAMES) & set(new)


def test_a_version_1_dict_round_trips_with_every_value():
    old = {"status": "ok", "reason": "", "number": 3, "stage": "end_to_end", "mode": "train",
           "params": {"num_workers": 2, "batch_size": 8}, "unit": "tokens", "samples_per_s": 1234.5,
           "samples_per_s_windows": [1200.0, 1250.0], "measured_samples": 4938, "sample_time_s": 0.00081,
           "worker_cpu_per_sample_s": 0.002, "worker_wall_per_sample_s": 0.004, "gpu_busy_frac": None,
           "nvml": {"samples": 12}, "per_rank": [{"rank": 0, "samples_per_s": 600.0, "worker_cpu_per_sample_s": 1e-3}],
           "a_field_from_elsewhere": {"kept": True}}
    m = Measurement.from_dict(old)
    assert (m.rate, m.rate_windows, m.measured_items, m.item_time_s) == (1234.5, [1200.0, 1250.0], 4938, 0.00081)
    assert m.worker_cpu_per_item_s == 0.002 and m.per_rank == [{"rank": 0, "rate": 600.0,
                                                                 "worker_cpu_per_item_s": 1e-3}]
    assert m.other == {"a_field_from_elsewhere": {"kept": True}}
    new = m.to_dict()
    _kept(old, new)
    assert list(new)[0] == "version" and set(new) == FIELDS - {"other"} | {"a_field_from_elsewhere"}
    assert Measurement.from_dict(new) == m  # version 2 in, the same record out
    assert json.loads(json.dumps(new)) == new


def test_a_newer_file_or_one_without_a_status_is_refused():
    with pytest.raises(ValueError, match="newer"):
        Measurement.from_dict({"version": MEASUREMENT_VERSION + 1, "status": "ok"})
    with pytest.raises(ValueError, match="status"):
        Measurement.from_dict({"version": 2, "rate": 1.0})


def _committed() -> list[dict]:
    """Every measurement the committed runs hold: trials/<n>/measurement*.json and the study.db user attrs."""
    found = [json.loads(p.read_text()) for p in sorted((REPO / "results").rglob("measurement*.json"))]
    for db in sorted((REPO / "results").rglob("study.db")):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            rows = con.execute("SELECT value_json FROM trial_user_attributes WHERE key = 'measurement'").fetchall()
        found += [json.loads(v) for (v,) in rows]
    return found


def test_every_committed_measurement_reads_and_round_trips():
    committed = _committed()
    assert committed, "results/ holds no measurements"
    for old in committed:
        m = Measurement.from_dict(old)
        _kept(old, m.to_dict())
        assert not m.other, f"fields the record does not define: {sorted(m.other)}"


def test_failed_and_skipped_trials_are_records():
    spec = TrialSpec(number=4, stage="end_to_end", mode="train", knobs=Knobs(num_workers=2, prefetch_factor=2),
                     config={})
    failed = failed_measurement(spec, "oom", "CUDA out of memory", exception="OutOfMemoryError", failed_at=1.5)
    assert isinstance(failed, Measurement) and (failed.status, failed.exception, failed.failed_at) == (
        "oom", "OutOfMemoryError", 1.5)
    assert failed.rate is None and failed.params == spec.knobs.to_dict() and failed.number == 4
    skipped = skipped_measurement(spec, "the loader alone is too slow").to_dict()
    assert skipped["status"] == "skipped" and skipped["rate"] is None and skipped["version"] == MEASUREMENT_VERSION
    assert skipped["returncode"] is None  # every field written, null where the trial has none
