"""Paths a user gives are resolved once, when a recipe is read, against the working folder; what a run records for
its own later use is relative to the run folder. `runs/x` and its absolute spelling are the same run."""

import os

import pytest

from biodistil.config import DistillRecipe, RunConfig, Section, load_recipe, validate_recipe
from biodistil.errors import BiodistilError
from biodistil.kd.recipe import KDRecipe, StudyRecipe
from biodistil.paths import absolute, model_reference, recalled, recorded, task_reference
from biodistil.pipeline import load_pipeline
from biodistil.training.run import RunFolder

DISTILL = """
teacher: {name_or_path: models/teacher}
data: {train: [corpus/*.txt], cache_dir: cache}
objective: {terms: [{loss: hidden_cosine}]}
run: {output_dir: runs/distill}
teacher_cache: {dir: tcache}
"""


@pytest.fixture()
def workspace(tmp_path, monkeypatch):
    (tmp_path / "models" / "teacher").mkdir(parents=True)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "distill.yaml").write_text(DISTILL + "masking: {duplication: 2}\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_path_of_a_recipe_is_absolute_after_loading(workspace):
    recipe = load_recipe(DistillRecipe, "recipes/distill.yaml")
    assert recipe.run.output_dir == str(workspace / "runs" / "distill")
    assert recipe.data.train == [str(workspace / "corpus" / "*.txt")], "globs too"
    assert recipe.data.cache_dir == str(workspace / "cache")
    assert recipe.teacher_cache.dir == str(workspace / "tcache")
    assert recipe.teacher.name_or_path == str(workspace / "models" / "teacher"), "an existing local folder"
    assert RunConfig().output_dir == str(workspace / "runs" / "run"), "the default too"


def test_the_same_recipe_read_from_another_folder_or_spelled_absolute_is_equal(workspace, monkeypatch):
    here = load_recipe(DistillRecipe, "recipes/distill.yaml")
    monkeypatch.chdir(workspace / "elsewhere")
    (workspace / "elsewhere" / "distill.yaml").write_text("""
teacher: {name_or_path: ../models/teacher}
data: {train: [../corpus/*.txt], cache_dir: ../cache}
objective: {terms: [{loss: hidden_cosine}]}
run: {output_dir: ../runs/distill}
teacher_cache: {dir: ../tcache}
masking: {duplication: 2}
""")
    there = load_recipe(DistillRecipe, "distill.yaml")
    monkeypatch.chdir(workspace)
    spelled = load_recipe(DistillRecipe, str(workspace / "recipes" / "distill.yaml"),
                          [f"run.output_dir={workspace}/runs/./distill"])
    assert here.model_dump() == there.model_dump() == spelled.model_dump()


def test_a_resumed_run_spelled_absolute_is_the_same_run(workspace):
    class Recipe(Section):
        run: RunConfig

    first = validate_recipe(Recipe, {"run": {"output_dir": "runs/x"}})
    RunFolder(first.run.output_dir, first, stages=True)
    (workspace / "runs" / "x" / "stage").mkdir()  # a stage began (its recipe recorded): the job is continued
    (workspace / "runs" / "x" / "stage" / "config.yaml").write_text("run: {}\n")
    again = validate_recipe(Recipe, {"run": {"output_dir": str(workspace / "runs" / "x")}})
    assert RunFolder(again.run.output_dir, again, stages=True).resume


def test_hub_ids_stay_hub_ids_and_local_folders_become_absolute(workspace):
    assert model_reference("dmis-lab/biobert-v1.1") == "dmis-lab/biobert-v1.1"
    assert model_reference("bert-base-uncased") == "bert-base-uncased"
    assert model_reference("models/teacher") == str(workspace / "models" / "teacher")
    assert model_reference("./not-yet") == str(workspace / "not-yet"), "can only be a path"
    assert model_reference("runs/a/b") == str(workspace / "runs" / "a" / "b")
    assert task_reference("ncbi_disease") == "ncbi_disease"
    assert task_reference("tasks/mine.yaml") == str(workspace / "tasks" / "mine.yaml")
    assert absolute("~/x") == os.path.join(os.path.expanduser("~"), "x")


def test_a_missing_relative_model_folder_is_named_as_it_was_resolved(workspace):
    from biodistil.models.loading import check_model

    with pytest.raises(BiodistilError, match=f"Model folder {workspace}/runs/nothing/model does not exist"):
        check_model(model_reference("runs/nothing/model"), "teacher")


def test_study_defaults_and_arm_overrides_are_resolved_too(workspace):
    raw = {"student": "models/teacher", "teacher_init": "models/teacher", "data_dir": "data",
           "tasks": [{"name": "gad", "teacher_overrides": {"task": {"data_dir": "d2"}}}],
           "defaults": {"kd": {"kd": {"cache_dir": "runs/demo/cache"}, "task": {"name": "tasks/t.yaml"}}},
           "arms": [{"name": "kd", "overrides": {"transfer": {"source": {"kind": "saved", "path": "sets/a"}}}},
                    {"name": "ft", "command": "finetune", "overrides": {"model": {"name_or_path": "models/teacher"}}}]}
    recipe = validate_recipe(StudyRecipe, raw)
    assert recipe.defaults["kd"]["kd"]["cache_dir"] == str(workspace / "runs" / "demo" / "cache")
    assert recipe.defaults["kd"]["task"]["name"] == str(workspace / "tasks" / "t.yaml")
    assert recipe.arms[0].overrides["transfer"]["source"]["path"] == str(workspace / "sets" / "a")
    assert recipe.arms[1].overrides["model"]["name_or_path"] == str(workspace / "models" / "teacher")
    assert recipe.tasks[0].teacher_overrides["task"]["data_dir"] == str(workspace / "d2")
    assert recipe.data_dir == str(workspace / "data") and recipe.student == str(workspace / "models" / "teacher")


def test_transfer_files_stay_relative_to_the_data_folder_and_saved_sets_to_the_working_folder(workspace):
    raw = {"teacher": {"name_or_path": "models/teacher"}, "student": {"name_or_path": "models/teacher"},
           "task": {"name": "gad", "data_dir": "data"}}
    text = validate_recipe(KDRecipe, {**raw, "transfer": {"source": {"kind": "text", "path": "corpus/general.txt"}}})
    assert text.transfer.source.path == "corpus/general.txt" and text.task.data_dir == str(workspace / "data")
    saved = validate_recipe(KDRecipe, {**raw, "transfer": {"source": {"kind": "saved", "path": "sets/a"}}})
    assert saved.transfer.source.path == str(workspace / "sets" / "a")


def test_pipeline_stage_recipes_are_relative_to_the_pipeline_file(workspace, monkeypatch):
    (workspace / "recipes" / "pipe.yaml").write_text(
        "run: {output_dir: runs/pipe}\nstages: [{name: a, command: distill, recipe: distill.yaml}]\n")
    monkeypatch.chdir(workspace / "elsewhere")
    recipe = load_pipeline("../recipes/pipe.yaml")
    assert recipe.stages[0].recipe == str(workspace / "recipes" / "distill.yaml")
    assert recipe.run.output_dir == str(workspace / "elsewhere" / "runs" / "pipe")


def test_records_store_paths_relative_to_their_run_folder(tmp_path):
    root = tmp_path / "study"
    assert recorded(root / "gad" / "kd" / "seed-1", root) == "gad/kd/seed-1"
    assert recorded(tmp_path / "other" / "model", root) == str(tmp_path / "other" / "model"), "outside: absolute"
    moved = tmp_path / "moved"
    assert recalled("gad/kd/seed-1", moved) == moved / "gad" / "kd" / "seed-1"
    assert recalled(str(tmp_path / "other"), moved) == tmp_path / "other"
