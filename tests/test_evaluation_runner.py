"""`biodistil evaluate`: recipe resolution (offline, no data) and a tiny end-to-end run on NCBI-disease and GAD
slices (skipped when the data folder is absent), with resume."""

import json
import os
import re
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForMaskedLM

from biodistil.cli.main import main
from biodistil.config import load_recipe, validate_recipe
from biodistil.data.paths import resolve_data_root
from biodistil.errors import BiodistilError
from biodistil.evaluation.recipe import EvaluateRecipe
from biodistil.evaluation.runner import (
    PlannedTask,
    check_models,
    plan_cells,
    plan_task,
    plan_tasks,
    run_evaluate,
    summarize_task,
)
from biodistil.models.student import student_from_teacher_layers
from biodistil.paths import label_from_path, unique_labels

REPO = Path(__file__).resolve().parents[1]


def data_root() -> Path | None:
    try:
        return resolve_data_root(os.environ.get("BIODISTIL_DATA"))
    except BiodistilError:
        return None


def recipe(**raw) -> EvaluateRecipe:
    return validate_recipe(EvaluateRecipe, {"models": ["m"], "tasks": ["gad"], **raw})


# ------------------------------------------------------------------------------------------ recipe


def test_labels_from_paths_and_hub_ids():
    assert label_from_path("runs/demo/teacher/model") == "teacher"
    assert label_from_path("dmis-lab/biobert-base-cased-v1.2") == "biobert-base-cased-v1.2"
    assert unique_labels([(None, "a/x/model"), (None, "b/x/model"), ("mine", "c/x")]) == ["a-x", "b-x", "mine"]
    with pytest.raises(ValueError, match="give each a name"):
        unique_labels([(None, "x"), (None, "x")])


def test_models_override_is_a_yaml_list():
    loaded = load_recipe(EvaluateRecipe, REPO / "recipes/eval-quick.yaml",
                         ["models=[runs/demo/teacher/model,runs/demo/student/model]", "num_seeds=2"])
    assert loaded.model_labels() == ["teacher", "student"]
    assert loaded.reference_label() == "teacher" and loaded.seeds == [42, 43]
    named = recipe(models=[{"name": "big", "path": "x/model"}, "y/model"], report={"reference": "y"})
    assert named.model_labels() == ["big", "y"] and named.reference_label() == "y"


def test_recipe_errors_name_the_field():
    with pytest.raises(BiodistilError, match=re.escape("report.reference 'z' is not a model name")):
        recipe(report={"reference": "z"})
    with pytest.raises(BiodistilError, match=re.escape("unknown key 'tasks.0.bogus'")):
        recipe(tasks=[{"name": "gad", "bogus": 1}])
    with pytest.raises(BiodistilError, match="models"):
        recipe(models=[])
    load_recipe(EvaluateRecipe, REPO / "recipes/eval-blurb.yaml")  # the shipped recipes validate


def test_settings_precedence_entry_then_recipe_then_task():
    r = recipe(tasks=[{"name": "gad", "epochs": 1}, "ncbi_disease"], train={"learning_rate": 1e-4, "epochs": 4},
               data={"max_examples": 50})
    gad, ncbi = (plan_task(entry, r) for entry in r.tasks)
    assert (gad.epochs, gad.learning_rate, gad.batch_size) == (1, 1e-4, 32)  # batch size from the task
    assert ncbi.epochs == 4 and ncbi.patience == 3 and ncbi.max_examples == 50
    assert gad.family == "relation_extraction" and ncbi.family == "ner" and gad.folds == (None,)
    assert plan_task(r.tasks[0], recipe()).patience == 2  # GAD's own
    assert plan_task(r.tasks[0], recipe(train={"early_stopping_patience": 0})).patience is None  # 0 = off


def test_label_policy_and_folds_per_task():
    r = recipe(tasks=[{"name": "ncbi_disease", "label_policy": "all", "max_length": 64},
                      {"name": "gad_cv", "max_folds": 2, "family": "question_answering"}])
    ncbi, gad_cv = (plan_task(entry, r) for entry in r.tasks)
    assert ncbi.spec.label_policy == "all" and ncbi.spec.max_length == 64
    assert gad_cv.folds == (1, 2) and gad_cv.family == "question_answering" and gad_cv.settings()["n_folds"] == 2
    cells = plan_cells([("a", "pa"), ("b", "pb")], [gad_cv], [1, 2])
    assert len(cells) == 8 and cells[0].folder(Path("o")) == Path("o/cells/a/gad_cv/seed-1/fold-1")
    with pytest.raises(BiodistilError, match="truncation 'split' is only for token_classification"):
        plan_task(recipe(tasks=[{"name": "gad", "truncation": "split"}]).tasks[0], recipe())


def test_missing_tasks_are_skipped_with_a_note(tmp_path):
    r = recipe(tasks=["gad"], data={"root": str(tmp_path)})
    planned, skipped = plan_tasks(r)
    assert planned == [] and skipped[0]["task"] == "gad" and "data absent" in skipped[0]["reason"]
    with pytest.raises(BiodistilError, match="files absent"):
        plan_tasks(recipe(tasks=["gad"], data={"root": str(tmp_path), "skip_missing": False}))


def test_missing_model_folder_is_an_error_before_any_work(tmp_path):
    with pytest.raises(BiodistilError, match=f"model folder '{os.path.abspath('runs/nowhere/model')}' not found"):
        check_models(recipe(models=["runs/nowhere/model"]), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BiodistilError, match=re.escape("has no config.json")):
        check_models(recipe(models=[str(tmp_path / "empty")]), tmp_path)
    with pytest.raises(BiodistilError, match=re.escape("hf download org/hub-model --local-dir DIR")):
        check_models(recipe(models=["org/hub-model"]), tmp_path)  # offline: neither the Hub nor its cache has it


def test_a_model_entry_with_layers_is_evaluated_as_that_shallower_model(teacher_dir, tmp_path):
    models = check_models(recipe(models=[str(teacher_dir), {"name": "half", "path": str(teacher_dir),
                                                            "layers": [1, 3]}]), tmp_path)
    assert models[0][1] == str(teacher_dir)
    label, path = models[1]
    assert label == "half" and path == str(tmp_path / "init_models" / "half" / "init_model")
    assert AutoConfig.from_pretrained(path).num_hidden_layers == 2


def test_cross_validation_seeds_average_their_folds():
    task: PlannedTask = plan_task(recipe(tasks=[{"name": "gad_cv", "max_folds": 2}]).tasks[0], recipe())

    def cell(seed, fold, f1):
        return {"seed": seed, "fold": fold, "test": {"f1": f1, "precision": f1}, "truncated_examples": {"test": 1},
                "unpredicted_words": 0, "test_examples": 10}

    records = [cell(1, 1, 0.6), cell(1, 2, 0.8), cell(2, 1, 0.5), cell(2, 2, 0.7), cell(3, 1, 0.9)]
    summary = summarize_task(records, task)
    assert summary["seeds"] == {"1": pytest.approx(0.7), "2": pytest.approx(0.6)}  # seed 3 lacks fold 2
    assert summary["median"] == pytest.approx(0.65) and summary["n"] == 2
    assert summary["std"] == pytest.approx(0.0707107, abs=1e-6)
    assert summary["truncated_examples"] == {"test": 5}


# ------------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, teacher_dir, tokenizer) -> Path:
    """A 2-layer student of the tiny conftest teacher (its layers 0 and 2)."""
    student = student_from_teacher_layers(AutoModelForMaskedLM.from_pretrained(teacher_dir), [0, 2])
    folder = tmp_path_factory.mktemp("student")
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _tiny_recipe(out: Path, teacher_dir: Path, student_dir: Path, **extra) -> EvaluateRecipe:
    raw = {
        "run": {"output_dir": str(out), "seed": 7},
        "models": [{"name": "teacher", "path": str(teacher_dir)}, str(student_dir)],
        "tasks": [{"name": "ncbi_disease", "label_policy": "all"}, "gad"],
        "num_seeds": 1,
        "train": {"learning_rate": 1e-3, "batch_size": 8, "epochs": 1, "progress_bar": False},
        "data": {"root": str(data_root()), "max_examples": 16},
        **extra,
    }
    return validate_recipe(EvaluateRecipe, raw)


def _cell_files(out: Path) -> list[Path]:
    return sorted((out / "cells").rglob("metrics.json"))


@pytest.mark.slow
@pytest.mark.skipif(data_root() is None, reason="no biodistil data folder (../shared/data or $BIODISTIL_DATA)")
def test_tiny_evaluation_writes_predictions_metrics_report_and_resumes(tmp_path, teacher_dir, student_dir):
    out = tmp_path / "eval"
    r = _tiny_recipe(out, teacher_dir, student_dir)
    student = r.model_labels()[1]
    report = run_evaluate(r)
    assert report == out / "report.md" and (out / "report.html").is_file() and (out / "config.yaml").is_file()
    assert (out / "score_vs_parameters.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cells = _cell_files(out)
    assert len(cells) == 4

    ncbi = json.loads((out / "cells/teacher/ncbi_disease/seed-7/metrics.json").read_text())
    assert ncbi["headline"] == "f1" and 0 <= ncbi["score"] <= 1 and ncbi["settings"]["label_policy"] == "all"
    assert ncbi["max_length_used"] == 64 and set(ncbi["truncated_examples"]) == {"train", "dev", "test"}
    rows = [json.loads(line) for line in (out / "cells/teacher/ncbi_disease/seed-7/predictions.jsonl").open()]
    assert len(rows) == ncbi["test_examples"] == 16
    assert all(len(row["prediction"]) == len(row["tokens"]) == len(row["gold"]) for row in rows)  # word level
    gad_rows = [json.loads(line) for line in (out / f"cells/{student}/gad/seed-7/predictions.jsonl").open()]
    assert {"id", "gold", "prediction", "probabilities"} <= set(gad_rows[0])
    assert sum(gad_rows[0]["probabilities"].values()) == pytest.approx(1, abs=1e-4)
    assert not (out / "cells/teacher/gad/seed-7/train/checkpoints").exists()  # no models kept by default

    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["reference"] == "teacher"
    assert set(results["summary"][student]) == {"ncbi_disease", "gad"}
    text = report.read_text()
    assert "| teacher |" in text and f"| {student} |" in text and "ncbi_disease (f1)" in text
    assert "% of teacher" in text and "Examples capped" in text

    # without --resume a used folder is refused; with it, finished cells are skipped and removed ones rerun, here
    # side by side in two worker processes (`evaluate --processes 2`), each at 1 thread, each with its log
    with pytest.raises(BiodistilError, match="--resume"):
        run_evaluate(r)
    stamps = {path: path.stat().st_mtime_ns for path in cells}
    lost = [out / f"cells/{student}/gad/seed-7/metrics.json", out / "cells/teacher/ncbi_disease/seed-7/metrics.json"]
    for path in lost:
        path.unlink()
    run_evaluate(r, resume=True, processes=2)
    changed = [path for path in _cell_files(out) if stamps.get(path) != path.stat().st_mtime_ns]
    assert sorted(changed) == sorted(lost)
    logs = sorted(path.name for path in (out / "logs").iterdir())
    assert logs == sorted([f"{student}-gad-seed-7.log", "teacher-ncbi_disease-seed-7.log"])
    for log in logs:
        assert "CPU threads: 1 (OMP_NUM_THREADS)" in (out / "logs" / log).read_text(), log
    assert json.loads((out / "results.json").read_text())["complete"], "written once both workers finished"

    # a finished cell run with other settings is not silently reused
    with pytest.raises(BiodistilError, match="learning_rate"):
        run_evaluate(_tiny_recipe(out, teacher_dir, student_dir, train={"learning_rate": 5e-4, "batch_size": 8,
                                                                        "epochs": 1}), resume=True)


def test_cli_evaluate_reports_a_recipe_error(tmp_path, capsys):
    code = main(["evaluate", str(REPO / "recipes/eval-quick.yaml"), "models=[runs/absent/model]",
                 "--out", str(tmp_path / "e")])
    assert code == 2 and f"model folder '{os.path.abspath('runs/absent/model')}' not found" in capsys.readouterr().err
