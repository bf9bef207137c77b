"""The demo's quick mode end to end on the real data folder (skipped when the data is absent)."""

import json
import os
from pathlib import Path

import pytest

from biodistil.data.paths import resolve_data_root
from biodistil.demo import run_demo
from biodistil.errors import BiodistilError


def data_root() -> Path | None:
    try:
        return resolve_data_root(os.environ.get("BIODISTIL_DATA"))
    except BiodistilError:
        return None


@pytest.mark.slow
@pytest.mark.skipif(data_root() is None, reason="no biodistil data folder (../shared/data or $BIODISTIL_DATA)")
def test_quick_demo_writes_report_for_three_models(tmp_path):
    report = run_demo(tmp_path / "demo", data=data_root(), quick=True)
    content = json.loads((tmp_path / "demo" / "report.json").read_text())
    assert [row["model"] for row in content["rows"]] == ["teacher", "distilled student", "student without teacher"]
    teacher, student, baseline = content["rows"]
    assert student["layers"] * 2 == teacher["layers"] and baseline["layers"] == student["layers"]
    assert student["parameters"] < teacher["parameters"]
    for row in content["rows"]:
        assert 0.0 <= row["test_f1"] <= 1.0 and row["finetune_tokens_per_s"] > 0
    assert "NCBI-disease" in report.read_text()
    # a finished demo is reused, not recomputed: only the report is written again, no stage file is touched
    reports = {tmp_path / "demo" / "report.json", tmp_path / "demo" / "report.md"}
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "demo").rglob("*") if p.is_file() and p not in reports}
    run_demo(tmp_path / "demo", data=data_root(), quick=True)
    assert json.loads((tmp_path / "demo" / "report.json").read_text())["rows"] == content["rows"]
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "demo").rglob("*") if p.is_file() and p not in reports}
    assert after == stamps, "a second run rewrote or added stage files"


def test_missing_data_folder_is_a_clear_error(tmp_path):
    with pytest.raises(BiodistilError, match="Data folder not found"):
        run_demo(tmp_path / "demo", data=tmp_path / "nowhere", quick=True)
