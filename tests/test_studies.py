"""The study recipes of recipes/studies/ (docs/results.md) end to end on tiny models and a slice of the data, and
the pieces only they use: a pipeline's evaluate stage and its record, a re-initialised baseline model."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml
from recipe_fixtures import RECIPES, data_root, needs_data
from transformers import AutoModel

from biodistil.config import load_recipe
from biodistil.finetune.init_model import init_model_path
from biodistil.pipeline import PipelineRecipe, run_pipeline

STUDIES = RECIPES / "studies"


def results_tables():
    """docs/results/tables.py, the printer of docs/results.md's tables, as a module."""
    spec = importlib.util.spec_from_file_location("tables", RECIPES.parent / "docs" / "results" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_cross_tokenizer(teacher: Path, corpus: Path, out: Path) -> PipelineRecipe:
    """recipes/studies/cross-tokenizer.yaml at test size: 4 distillation steps per arm, student vocabularies of 150
    tokens from the tiny corpus, 16 examples per split, 1 seed, students of the tiny 4-layer teacher's layers 0, 2."""
    recipe = load_recipe(PipelineRecipe, STUDIES / "cross-tokenizer.yaml",
                         [f"vars.teacher={teacher}", f"vars.data={data_root()}", f"run.output_dir={out}"])
    for stage in recipe.stages:
        settings = json.loads(json.dumps(stage.settings))  # the YAML anchors share nested values between stages
        if stage.command == "distill":
            settings["data"] = {"train": [str(corpus)], "block_size": 32, "eval_fraction": 0}
            settings["train"].update(max_steps=4, batch_size=4, warmup_steps=0, eval_every=0, save_every=2,
                                     progress_bar=False)
            settings["student"]["layers"] = [0, 2]
            if "tokenizer" in settings["student"]:
                settings["student"]["tokenizer"].update(vocab_size=150, min_frequency=1)
            for term in settings["objective"]["terms"]:
                if term["loss"] == "hidden_cosine":
                    term["layer_map"] = [1, 3]
                if term["loss"] == "minilm_relations":
                    term["num_relation_heads"] = 2
        else:
            for model in settings["models"]:
                if model.get("layers"):
                    model["layers"] = [0, 2]
            tasks = [{**task, "max_examples": 16, "epochs": 1} for task in settings["tasks"]]
            settings.update(num_seeds=1, tasks=tasks)
            settings["train"].update(batch_size=8)
        stage.settings = settings
    return recipe


@needs_data
@pytest.mark.slow
def test_a_pipeline_distils_then_evaluates_on_a_slice_and_resumes(teacher_dir, corpus_file, tmp_path):
    """The cross-tokenizer study (a pipeline of distill stages, then an evaluate stage that fine-tunes their students
    and a baseline) end to end, its record and tables, a re-run that trains nothing, a task added that runs alone."""
    out = tmp_path / "study"
    recipe = tiny_cross_tokenizer(teacher_dir, corpus_file, out)
    assert run_pipeline(recipe, STUDIES) == out / "evaluate"
    record = json.loads((out / "pipeline.json").read_text())
    distilled = ["cross-distil", "cross-mlm", "cross-align", "same-distil"]
    assert [s["name"] for s in record["stages"]] == [*distilled, "evaluate"]
    for stage in record["stages"][:4]:
        assert stage["summary"]["result"]["steps"] == 4 and stage["config"]["train"]["max_steps"] == 4
    results = record["stages"][4]["results"]
    assert results["complete"] and results["seeds"] == [1]
    labels = [m["label"] for m in results["models"]]
    assert labels == [*distilled, "same-layers"]
    tasks = [task["name"] for task in recipe.stages[-1].settings["tasks"]]
    assert tasks == ["ncbi_disease"]
    assert len(results["cells"]) == 5 * len(tasks) and all(cell["wall_seconds"] > 0 for cell in results["cells"])
    assert Path(results["models"][0]["path"]) == out / "cross-distil" / "model", "evaluate reads the distilled student"
    assert record["machine"]["torch_threads"] >= 1

    table = results_tables().cross_tokenizer_tables(record)
    for label in labels:
        assert f"| {label} |" in table
    assert "| cross-distil − cross-mlm |" in table
    assert "| same-distil | teacher layers 0, 2, a cased vocabulary" not in table
    assert "| cross-distil | teacher layers 0, 2, a cased vocabulary of 150 from the corpus | mlm + hidden_cosine + " \
           "minilm_relations; 4 steps" in table

    cell = next((out / "evaluate" / "cells").rglob("metrics.json"))
    before = cell.stat().st_mtime_ns
    run_pipeline(tiny_cross_tokenizer(teacher_dir, corpus_file, out), STUDIES)
    assert cell.stat().st_mtime_ns == before, "a finished study re-runs nothing"

    wider = tiny_cross_tokenizer(teacher_dir, corpus_file, out)
    wider.stages[-1].settings["tasks"].append({"name": "species800", "max_examples": 16, "epochs": 1})
    run_pipeline(wider, STUDIES)
    results = json.loads((out / "pipeline.json").read_text())["stages"][4]["results"]
    assert results["complete"] and len(results["cells"]) == 5 * (len(tasks) + 1), \
        "a task added to a finished study runs"
    assert cell.stat().st_mtime_ns == before, "and only its cells run"


def test_a_reinitialised_baseline_keeps_the_architecture_and_draws_new_weights_from_its_seed(teacher_dir, tmp_path):
    source = AutoModel.from_pretrained(teacher_dir)
    first = AutoModel.from_pretrained(init_model_path(str(teacher_dir), [0, 2], tmp_path / "a", True, seed=3))
    again = AutoModel.from_pretrained(init_model_path(str(teacher_dir), [0, 2], tmp_path / "b", True, seed=3))
    other = AutoModel.from_pretrained(init_model_path(str(teacher_dir), [0, 2], tmp_path / "c", True, seed=4))
    layers = AutoModel.from_pretrained(init_model_path(str(teacher_dir), [0, 2], tmp_path / "d"))
    assert first.config.num_hidden_layers == 2 and first.config.hidden_size == source.config.hidden_size
    name = "encoder.layer.1.attention.self.query.weight"
    weights = {key: dict(model.named_parameters())[name] for key, model in
               [("first", first), ("again", again), ("other", other), ("layers", layers)]}
    assert torch.equal(weights["first"], weights["again"])
    assert (weights["first"] - weights["other"]).abs().max() > 1e-3
    assert (weights["first"] - weights["layers"]).abs().max() > 1e-3
    teacher_layer = dict(source.named_parameters())["encoder.layer.2.attention.self.query.weight"]
    assert torch.equal(weights["layers"], teacher_layer)


def test_the_vekd_study_gives_every_arm_the_same_student_steps_and_fixes_its_seeds():
    """recipes/studies/vekd.yaml (Study 7) is what issue 56 asks: VE-KD, Adapt-and-Distill and plain KD with the same
    student steps and batch, 3 distillation seeds each, two NER tasks, the task teacher with 2 seeds on the students'
    dev-selected schedule; VE-KD's terms in every distillation stage, so that only the design differs."""
    recipe = load_recipe(PipelineRecipe, STUDIES / "vekd.yaml")
    stages = {stage.name: stage for stage in recipe.stages}
    study = stages.pop("study").settings
    stages.pop("teacher-mlm"), stages.pop("teacher-adapted")  # teacher stages: not the students' steps

    def student_steps(prefixes: tuple[str, ...], seed: int) -> tuple[int, int]:
        runs = [stages[f"{prefix}-{seed}"].settings["train"] for prefix in prefixes]
        assert {run["batch_size"] for run in runs} == {16}
        return sum(run["max_steps"] for run in runs), len(runs)

    arms = {"vekd": ("vekd",), "kd": ("kd",), "ad": ("ad-general", "ad-adapted", "ad-final")}
    steps = {(arm, seed): student_steps(prefixes, seed)[0] for arm, prefixes in arms.items() for seed in (1, 2, 3)}
    assert set(steps.values()) == {48}
    seeds = {name: next((int(item.split("=")[1]) for item in stage.overrides if item.startswith("run.seed=")),
                        stage.settings["run"]["seed"]) for name, stage in stages.items()}
    assert len(stages) == 15 and all(seeds[name] == int(name[-1]) for name in stages)
    for seed in (1, 2, 3):  # each Adapt-and-Distill run continues its own seed's previous stage
        chain = [stages[f"ad-adapted-{seed}"], stages[f"ad-final-{seed}"]]
        assert f"${{ad-general-{seed}}}" in str([chain[0].settings["model"], chain[0].overrides])
        assert f"${{ad-adapted-{seed}}}" in str([chain[1].settings["student"], chain[1].overrides])
    terms = {str(stage.settings["objective"]) for stage in stages.values() if stage.command == "distill"}
    assert len(terms) == 1 and "logit_kl" in terms.pop()
    expanded = [name for name, stage in stages.items() if stage.settings.get("student", {}).get("vocab_expansion")]
    assert sorted(expanded) == ["vekd-1", "vekd-2", "vekd-3"]
    assert [task["name"] for task in study["tasks"]] == ["ncbi_disease", "bc5cdr_disease"]
    assert all(task["teacher_seeds"] == [1, 2] for task in study["tasks"])
    assert all(len(arm["starts"]) == 3 for arm in study["arms"])
    schedule = study["defaults"]["finetune"]
    assert schedule["train"]["eval_every"] > 0 and schedule["finetune"]["epochs"] == 3  # teacher and students alike


def test_the_repeated_task_agnostic_study_fixes_its_seeds_and_trains_its_teacher_longest():
    """recipes/studies/task-agnostic-seeds.yaml (Study 1 at its claims' strength, issue 56): distilbert and tinybert
    each distilled with seeds 1, 2, 3 on the first record's budget, every start fine-tuned with 3 seeds; the teacher
    with 3 seeds and more epochs than any student, every model dev-selected every half epoch; the random baseline
    drawn from each seed."""
    recipe = load_recipe(PipelineRecipe, STUDIES / "task-agnostic-seeds.yaml")
    stages = {stage.name: stage for stage in recipe.stages}
    study = stages.pop("study").settings
    assert sorted(stages) == [f"{arm}-{seed}" for arm in ("distilbert", "tinybert") for seed in (1, 2, 3)]
    for name, stage in stages.items():
        seed = next((int(item.split("=")[1]) for item in stage.overrides if item.startswith("run.seed=")),
                    stage.settings["run"]["seed"])
        train = stage.settings["train"]
        assert seed == int(name[-1])
        assert train["max_steps"] * train["batch_size"] * stage.settings["data"]["block_size"] == 409_600
    objectives = {name.rsplit("-", 1)[0]: str(stage.settings["objective"]) for name, stage in stages.items()}
    assert "hidden_cosine" in objectives["distilbert"] and "attention_mse" in objectives["tinybert"]
    arms = {arm["name"]: arm for arm in study["arms"]}
    assert list(arms) == ["distilbert", "tinybert", "layers-only", "random-init"]
    for arm in ("distilbert", "tinybert"):
        assert arms[arm]["starts"] == [f"${{{arm}-{seed}}}" for seed in (1, 2, 3)]
    assert arms["random-init"]["overrides"] == {"model": {"reinitialise": True}}
    (task,) = study["tasks"]
    students = study["defaults"]["finetune"]
    assert study["seeds"] == task["teacher_seeds"] == [1, 2, 3]
    assert task["teacher_overrides"]["finetune"]["epochs"] > students["finetune"]["epochs"] == 2
    steps_per_epoch = -(-5424 // students["train"]["batch_size"])  # NCBI-disease's training sentences
    assert students["train"]["eval_every"] == steps_per_epoch // 2


@pytest.mark.parametrize(("converged", "first"), [("users-setting-converged.yaml", "users-setting.yaml"),
                                                  ("multi-teacher-converged.yaml", "multi-teacher.yaml")])
def test_the_converged_studies_change_only_their_teachers_and_fix_their_seeds(converged, first):
    """Studies 4 and 5 at their claims' strength (issue 56): the first records' arms and student schedules, every
    teacher 3 epochs with dev scored every half epoch and the best checkpoint kept, the seeds fixed in the recipe
    before its run; two teacher seeds where a teacher is the denominator of a share or gap closed (Study 4)."""
    from biodistil.kd.recipe import StudyRecipe

    new = load_recipe(StudyRecipe, STUDIES / converged, resolve_models=False)
    old = load_recipe(StudyRecipe, STUDIES / first, resolve_models=False)
    assert {command: train.pop("precision") for command, train in
            ((command, new.defaults[command]["train"]) for command in ("finetune", "kd"))} == {"finetune": "no",
                                                                                           "kd": "no"}
    assert new.defaults == old.defaults
    assert [arm.model_dump(exclude={"seeds"}) for arm in new.arms] == [arm.model_dump(exclude={"seeds"})
                                                                       for arm in old.arms]
    teachers = [(task.name, task.teacher_overrides) for task in new.tasks]
    teachers += [(task.name, more.teacher_overrides) for task in new.tasks for more in task.more_teachers.values()]
    training = {"ncbi_disease": 5424, "bc5cdr_disease": 4560}
    for task, overrides in teachers:
        steps_per_epoch = -(-training[task] // overrides["train"]["batch_size"])
        assert overrides["finetune"]["epochs"] == 3 and overrides["train"]["eval_every"] == steps_per_epoch // 2
    if first == "users-setting.yaml":
        assert all(task.teacher_seeds == [1, 2] for task in new.tasks)
        assert [arm.seeds for arm in new.arms] == [[1, 2, 3, 4, 5], None, None, [1, 2, 3, 4, 5], None, None]
        assert (new.reference_arm, old.reference_arm) == ("budget", None), "the gap closed, from the budget"
    else:
        assert new.seeds == [1, 2, 3, 4, 5] and all(arm.seeds is None for arm in new.arms)


@pytest.mark.parametrize("recipe", ["task-agnostic-seeds.yaml", "seeds-scale-converged.yaml",
                                    "users-setting-converged.yaml", "multi-teacher-converged.yaml"])
def test_a_study_that_runs_in_parts_trains_every_run_in_one_precision(recipe):
    """A study run in parts may be resumed on another machine, where `train.precision: auto` could choose another
    precision: every training section of these recipes that others merge onto names its precision (the distillation
    stages of task-agnostic-seeds excepted: they ran whole, in float32, before the study's was pinned)."""
    raw = yaml.safe_load((STUDIES / recipe).read_text())

    def trainings(value, path=""):
        if isinstance(value, dict):
            if "learning_rate" in value and "batch_size" in value:
                yield path, value
            for key, item in value.items():
                yield from trainings(item, f"{path}.{key}")
        elif isinstance(value, list):
            for k, item in enumerate(value):
                yield from trainings(item, f"{path}[{k}]")

    found = {path: section.get("precision") for path, section in trainings(raw)
             if "overrides" not in path and not (recipe == "task-agnostic-seeds.yaml" and ".defaults." not in path)}
    assert found and set(found.values()) <= {"no", "bf16"}, found


def test_pipeline_processes_reach_its_study_and_evaluate_stages(tmp_path, monkeypatch):
    """`biodistil pipeline --processes 2`: a study or evaluate stage runs its fine-tuning runs side by side, as the
    commands' own `--processes` does (what side by side does is tested with those commands)."""
    import biodistil.evaluation.runner as evaluation_runner
    import biodistil.kd.study as study_runner
    from biodistil.cli.main import main

    seen = {}

    def runner(command: str):
        def run(recipe, resume: bool = False, processes=1) -> Path:
            seen[command] = processes
            Path(recipe.run.output_dir).mkdir(parents=True, exist_ok=True)
            return Path(recipe.run.output_dir)
        return run

    monkeypatch.setattr(study_runner, "run_study", runner("study"))
    monkeypatch.setattr(evaluation_runner, "run_evaluate", runner("evaluate"))
    recipe = {"stages": [
        {"name": "study", "command": "study", "settings": {
            "student": "minilm-l6", "teacher_init": "minilm-l6", "tasks": [{"name": "ncbi_disease"}],
            "arms": [{"name": "ft", "command": "finetune"}]}},
        {"name": "evaluate", "command": "evaluate", "settings": {"models": ["minilm-l6"], "tasks": ["ncbi_disease"]}}]}
    (tmp_path / "pipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["pipeline", str(tmp_path / "pipe.yaml"), "--out", str(tmp_path / "run"), "--processes", "2"]) in (
        0, None)
    assert seen == {"study": 2, "evaluate": 2}
    assert main(["pipeline", str(tmp_path / "pipe.yaml"), "--out", str(tmp_path / "run")]) in (0, None)
    assert seen == {"study": 1, "evaluate": 1}, "one after another unless asked"
