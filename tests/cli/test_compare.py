"""tunekit compare on two machine types: one real sweep of the known-answer job (a grid of 0 and 2 workers) and a copy
of its folder whose env.json says another machine (an H100 box of another CPU) and whose config costs three times
as much. The two types run at the very same rates, so the cheaper per item follows from the prices alone and no
noise can flip it."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

import tunekit
from tests._postgres import postgres  # noqa: F401 - the fixture, started only by the test that asks for it
from tests.conftest import REPO, sleepy_config
from tunekit.store import CEILINGS_STUDY, MAIN_STUDY, STUDY_FILE


def _cli(*args: str) -> tuple[int, str, str]:
    from tunekit.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as done:  # errors exit; success returns
            code = int(done.code or 0)
    return code, out.getvalue(), err.getvalue()


def _copy(run: Path, to: Path, *, gpu: str | None = None, **config: Any) -> Path:
    """The run's folder as another run: its env.json naming ``gpu`` (and another CPU), its study's config changed."""
    shutil.copytree(run, to)
    if gpu is not None:
        env = json.loads((to / "env.json").read_text())
        env["gpus"] = [{"index": 0, "name": gpu}]
        env["cpu"]["model"] = "Intel Xeon"
        (to / "env.json").write_text(json.dumps(env))
    study = optuna.load_study(study_name=MAIN_STUDY, storage=f"sqlite:///{to / STUDY_FILE}")
    data = study.user_attrs["config"]
    for dotted, value in config.items():
        *path, last = dotted.split(".")
        section = data
        for key in path:
            section = section[key]
        section[last] = value
    study.set_user_attr("config", data)
    return to


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    from tunekit.launch import _start

    root = tmp_path_factory.mktemp("fleet")
    cfg = sleepy_config(**{"strategy": "grid", "trial.measure_windows": 3, "trial.window_s": 0.3, "cost.per_hour": 1})
    with pytest.MonkeyPatch.context() as mp:  # as conftest's autouse fixtures do for each test
        mp.chdir(REPO)
        real = _start.child_env
        mp.setattr(_start, "child_env", lambda: {k: v for k, v in real().items() if k != "PYTEST_CURRENT_TEST"})
        sweep = tunekit.sweep(cfg, out=root / "cpu")
    assert sweep.recommendation is not None, sweep.reason
    h100 = _copy(root / "cpu", root / "h100", gpu="NVIDIA H100 80GB HBM3", **{"cost.per_hour": 3.0})
    return SimpleNamespace(root=root, cpu=root / "cpu", h100=h100, out=root / "compare")


def test_two_machine_types_and_the_cheaper_per_item(fleet: SimpleNamespace):
    code, out, err = _cli("compare", str(fleet.cpu), str(fleet.h100), "--out", str(fleet.out))
    assert code == 0, err
    assert out.startswith("Cheapest per sample: cpu (no GPU, 2 CPUs") and "3.00x h100's" in out
    assert "★ cpu" in err and "NVIDIA H100" in err and "★ cheapest per sample" in err  # the table, on stderr
    md = (fleet.out / "compare.md").read_text()
    assert "| h100 | 1x NVIDIA H100 80GB HBM3, 2 CPUs (Intel Xeon)" in md
    assert (fleet.out / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_json_fields_and_intervals(fleet: SimpleNamespace):
    code, out, err = _cli("compare", str(fleet.cpu), str(fleet.h100), "--out", str(fleet.out), "--json")
    assert code == 0, err
    data = json.loads(out)
    cpu, h100 = data["types"]
    assert (cpu["type"], cpu["run"], h100["type"], h100["run"]) == ("cpu", str(fleet.cpu), "h100", str(fleet.h100))
    assert (cpu["per_hour"], h100["per_hour"]) == (1.0, 3.0) and cpu["priced_by"] == "cost.per_hour"
    assert cpu["machine"]["gpus"] == 0 and h100["machine"]["gpu"] == "NVIDIA H100 80GB HBM3"
    for t in data["types"]:
        assert t["knee"]["num_workers"] in (0, 2) and t["items_per_hour"] == pytest.approx(t["rate"] * 3600)
        low, high = t["rate_interval"]
        assert low < t["rate"] < high
        low, high = t["items_per_money_interval"]
        assert low < t["items_per_money"] < high
        assert t["items_per_money"] == pytest.approx(t["rate"] * 3600 / t["per_hour"])
    cheapest = data["cheapest"]
    assert cheapest["type"] == "cpu" and cheapest["next"] == "h100"
    assert cheapest["ratio"] == pytest.approx(3.0)
    overlap = cpu["items_per_money_interval"][0] <= h100["items_per_money_interval"][1]
    assert cheapest["overlap"] is overlap and cheapest["settled"] is not overlap
    assert "Cheapest per sample" in err  # the sentence goes to stderr beside the JSON


def test_a_price_given_on_the_command_line_wins(fleet: SimpleNamespace):
    code, out, err = _cli(
        "compare", str(fleet.cpu), str(fleet.h100), "--out", str(fleet.out), "--per-hour", "h100=0.25", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["types"][1]["priced_by"] == "--per-hour" and data["types"][1]["per_hour"] == 0.25
    assert data["cheapest"]["type"] == "h100" and data["cheapest"]["ratio"] == pytest.approx(4.0)


def test_another_job_is_refused_in_one_line(fleet: SimpleNamespace, tmp_path: Path):
    slower = _copy(fleet.cpu, tmp_path / "slower", gpu="NVIDIA A100", **{"workload.dataset_args.sample_wait_s": 0.01})
    code, out, err = _cli("compare", str(fleet.cpu), str(slower), "--out", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"{fleet.cpu} and {slower} are different jobs" in err
    assert "workload.dataset_args.sample_wait_s: 0.005 against 0.01" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("{cpu}", "{missing}"), "{missing}: no such folder"),
        (("sqlite:///{missing}",), "sqlite:///{missing}: no such file"),
        (("{cpu}", "{cpu}"), "are one machine type"),
        (("{cpu}", "{h100}", "--per-hour", "a100=2"), "--per-hour a100=2: 'a100' names no run"),
        (("{cpu}", "{h100}", "--per-hour", "h100=free"), "PRICE a number above 0"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(fleet: SimpleNamespace, tmp_path: Path, args: tuple[str, ...], words: str):
    paths = {"cpu": fleet.cpu, "h100": fleet.h100, "missing": tmp_path / "missing"}
    code, out, err = _cli("compare", *(a.format(**paths) for a in args), "--out", str(tmp_path / "out"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert words.format(**paths) in err


def test_two_folders_of_one_name_are_told_apart_by_their_paths(fleet: SimpleNamespace, tmp_path: Path):
    other = _copy(fleet.cpu, tmp_path / "b" / "cpu", gpu="NVIDIA A100")
    code, out, err = _cli("compare", str(fleet.cpu), str(other), "--out", str(tmp_path / "out"), "--json")
    assert code == 0, err
    assert [t["type"] for t in json.loads(out)["types"]] == [str(fleet.cpu), str(other)]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_runs_of_one_database(fleet: SimpleNamespace, tmp_path: Path, request: pytest.FixtureRequest, backend: str):
    """Two machine types' runs in one database (``tunekit/<name>`` studies, as sweeps with ``--storage`` write
    them), a SQLite file or a real PostgreSQL server's: its URL names them all, each with the machine its study
    records; the server's password is shown nowhere."""
    from tests._postgres import PASSWORD

    url = request.getfixturevalue("postgres").database() if backend == "postgresql" else f"sqlite:///{tmp_path}/f.db"
    written = url.replace("postgresql://", "postgresql+psycopg2://")  # optuna's own calls name the driver installed
    machines = {"cpu": ("CPU: AMD EPYC", None, 0, 1.0), "h200": ("NVIDIA H200", "NVIDIA H200", 1, 3.0)}
    for name, (device, gpu, gpus, price) in machines.items():
        for kind in (MAIN_STUDY, CEILINGS_STUDY):
            optuna.copy_study(
                from_study_name=kind,
                from_storage=f"sqlite:///{fleet.cpu / STUDY_FILE}",
                to_storage=written,
                to_study_name=f"{kind}/{name}",
            )
        study = optuna.load_study(study_name=f"{MAIN_STUDY}/{name}", storage=written)
        study.set_user_attr("config", {**study.user_attrs["config"], "name": name, "cost": {"per_hour": price}})
        study.set_user_attr("run", name)
        study.set_user_attr("machine", {"device": device, "gpu": gpu, "gpus": gpus, "cpu": "AMD EPYC", "cpus": 2})
    code, out, err = _cli("compare", url, "--out", str(tmp_path / "out"), "--json")
    assert code == 0, err
    data = json.loads(out)
    found = [(t["type"], t["machine"]["gpus"], t["per_hour"]) for t in data["types"]]
    assert found == [("cpu", 0, 1.0), ("h200", 1, 3.0)]
    assert data["types"][1]["machine_text"].startswith("1x NVIDIA H200, 2 CPUs")
    assert data["cheapest"]["type"] == "cpu" and data["cheapest"]["ratio"] == pytest.approx(3.0)
    assert PASSWORD not in out + err + (tmp_path / "out" / "compare.md").read_text()
