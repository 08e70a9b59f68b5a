"""The measurement record (contract.Measurement): its fields are the documented ones, readers use only them, and
files of every version read through its one adapter without losing a value."""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import inspect
import json
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, measurement
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
RECORD_MODULE = Path(inspect.getsourcefile(Measurement) or "").resolve()
"""The module that defines the record (and its one adapter), wherever the package keeps it."""
METHODS = {"to_dict", "held"}
"""What a reader may use of a record besides its fields: the dict it writes, and which fields its file held."""
V1_NAMES = {
    "samples_per_s": "rate",
    "samples_per_s_windows": "rate_windows",
    "measured_samples": "measured_items",
    "sample_time_s": "item_time_s",
    "worker_cpu_per_sample_s": "worker_cpu_per_item_s",
    "worker_wall_per_sample_s": "worker_wall_per_item_s",
}


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
    assert documented == FIELDS, (
        f"documented, not in the record: {sorted(documented - FIELDS)}; in the record, "
        f"not documented: {sorted(FIELDS - documented)}"
    )


def test_every_field_has_a_docstring_and_a_default_but_status():
    source = ast.parse(RECORD_MODULE.read_text())
    cls = next(n for n in source.body if isinstance(n, ast.ClassDef) and n.name == "Measurement")
    documented = {
        stmt.target.id
        for stmt, after in zip(cls.body, cls.body[1:], strict=False)
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }
    assert documented == FIELDS
    required = {
        f.name
        for f in dataclasses.fields(Measurement)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
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
        name = (
            f.id
            if isinstance(f, ast.Name)
            else f"{getattr(f.value, 'id', '')}.{f.attr}"
            if isinstance(f, ast.Attribute)
            else ""
        )
        return name in ("Measurement", "Measurement.from_dict", "failed_measurement", "skipped_measurement")
    return False


def _aliases(scope: ast.AST) -> set[str]:
    """Names a function binds to a measurement: ``m = row.measurement`` (in a tuple too), an argument annotated
    ``Measurement``."""
    names: set[str] = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (
                    zip(target.elts, node.value.elts, strict=False)
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    else [(target, node.value)]
                )
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
    code = """
def f(row, other):
    m = row.measurement
    a = row.measurement.get("data_wait_frac")
    b = row.measurement["rate"]
    c = m.samples_per_s
    d, e = row.measurement, other
    return d.get("x"), m.rate, row.measurement.cpu_count, e.get("fine")
"""
    found = [line for line, _ in _reads(ast.parse(code))]
    assert found == [4, 5, 6, 8]


PACKAGE_MODULES = sorted(p for p in (REPO / "tunekit").rglob("*.py") if p != RECORD_MODULE)


@pytest.mark.parametrize("path", PACKAGE_MODULES, ids=lambda p: str(p.relative_to(REPO / "tunekit")))
def test_readers_use_only_the_record_s_fields(path: Path):
    bad = _reads(ast.parse(path.read_text()))
    assert not bad, "\n".join(f"{path.relative_to(REPO)}:{line}: {what}" for line, what in bad)


# --- the one adapter: every version in, version 2 out ----------------------------------------------------------


def _kept(old: dict, new: dict) -> None:
    """Every value of an older dict (version 1 or 2) is in its version-2 dict, under the new name."""
    assert new["version"] == MEASUREMENT_VERSION
    for key, value in old.items():
        name = V1_NAMES.get(key, key)
        if name == "per_rank" and value is not None:  # null in a one-rank trial's file
            assert [{V1_NAMES.get(k, k): v for k, v in p.items()} for p in value] == new[name]
        else:
            assert new[name] == value, key
    assert not set(V1_NAMES) & set(new)


def test_a_version_1_dict_round_trips_with_every_value():
    old = {
        "status": "ok",
        "reason": "",
        "number": 3,
        "stage": "end_to_end",
        "mode": "train",
        "params": {"num_workers": 2, "batch_size": 8},
        "unit": "tokens",
        "samples_per_s": 1234.5,
        "samples_per_s_windows": [1200.0, 1250.0],
        "measured_samples": 4938,
        "sample_time_s": 0.00081,
        "worker_cpu_per_sample_s": 0.002,
        "worker_wall_per_sample_s": 0.004,
        "gpu_busy_frac": None,
        "nvml": {"samples": 12},
        "per_rank": [{"rank": 0, "samples_per_s": 600.0, "worker_cpu_per_sample_s": 1e-3}],
        "a_field_from_elsewhere": {"kept": True},
    }
    m = Measurement.from_dict(old)
    assert (m.rate, m.rate_windows, m.measured_items, m.item_time_s) == (1234.5, [1200.0, 1250.0], 4938, 0.00081)
    assert m.worker_cpu_per_item_s == 0.002 and m.per_rank == [
        {"rank": 0, "rate": 600.0, "worker_cpu_per_item_s": 1e-3}
    ]
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


def committed_files(repo: Path) -> list[Path]:
    """The files under ``repo/results/`` that are committed: in a git checkout, those git tracks (the showcase runs,
    added with ``git add -f``); elsewhere (an unpacked archive), those of the run folders results/README.md lists.
    A sweep's own output there (``tunekit sweep`` writes ``results/<name>/``, which git ignores) is not among them."""
    tracked = _git(repo, "ls-files", "-z", "--", "results")
    toplevel = _git(repo, "rev-parse", "--show-toplevel")
    if tracked is not None and toplevel is not None and Path(toplevel.strip()).resolve() == repo.resolve():
        paths = [repo / name for name in tracked.split("\0") if name]
    else:
        listed = re.findall(r"^\| \[`([^`/]+)/`\]", (repo / "results" / "README.md").read_text(), flags=re.M)
        paths = [p for name in sorted(set(listed)) for p in (repo / "results" / name).rglob("*")]
    return sorted(p for p in paths if p.is_file())


def _git(repo: Path, *args: str) -> str | None:
    """``git -C repo ARGS``'s output, or None without git or outside a checkout it can read."""
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    return done.stdout if done.returncode == 0 else None


def _committed(repo: Path = REPO) -> list[dict]:
    """Every measurement the committed runs hold: trials/<n>/measurement*.json and the study.db user attrs."""
    files = committed_files(repo)
    found = [json.loads(p.read_text()) for p in files if fnmatch.fnmatch(p.name, "measurement*.json")]
    for db in (p for p in files if p.name == "study.db"):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            rows = con.execute("SELECT value_json FROM trial_user_attributes WHERE key = 'measurement'").fetchall()
        found += [json.loads(v) for (v,) in rows]
    return found


def _round_trips(old: dict) -> None:
    m = Measurement.from_dict(old)
    _kept(old, m.to_dict())
    assert not m.other, f"fields the record does not define: {sorted(m.other)}"


def test_every_committed_measurement_reads_and_round_trips():
    committed = _committed()
    assert committed, "results/ holds no measurements"
    for old in committed:
        _round_trips(old)


def test_a_one_rank_version_2_file_round_trips():
    """What a trial writes today: version 2, every field, ``per_rank`` null on one rank (as a committed run made
    now holds)."""
    written = Measurement.from_dict(measurement(3, "end_to_end", "train", 250.0, num_workers=2)).to_dict()
    assert written["per_rank"] is None and written["version"] == MEASUREMENT_VERSION
    _round_trips(written)


def _study_db(path: Path, *measurements: dict) -> None:
    """A study.db as optuna keeps it, as far as the reader looks: trial_user_attributes' measurement rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE trial_user_attributes (trial_id INTEGER, key TEXT, value_json TEXT)")
        con.executemany(
            "INSERT INTO trial_user_attributes VALUES (?, 'measurement', ?)",
            [(i, json.dumps(m)) for i, m in enumerate(measurements)],
        )
    con.close()


def _checkout(root: Path) -> Path:
    """A repository laid out as this one: results/ ignored but its README, one run committed with ``git add -f``
    (a measurement.json and a study.db), then a sweep's own output beside it, untracked and ignored, which no
    version of the record reads (a newer version, a file cut short, a study of such)."""
    good = measurement(0, "compute", "compute", 400.0)
    (root / "results" / "showcase" / "trials" / "0").mkdir(parents=True)
    (root / ".gitignore").write_text("/results/*\n!/results/README.md\n")
    (root / "results" / "README.md").write_text(
        "| folder | what |\n| --- | --- |\n| [`showcase/`](#showcase) | the committed run |\n"
    )
    (root / "results" / "showcase" / "trials" / "0" / "measurement.json").write_text(json.dumps(good))
    _study_db(root / "results" / "showcase" / "study.db", good)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-f", ".gitignore", "results"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a committed run"], check=True)
    mine = root / "results" / "quickstart"
    (mine / "trials" / "0").mkdir(parents=True)
    (mine / "trials" / "0" / "measurement.json").write_text(json.dumps({"version": MEASUREMENT_VERSION + 1}))
    (mine / "trials" / "1").mkdir()
    (mine / "trials" / "1" / "measurement.json").write_text('{"version": 2, "status": "ok", "ra')
    _study_db(mine / "study.db", {"version": MEASUREMENT_VERSION + 1, "status": "ok"})
    return root


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_only_committed_runs_are_read_not_a_sweep_s_own_output(tmp_path: Path):
    """``tunekit sweep configs/quickstart.yaml`` (the README's first command) writes results/quickstart/; the
    test suite (its second) reads only the runs committed, so that output, of whatever version, fails nothing.
    Outside a git checkout, the folders results/README.md lists are the committed runs."""
    repo = _checkout(tmp_path / "repo")
    assert [p.relative_to(repo).as_posix() for p in committed_files(repo)] == [
        "results/README.md",
        "results/showcase/study.db",
        "results/showcase/trials/0/measurement.json",
    ]
    read = _committed(repo)
    assert read == [measurement(0, "compute", "compute", 400.0)] * 2  # the file, then its study row
    for old in read:
        _round_trips(old)

    archive = tmp_path / "archive"  # the same tree without its .git: an unpacked archive
    shutil.copytree(repo, archive, ignore=shutil.ignore_patterns(".git"))
    assert committed_files(archive) == [
        archive / p.relative_to(repo) for p in committed_files(repo) if p.parent != repo / "results"
    ]
    assert _committed(archive) == read


def test_a_committed_measurement_that_does_not_round_trip_fails(tmp_path: Path):
    """The reader is no filter: a committed file the record cannot read fails the round trip."""
    repo = _checkout(tmp_path / "repo")
    bad = repo / "results" / "showcase" / "trials" / "0" / "measurement.json"
    bad.write_text(json.dumps({**measurement(0, "compute", "compute", 400.0), "a_field_from_elsewhere": 1}))
    read = _committed(repo)
    assert len(read) == 2
    with pytest.raises(AssertionError, match="a_field_from_elsewhere"):
        _round_trips(read[0])
    bad.write_text(json.dumps({"version": MEASUREMENT_VERSION + 1, "status": "ok"}))
    with pytest.raises(ValueError, match="newer"):
        _round_trips(_committed(repo)[0])


def test_failed_and_skipped_trials_are_records():
    spec = TrialSpec(
        number=4, stage="end_to_end", mode="train", knobs=Knobs(num_workers=2, prefetch_factor=2), config={}
    )
    failed = failed_measurement(spec, "oom", "CUDA out of memory", exception="OutOfMemoryError", failed_at=1.5)
    assert isinstance(failed, Measurement) and (failed.status, failed.exception, failed.failed_at) == (
        "oom",
        "OutOfMemoryError",
        1.5,
    )
    assert failed.rate is None and failed.params == spec.knobs.to_dict() and failed.number == 4
    skipped = skipped_measurement(spec, "the loader alone is too slow").to_dict()
    assert skipped["status"] == "skipped" and skipped["rate"] is None and skipped["version"] == MEASUREMENT_VERSION
    assert skipped["returncode"] is None  # every field written, null where the trial has none
