"""The demo's quick mode end to end on the real data folder (skipped when the data is absent)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from recipe_fixtures import data_root

from biodistil.config import validate_recipe
from biodistil.demo import PLAN, run_demo, study_recipe
from biodistil.demo import compare as demo_compare
from biodistil.errors import BiodistilError
from biodistil.kd.recipe import StudyRecipe
from biodistil.paths import absolute


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
    raw = study_recipe(PLAN, tmp_path, tmp_path, "minilm-l6", train_size=5424)
    recipe = validate_recipe(StudyRecipe, raw)
    assert [arm.name for arm in recipe.arms] == ["fine-tuned", "distilled", "label-free"]
    budget = PLAN.labelled(5424)
    assert budget == 814, "a seeded 15% of the training sentences"
    defaults = raw["defaults"]
    assert defaults["finetune"]["train"]["max_steps"] == defaults["kd"]["train"]["max_steps"] == PLAN.student_steps
    assert "epochs" not in defaults["kd"]["kd"] and not any("epochs" in arm.overrides.get("finetune", {})
                                                              for arm in recipe.arms), "steps, not epochs, are equal"
    assert defaults["finetune"]["task"]["train_examples"] == budget, "the fine-tuned arm: the labelled budget alone"
    distilled, label_free = recipe.arms[1].overrides, recipe.arms[2].overrides
    assert distilled["transfer"] == {"source": {"kind": "in_domain", "split": "train"}, "keep_labels": True,
                                     "labelled": budget}, "KD on every training sentence, CE on the budget's labels"
    assert distilled["kd"]["beta"] > 0 and label_free["kd"]["beta"] == 0.0
    assert label_free["transfer"]["keep_labels"] is False
    teacher = recipe.tasks[0].teacher_overrides
    assert teacher["task"]["train_examples"] is None, "the teacher learns from the whole training set"
    assert teacher["finetune"]["epochs"] is None and teacher["train"]["max_steps"] == PLAN.student_steps, \
        "the teacher trains as long as each student"
    assert teacher["train"]["eval_every"] == defaults["finetune"]["train"]["eval_every"], "dev-selected like them"
    assert len(PLAN.seeds) >= 3


def test_the_same_labels_option_gives_the_teacher_the_students_budget(tmp_path):
    raw = study_recipe(replace(PLAN, same_labels=True), tmp_path, tmp_path, "minilm-l6", train_size=5424)
    recipe = validate_recipe(StudyRecipe, raw)
    assert recipe.tasks[0].teacher_overrides["task"]["train_examples"] == 814
    assert recipe.arms[1].overrides["transfer"] == {"source": {"kind": "in_domain", "split": "train",
                                                               "max_examples": 814}, "keep_labels": True}


def test_the_demo_recipe_records_absolute_paths_whatever_the_spelling_of_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = validate_recipe(StudyRecipe, study_recipe(PLAN, Path(absolute("runs/demo")), tmp_path, "minilm-l6",
                                                         train_size=5424))
    spelled = validate_recipe(StudyRecipe, study_recipe(PLAN, tmp_path / "runs" / "demo", tmp_path, "minilm-l6",
                                                        train_size=5424))
    assert relative.model_dump() == spelled.model_dump()
    assert relative.run.output_dir == str(tmp_path / "runs" / "demo" / "study")


def test_a_difference_is_a_finding_only_when_its_confidence_interval_excludes_zero():
    """The demo's verdicts use the one rule (tasks.significance): Welch's t-test on the per-seed F1."""
    from biodistil.tasks.significance import compare_scores

    def arm(*f1: float) -> dict:
        return {"model": f"model at {sum(f1) / len(f1):.2f}", "f1": list(f1), "seeds": len(f1)}

    def compare(question: str, first: dict, second: dict) -> str:
        return demo_compare(question, first, second, compare_scores(first["f1"], second["f1"]))

    # (0.71, 0.69) vs (0.655, 0.665): +0.04, se = √(2e-4/2 + 5e-5/2) = 0.01118, ν = 1.47, half-width 0.069: the
    # interval holds 0; three seeds each (0.70, 0.71, 0.69) vs (0.66, 0.665, 0.655): se = 0.00645, ν = 2.9,
    # half-width 0.0208: it does not
    assert "inconclusive — would need about" in compare("q", arm(0.71, 0.69), arm(0.655, 0.665))
    found = compare("q", arm(0.70, 0.71, 0.69), arm(0.66, 0.665, 0.655))
    assert "+0.040 F1 (95% CI +0.0" in found and "Welch's t-test" in found and "a finding" in found
    assert "model at 0.70 scores higher than the model at 0.66" in compare("q", arm(0.66, 0.665, 0.655),
                                                                          arm(0.70, 0.71, 0.69))
    assert "one seed" in compare("q", arm(0.70), arm(0.60, 0.601))


def _scores(f1: float) -> dict:
    return {"f1": f1, "precision": f1, "recall": f1}


def _speed(label: str, ms: float, parameters: int) -> dict:
    return {"label": label, "parameters": parameters, "latency": {"128": {"median_ms": ms}},
            "throughput": {"128": {"sequences_per_s": 1000 / ms}}}


def _finished():
    """A finished demo's records, as its stages leave them (the study's summary, the scoring, the export)."""
    runs = [{"arm": arm, "seed": seed, "folder": f"ncbi_disease/{arm}/seed-{seed}", "test": _scores(f1),
             "wall_seconds": 60.0, "steps": 250, "degenerate": "O" if arm == "fine-tuned" and seed == 2 else ""}
            for arm, scores in {"fine-tuned": (0.64, 0.65), "distilled": (0.74, 0.75),
                                "label-free": (0.73, 0.60)}.items() for seed, f1 in zip((1, 2), scores, strict=True)]
    summary = {"teachers": {"ncbi_disease": {"model": "ncbi_disease/teacher/model", "test": _scores(0.78),
                                             "wall_seconds": 120.0, "steps": 170}},
               "runs": runs, "machine": {"cpu": "test CPU", "torch_threads": 2}}
    deployed = {"results": {"cells": [{"model": "student-onnx", "test": _scores(0.74)},
                                      {"model": "student-onnx-int8", "test": _scores(0.736), "degenerate": ""}]},
                "bench": {"device": "cpu", "settings": {"repeats": 20, "warmup": 3},
                          "models": [_speed("teacher", 40.0, 22_700_000), _speed("student", 20.0, 17_400_000),
                                     _speed("student-onnx", 16.0, 17_400_000),
                                     _speed("student-onnx-int8", 8.0, 17_400_000)]}}
    return summary, deployed, {"accuracy": {"int8_drop": 0.001, "examples": 923}}


def test_the_report_puts_every_arm_and_the_exports_in_one_table_and_says_what_is_a_finding(tmp_path):
    from biodistil.demo import build_report, render_report

    summary, deployed, export = _finished()
    report = build_report(PLAN, summary, deployed, export, tmp_path, 5424)
    rows = {row["arm"] or "teacher": row for row in report["models"]}
    assert list(rows) == ["teacher", "fine-tuned", "distilled", "label-free", "student-onnx", "student-onnx-int8"]
    assert rows["distilled"]["f1_mean"] == pytest.approx(0.745) and rows["distilled"]["speedup"] == 2.0
    assert rows["student-onnx-int8"]["speedup"] == 5.0 and rows["fine-tuned"]["degenerate"] == "O"
    assert report["demo_minutes"] == round((120 + 6 * 60) / 60, 1)
    text = render_report(report)
    # the three differences are one family (Holm): p 0.005 × 3 = 0.015 stays a finding; seeds for 80% power at 0.05/3
    assert "95% CI +0.070 to +0.130, Welch's t-test, p = 0.005, Holm p = 0.015 (family of 3)): a finding" in \
        text.split("What the teacher adds")[1].splitlines()[0], "+0.10 F1 with sd 0.007 (2 seeds each) is a finding"
    assert "inconclusive — would need about 224 seeds per arm" in \
        text.split("The teacher's outputs alone")[1].splitlines()[0], "+0.02 with sd 0.09 and 0.007 is not"
    assert "+0.080 F1 (95% CI" in text.split("What the budget's labels add")[1].splitlines()[0]
    assert "never saw added nothing measurable in Study 4" in text
    assert "**(one class: O)**" in text and "within 1 point" in text and "-0.0010 F1 (int8" in text
    ending = render_report(report, tmp_path / "demo").rstrip()
    assert ending.endswith(f"biodistil predict {tmp_path / 'demo' / 'student-onnx'} YOUR_DOCUMENTS --out "
                           "entities.jsonl"), "the report ends with the command that runs its student on documents"


@pytest.mark.skipif(data_root() is None, reason="no biodistil data folder (../shared/data or $BIODISTIL_DATA)")
def test_record_writes_the_report_the_docs_quote(tmp_path, monkeypatch):
    from biodistil import demo

    summary, deployed, export = _finished()
    study = tmp_path / "demo" / "study"
    study.mkdir(parents=True)
    (study / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    monkeypatch.setattr(demo, "_run_study", lambda *args: study)
    monkeypatch.setattr(demo, "_export", lambda *args: export)
    monkeypatch.setattr(demo, "_deployed", lambda *args: deployed)
    record = tmp_path / "docs" / "demo.json"
    record.parent.mkdir()
    demo.run_demo(tmp_path / "demo", data=data_root(), record=record)
    assert json.loads(record.read_text()) == json.loads((tmp_path / "demo" / "report.json").read_text())
    block = demo.results_block(json.loads(record.read_text()))
    assert block in (tmp_path / "demo" / "report.md").read_text(), "the docs quote the report's own table"
    from biodistil.cli.main import main

    assert main(["demo", "--quick", "--out", str(tmp_path / "q"), "--record", str(record)]) == 2
    assert not (tmp_path / "q").exists(), "refused before anything ran"
