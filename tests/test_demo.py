"""The demo's quick mode end to end on the real data folder (skipped when the data is absent)."""

import json
import math
from dataclasses import replace

import pytest
from recipe_fixtures import data_root

from biodistil.config import validate_recipe
from biodistil.demo import PLAN, compare, run_demo, study_recipe
from biodistil.errors import BiodistilError
from biodistil.kd.recipe import StudyRecipe


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


def test_every_student_arm_of_the_real_demo_trains_the_same_number_of_steps(tmp_path):
    plan = replace(PLAN, label_free=True)
    raw = study_recipe(plan, tmp_path, tmp_path, "minilm-l6", train_size=5424)
    recipe = validate_recipe(StudyRecipe, raw)
    assert [arm.name for arm in recipe.arms] == ["distilled", "without-teacher", "label-free"]
    batch = raw["defaults"]["kd"]["train"]["batch_size"]
    steps = math.ceil(plan.student_epochs * plan.labelled / batch)
    kd = raw["defaults"]["kd"]
    assert kd["kd"]["epochs"] == recipe.arms[1].overrides["finetune"]["epochs"] == plan.student_epochs
    assert kd["transfer"] == {"source": {"kind": "in_domain", "split": "train", "max_examples": plan.labelled},
                              "keep_labels": True}
    label_free = recipe.arms[2].overrides
    assert label_free["transfer"]["keep_labels"] is False and label_free["kd"]["beta"] == 0.0
    assert round(label_free["kd"]["epochs"] * 5424 / batch) == steps
    default = validate_recipe(StudyRecipe, study_recipe(PLAN, tmp_path, tmp_path, "minilm-l6", train_size=5424))
    assert [arm.name for arm in default.arms] == ["distilled", "without-teacher"]


def test_a_difference_is_a_finding_only_beyond_twice_the_seed_spread():
    def arm(mean: float, sd: float | None, seeds: int = 2) -> dict:
        return {"model": f"model at {mean}", "f1_mean": mean, "f1_sd": sd, "seeds": seeds}

    assert "more than twice the seed spread" in compare("q", arm(0.70, 0.01), arm(0.66, 0.005))
    assert "+0.040 F1" in compare("q", arm(0.70, 0.01), arm(0.66, 0.005))
    assert "model at 0.7 scores higher than the model at 0.66" in compare("q", arm(0.66, 0.005), arm(0.70, 0.01))
    assert "not a finding" in compare("q", arm(0.70, 0.03), arm(0.66, 0.005))
    assert "from one seed" in compare("q", arm(0.70, None, seeds=1), arm(0.60, 0.001))
