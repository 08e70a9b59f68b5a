"""tunekit compare's rendering on a saved run (tests/fixtures/run-h200, the ResNet-50 sweep on an H200) set against
itself as another machine type: the table's cells, compare.md, the JSON fields, the plot's data and its PNG. The
run predates rate intervals and repeats, so each knee's interval is the one the stated run-to-run prior gives a single
run (rules.RUN_SPREAD_PRIOR), said as such, never narrower."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tunekit import rules, store
from tunekit.analysis import Comparison, compare
from tunekit.config import from_dict
from tunekit.report import cheapest_text, compare_json, compare_md, type_run, write_compare
from tunekit.report.plots import compare_data

KNEE_RATE = 2814.18
"""The fixture's knee: 16 workers, prefetch 4, batch 512 (samples/s)."""


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> Comparison:
    run_dir = tmp_path_factory.mktemp("compare") / "h200"
    shutil.copytree(REPO / "tests" / "fixtures" / "run-h200", run_dir)
    runs = store.load_run(run_dir)
    cfg, rows = from_dict(runs.config), runs.rows()
    env: dict[str, Any] = json.loads((run_dir / "env.json").read_text())
    other = copy.deepcopy(env)
    for gpu in other["gpus"]:
        gpu["name"] = "NVIDIA A100-SXM4-80GB"
    return compare(
        [
            type_run("runs/h200", cfg, rows, env=env, strategy="staged", per_hour=4.5),
            type_run("runs/a100", cfg, rows, env=other, strategy="staged", per_hour=1.5),
        ]
    )


def test_the_saved_run_priced_twice(comparison: Comparison):
    h200, a100 = comparison.types
    assert h200.machine_text.startswith("1x NVIDIA H200, 16 CPUs") and "A100" in a100.machine_text
    assert h200.knee is not None and h200.knee.knobs.num_workers == 16 and h200.rate == pytest.approx(KNEE_RATE)
    assert h200.priced_by == "--per-hour" and h200.per_money == pytest.approx(KNEE_RATE * 3600 / 4.5)
    ch = comparison.cheapest
    assert ch is not None and ch.type is a100 and ch.ratio == pytest.approx(3.0)
    assert ch.overlap is False and ch.settled  # 3x apart: beyond the prior's ±15 % of a single run
    text = cheapest_text(comparison)
    assert text.startswith("Cheapest per sample: runs/a100") and "3.00x runs/h200's" in text
    assert "do not overlap" in text


def test_compare_json_and_md(comparison: Comparison):
    data = compare_json(comparison)
    assert [t["type"] for t in data["types"]] == ["runs/h200", "runs/a100"]
    first = data["types"][0]
    low, high = first["rate_interval"]
    half = rules.mean_interval(1, rules.spread([]))  # one run, the prior
    assert first["knee"]["num_workers"] == 16 and (low, high) == pytest.approx(
        (KNEE_RATE * (1 - half), KNEE_RATE * (1 + half)), rel=1e-3
    )
    assert first["items_per_hour"] == pytest.approx(KNEE_RATE * 3600) and first["machine"]["gpu"] == "NVIDIA H200"
    cheapest = {"type": "runs/a100", "next": "runs/h200", "ratio": pytest.approx(3.0), "overlap": False}
    assert data["cheapest"] == {**cheapest, "settled": True}
    md = compare_md(comparison, "compare.png")
    assert "| runs/a100 | 1x NVIDIA A100-SXM4-80GB" in md and "(interval unknown)" not in md
    assert "![samples/s and samples per unit of money per machine type](compare.png)" in md


def test_the_plot_data_and_its_png(comparison: Comparison, tmp_path: Path):
    plot = compare_data(comparison)
    assert [b.label for b in plot.rates] == ["runs/h200", "runs/a100"]
    assert [b.cheapest for b in plot.per_money] == [False, True]
    assert plot.per_money[1].value == pytest.approx(3 * plot.per_money[0].value)
    assert plot.rates[0].low < KNEE_RATE < plot.rates[0].high
    md, png = write_compare(tmp_path / "out", comparison)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "(compare.png)" in md.read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["compare.md", "compare.png"]  # no temporaries
