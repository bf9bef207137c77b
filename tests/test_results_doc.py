"""docs/results.md is backed by the committed study records: its tables are the ones docs/results/tables.py prints
from docs/results/*.json, and each record was produced by the study recipe committed under recipes/studies/."""

import json

import pytest
from recipe_fixtures import RECIPES
from test_studies import results_tables

from biodistil.config import load_recipe, validate_recipe
from biodistil.embedded import model_name_of
from biodistil.kd.recipe import StudyRecipe
from biodistil.pipeline import PipelineRecipe

DOCS = RECIPES.parent / "docs"
STUDY_RECIPES = {"task-agnostic": "task-agnostic.yaml", "transfer-data": "transfer-data.yaml",
                 "meta-kd": "meta-kd.yaml", "cross-tokenizer": "cross-tokenizer.yaml",
                 "users-setting": "users-setting.yaml", "multi-teacher": "multi-teacher.yaml",
                 "seeds-scale": "seeds-scale.yaml"}
RUN_SPECIFIC = {"run", "data_dir"}  # output folder, data folder


def portable(settings: object) -> object:
    """A recorded recipe with each model folder the run resolved (on its machine) as the model's short name."""
    if isinstance(settings, dict):
        return {key: portable(value) for key, value in settings.items()}
    if isinstance(settings, list):
        return [portable(value) for value in settings]
    return model_name_of(settings) if isinstance(settings, str) else settings


@pytest.mark.parametrize("name", [*sorted(STUDY_RECIPES), "demo", "precision"])
def test_the_results_page_shows_the_tables_of_the_committed_record(name):
    tables = results_tables()
    assert (DOCS / "results" / f"{name}.json").is_file(), f"docs/results/{name}.json is missing"
    assert tables.block(name) in tables.page(name).read_text(encoding="utf-8"), (
        f"the {name} tables of {tables.page(name).name} differ from the record; run python docs/results/tables.py "
        "--write")


@pytest.mark.parametrize("name", ["transfer-data", "meta-kd", "users-setting", "multi-teacher"])
def test_each_study_record_was_produced_by_the_committed_recipe(name):
    """Compared by model names, without loading a model: a fetched one (mpnet-base) need not be on this machine."""
    record = json.loads((DOCS / "results" / f"{name}.json").read_text())
    recipe = load_recipe(StudyRecipe, RECIPES / "studies" / STUDY_RECIPES[name], resolve_models=False).model_dump(
        mode="json")
    # the record read as today's recipe reads it: fields added since take their defaults on both sides
    settings = {**portable(record["settings"]), **{k: recipe[k] for k in RUN_SPECIFIC}}
    ran = validate_recipe(StudyRecipe, settings, resolve_models=False).model_dump(mode="json")
    assert {k: v for k, v in ran.items() if k not in RUN_SPECIFIC} == {
        k: v for k, v in recipe.items() if k not in RUN_SPECIFIC}
    seeds = {arm["name"]: len(arm.get("seeds") or record["seeds"]) for arm in record["settings"]["arms"]}
    assert len(record["seeds"]) >= 3 and all(row["seeds"] == seeds[row["arm"]] for row in record["rows"])
    minutes = {"users-setting": 90}.get(name, 60)
    assert record["wall_seconds"] < minutes * 60, f"the study finishes within {minutes} minutes"


@pytest.mark.parametrize(("name", "tasks", "seeds", "minutes"),  # task-agnostic: 61 min sharing 2 cores with Study 4
                         [("task-agnostic", 1, 3, 65), ("cross-tokenizer", 1, 2, 30)])
def test_a_pipeline_record_was_produced_by_the_committed_pipeline(name, tasks, seeds, minutes):
    record = json.loads((DOCS / "results" / f"{name}.json").read_text())
    recipe = load_recipe(PipelineRecipe, RECIPES / "studies" / STUDY_RECIPES[name]).model_dump(mode="json")
    assert record["recipe"]["stages"] == recipe["stages"]
    results = record["stages"][-1]["results"]
    assert results["complete"] and len(results["seeds"]) >= seeds and len(results["tasks"]) >= tasks
    spent = sum(stage["summary"]["result"]["seconds"] for stage in record["stages"][:-1]) / 60
    spent += sum(cell["wall_seconds"] for cell in results["cells"]) / 60
    assert spent < minutes, f"the study finishes within {minutes} minutes"


def holds(resolved: object, written: object) -> bool:
    """Whether every setting `written` (a recipe's YAML) has its value in `resolved` (the settings a run recorded)."""
    if isinstance(written, dict):
        return isinstance(resolved, dict) and all(key in resolved and holds(resolved[key], value)
                                                  for key, value in written.items())
    return resolved == written


def test_the_seeds_scale_record_was_produced_by_the_committed_pipeline():
    record = json.loads((DOCS / "results" / "seeds-scale.json").read_text())
    recipe = load_recipe(PipelineRecipe, RECIPES / "studies" / "seeds-scale.yaml").model_dump(mode="json")
    assert record["recipe"]["stages"] == recipe["stages"]
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary = stages["study"]["summary"]
    arms = [arm["name"] for arm in recipe["stages"][1]["settings"]["arms"]]
    assert [row["arm"] for row in summary["rows"]] == arms and all(row["seeds"] >= 3 for row in summary["rows"])
    assert holds(summary["settings"]["defaults"], recipe["stages"][1]["settings"]["defaults"]), \
        "the study ran with the committed recipe's settings"
    deployed = stages["deploy"]["deploy"]
    assert set(deployed["exports"]) == {"teacher", *arms}
    assert {row["label"] for row in deployed["bench"]["models"]} >= {f"{arm}-onnx-int8" for arm in arms}
    minutes = (stages["distilled"]["summary"]["result"]["seconds"] + summary["wall_seconds"]) / 60
    assert minutes < 90, "distillation and the study leave the deploy stage its share of the 2 hours"


def test_gap_cells_say_when_a_seed_has_no_gap_to_close():
    tables = results_tables()
    assert tables.gap_cell([0.5, 0.7]) == "60 ± 14%"
    assert tables.gap_cell([0.5]) == "50%"
    assert tables.gap_cell([0.5, None]) == "n/a (no gap)", "a teacher no better than the initialisation: null"
    assert tables.gap_cell([float("nan")]) == "n/a (no gap)"


def _seeds_scale_figures() -> dict[str, str]:
    """Figures docs/results.md quotes in the prose of Study 6, formed from its record."""
    record = json.loads((DOCS / "results" / "seeds-scale.json").read_text())
    stages = {stage["name"]: stage for stage in record["stages"]}
    cells = {cell["model"]: cell["test"]["f1"] for cell in stages["deploy"]["deploy"]["results"]["cells"]}
    loss = {arm: 100 * (cells[arm] - cells[f"{arm}-onnx-int8"]) for arm in cells if f"{arm}-onnx-int8" in cells}
    summary = stages["study"]["summary"]
    teacher = summary["teachers"]["ncbi_disease"]["test"]["f1"]
    means = {row["arm"]: row["mean"] for row in summary["rows"]}
    six = [loss[arm] for arm in ("ft-6x768", "kd-6x768", "ft-6x768-distilled")]
    minutes = stages["distilled"]["summary"]["result"]["seconds"] / 60
    return {
        "distillation minutes": f"250 steps of 32 × 128, {minutes:.1f} min)",
        "int8 loss of the 6 × 768 students": f"loses {min(six):.2f}-{max(six):.2f} F1",
        "int8 loss per arm": f"−{loss['ft-6x768']:.1f} (ft-6x768), −{loss['kd-6x768']:.1f} (kd-6x768), "
                             f"−{loss['ft-6x768-distilled']:.1f} (ft-6x768-distilled), −{loss['ft-3x384']:.1f} "
                             f"(ft-3x384), −{loss['kd-3x384']:.1f} (kd-3x384) and −{loss['teacher']:.1f} for the",
        "teacher above its students": f"a teacher only {100 * (teacher - means['ft-6x768']):.1f} F1 above its "
                                      f"fine-tuned 6 × 768 student",
        "… and the 3 × 384 one": f"({100 * (teacher - means['ft-3x384']):.1f} above the 3 × 384 one)",
    }


def _holm_figures() -> dict[str, str]:
    """Adjusted p-values the prose quotes, from the tables' own families."""
    tables = results_tables()
    task_agnostic = tables.load("task-agnostic")
    results = next(s["results"] for s in task_agnostic["stages"] if s["command"] == "evaluate")
    seeds = {label: list(results["summary"][label]["ncbi_disease"]["seeds"].values())
             for label in results["summary"]}
    pairs = [("distilbert", "layers-only"), ("tinybert", "layers-only"), ("minilmv2", "random-init"),
             ("layers-only", "random-init"), ("distilbert", "tinybert")]
    study1 = tables.family([(seeds[a], seeds[b]) for a, b in pairs], paired=True)[-1]
    users = tables.load("users-setting")
    budgets = {row["task"]: row for row in users["rows"] if row["arm"] == "budget"}
    others = [row for row in users["rows"] if row["arm"] != "budget"]
    judged = dict(zip([(r["task"], r["arm"]) for r in others],
                      tables.family([(r["scores"], budgets[r["task"]]["scores"]) for r in others],
                                    looks=tables.LOOKS["users-setting"]), strict=True))
    unseen = judged["bc5cdr_disease", "kd-unseen-biomed"]
    return {"Study 1 distilbert − tinybert": f"does not survive the table's\n  five comparisons (Holm p "
                                            f"{study1.p_holm:.2f})",
            "Study 4 unseen text on BC5CDR": f"does not survive the study's eight comparisons (Holm p\n  "
                                             f"{unseen.p_holm:.2f})"}


@pytest.mark.parametrize("figures", [_seeds_scale_figures, _holm_figures])
def test_the_prose_quotes_its_records_figures(figures):
    """Sentences of docs/results.md that quote a record's figures hold the figures the record gives (issue 55: prose
    figures had drifted from their records)."""
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    assert {name: quoted for name, quoted in figures().items() if quoted not in text} == {}
