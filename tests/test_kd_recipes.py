"""The task-side recipes end to end: a tiny run of every recipe of the two studies (finetune-*, kd-*,
transfer-study*, meta-study*) on a small slice of the real data folder, and the small study recipes."""

import json
from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from kd_fixtures import save_mpnet, save_student, save_teacher
from recipe_fixtures import QUIET, RECIPES, data_root, needs_data

from biodistil.cli.main import main
from biodistil.config import load_recipe
from biodistil.data.vocab import train_wordpiece
from biodistil.embedded import EMBEDDED, embedded_model_folder
from biodistil.kd.recipe import StudyRecipe
from biodistil.kd.study import run_study
from biodistil.tasks.registry import get_task


def corpus_lines() -> list[str]:
    lines = []
    for name in ("corpus/biomed.txt", "corpus/general.txt"):
        with (data_root() / name).open(encoding="utf-8") as handle:
            lines += [next(handle) for _ in range(1500)]
    return lines


@pytest.fixture(scope="module")
def real_text_models(tmp_path_factory):
    """Tiny models with a WordPiece vocabulary of the data folder's corpora (so that real questions stay short):
    a 4-layer encoder (teacher initialisation), "fine-tuned" teachers for BioASQ, GAD and BC5CDR (PubTator), a
    2-layer student."""
    root = tmp_path_factory.mktemp("recipe_models")
    tokenizer = train_wordpiece(corpus_lines(), vocab_size=1500, min_frequency=2)
    init = save_student(tokenizer, root / "init", layers=4, positions=128)
    teachers = {name: save_teacher(init, get_task(name), root / f"teacher-{name}")
                for name in ("bioasq", "gad", "bc5cdr_pubtator")}
    return init, teachers, save_student(tokenizer, root / "student", positions=128)


@pytest.fixture(scope="module")
def tiny_mpnet(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide MPNet encoder (no head, as mpnet-base) with a vocabulary of its own, so that its words
    split into other pieces than the BERT models' (random weights): what a study's second teacher, `mpnet-base`, is
    to the tests, without fetching it."""
    torch.manual_seed(2)
    tokenizer = train_wordpiece(corpus_lines(), vocab_size=1100, min_frequency=2)
    return save_mpnet(tokenizer, tmp_path_factory.mktemp("tiny_mpnet"), layers=2, positions=130, head=False)


def kd_overrides(recipe: str, teachers: dict[str, Path], student: Path, tmp_path: Path) -> list[str]:
    task = next((name for name in ("bioasq", "bc5cdr_pubtator") if name.replace("_", "-") in recipe), "gad")
    extra = ["transfer.random.size=24"] if "random" in recipe else []
    several = "teachers" in yaml.safe_load((RECIPES / recipe).read_text())
    teacher = (f"teachers=[{{name_or_path: {teachers[task]}}}, {{name_or_path: {teachers[task]}, weight: 2}}]"
               if several else f"teacher.name_or_path={teachers[task]}")
    return [teacher, f"student.name_or_path={student}", "task.max_examples=16",
            "task.max_length=128",
            "transfer.source.max_examples=24", "kd.epochs=1", f"kd.cache_dir={tmp_path / 'cache'}", *QUIET, *extra]


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("kd-*.yaml")))
def test_kd_recipe_runs_on_a_slice(recipe, real_text_models, tmp_path):
    _, teachers, student = real_text_models
    out = tmp_path / "run"
    assert main(["kd", str(RECIPES / recipe), *kd_overrides(recipe, teachers, student, tmp_path),
                 "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["finished"] and {"test", "init", "teacher", "gap_closed"} <= set(metrics)
    if "meta" in recipe:
        assert (out / "meta.jsonl").read_text().count("\n") == metrics["steps"]


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("finetune-*.yaml")))
def test_finetune_recipe_runs_on_a_slice(recipe, real_text_models, tmp_path):
    out = tmp_path / "run"
    init = real_text_models[0]
    assert main(["finetune", str(RECIPES / recipe), f"model.name_or_path={init}", "task.max_examples=16",
                 "task.max_length=128",
                 "finetune.epochs=1", *QUIET, "--out", str(out)]) == 0
    assert (out / "model" / "config.json").is_file()


def tiny_study(path: Path, student: Path, teacher_init: Path, out: Path, more_teachers: Path | None = None
               ) -> StudyRecipe:
    """The study recipe at `path` on tiny models and a slice of the data; its recipe's models are named, never
    loaded (`resolve_models=False`): a fetched one need not be on this machine. Any more teachers of its tasks start
    from `more_teachers` (else `teacher_init`)."""
    overrides = [f"student={student}", "student_layers=null", f"teacher_init={teacher_init}", "seeds=[1]",
                 f"run.output_dir={out}", "resamples=200"]
    for command in ("finetune", "kd"):
        overrides += [f"defaults.{command}.task.max_examples=16", f"defaults.{command}.train.batch_size=8",
                      f"defaults.{command}.task.max_length=128",
                      f"defaults.{command}.train.progress_bar=false", f"defaults.{command}.train.tensorboard=false"]
    overrides += ["defaults.finetune.finetune.epochs=1", "defaults.kd.kd.epochs=1"]
    budgets = "labelled:" in path.read_text()  # a labelled budget: the whole (capped) training split as source
    if not budgets:
        overrides.append("defaults.kd.transfer.source.max_examples=24")
    recipe = load_recipe(StudyRecipe, path, overrides, resolve_models=False)
    for study_task in recipe.tasks:
        study_task.teacher_overrides = {}
        for more in study_task.more_teachers.values():  # a tiny encoder in place of a real one
            more.teacher_init, more.teacher_overrides = str(more_teachers or teacher_init), {}
        if study_task.overrides:
            study_task.overrides = {"finetune": {"task": {"train_examples": 8}}, "kd": {"transfer": {"labelled": 8}}}
    for arm in recipe.arms:
        arm.seeds = None
        transfer = arm.overrides.get("transfer", {})
        if "random" in transfer:
            transfer["random"]["size"] = 24
        if budgets and transfer.get("source", {}).get("kind") == "text":
            transfer["source"]["max_examples"] = 24
    return recipe


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("recipe", ["transfer-study.yaml", "meta-study.yaml", "studies/transfer-data.yaml",
                                    "studies/meta-kd.yaml", "studies/users-setting.yaml",
                                    "studies/multi-teacher.yaml"])
def test_study_recipe_runs_on_a_slice(recipe, real_text_models, tiny_mpnet, tmp_path):
    init, _, student = real_text_models
    out = tmp_path / "study"
    side_by_side = recipe == "transfer-study.yaml"  # its runs in two worker processes (`study --processes 2`)
    study = partial(tiny_study, RECIPES / recipe, student, init, out, more_teachers=tiny_mpnet)
    users = recipe.endswith("users-setting.yaml")
    fixed = study()
    fixed.reference_arm = "budget" if users else None  # Study 4's replacement measures the gap from the budget
    report = run_study(fixed, processes=2 if side_by_side else 1)
    summary = json.loads((out / "summary.json").read_text())
    expected = yaml.safe_load((RECIPES / recipe).read_text())
    arms = [arm["name"] for arm in expected["arms"]]
    assert [(row["task"], row["arm"]) for row in summary["rows"]] == [
        (task["name"], arm) for task in expected["tasks"] for arm in arms]
    assert all(row["seeds"] == 1 and "gap_closed" in row for row in summary["rows"])
    assert summary["settings"]["seeds"] == [1] and summary["machine"]["torch_threads"] >= 1
    assert all(run["wall_seconds"] > 0 and run["steps"] >= 1 for run in summary["runs"])
    for run in [*summary["teachers"].values(), *(run for run in summary["runs"] if run["command"] == "finetune")]:
        assert 1 <= run["best_step"] <= run["steps"] and 0 <= run["best_dev"] <= 1, "the checkpoint kept on dev"
    assert all(len(row["gap_closed_per_seed"]) == 1 for row in summary["rows"])
    for row in summary["rows"]:  # the share of the teacher over test sentences, from both sides' predictions
        share = row["share"]
        if "estimate" in share:
            assert share["low"] <= share["estimate"] <= share["high"] and share["runs"] == [1, 1]
            assert share["resamples"] == 200, "the recipe's resamples"
        else:  # a tiny random teacher may score 0: no share to form
            assert share == {"why_none": "the teacher scores 0 on the test set: there is no share of it to form"}
    gaps = [row for row in summary["rows"] if "gap" in row]  # from the reference arm: three sides, paired
    assert [row["arm"] for row in gaps] == ([row["arm"] for row in summary["rows"] if row["arm"] != "budget"]
                                            if users else [])
    for row in gaps:
        for gap in (row["gap"], row["gap_dev"]):
            assert gap["low"] <= gap["estimate"] <= gap["high"] and gap["runs"] == [1, 1, 1] if "estimate" in gap \
                else "why_none" in gap
    assert ("Gap closed from `budget`" in report.read_text()) == users
    assert (out / "scores.png").stat().st_size > 1000
    if recipe.startswith("studies/"):
        from test_studies import results_tables

        tables = results_tables()
        printer = {"transfer-data": tables.transfer_tables, "meta-kd": tables.meta_tables,
                   "users-setting": tables.users_setting_tables,
                   "multi-teacher": tables.multi_teacher_tables}[Path(recipe).stem]
        table = printer(summary)
        assert all(f"| {arm} |" in table for arm in arms) and "one seed" in table
    assert "gap closed" in report.read_text()
    if side_by_side:
        assert summary["side_by_side"]["processes"] == 2 and summary["side_by_side"]["runs"] == len(summary["runs"])
        assert "at a time in worker processes" in report.read_text()
        for run in summary["runs"]:
            log = out / "logs" / f"{run['task']}-{run['arm']}-seed-{run['seed']}.log"
            assert "CPU threads: 1 (OMP_NUM_THREADS)" in log.read_text(), log
        # the teacher outputs were built before the runs started (prepare_teacher_outputs), and no run built more
        started = min((out / run["folder"] / "config.yaml").stat().st_mtime for run in summary["runs"])
        entries = list((out / "cache").glob("task-*/*.arrow"))
        assert entries and all(entry.stat().st_mtime < started for entry in entries)
    else:
        assert summary["side_by_side"] is None and not (out / "logs").exists()
    if recipe.endswith("users-setting.yaml"):  # the task's budget reaches every arm; an arm's overrides win
        for run in summary["runs"]:
            metrics = json.loads((out / run["folder"] / "metrics.json").read_text())
            if run["command"] == "kd":
                assert metrics["transfer"]["labelled"] == 8, run["arm"]
            config = yaml.safe_load((out / run["folder"] / "config.yaml").read_text())
            if run["command"] == "finetune":
                assert config["task"]["train_examples"] == (None if run["arm"] == "all-labels" else 8)
    first = out / expected["tasks"][0]["name"] / arms[0] / "seed-1" / "metrics.json"
    before = first.stat().st_mtime_ns
    run_study(study(), resume=True)
    assert first.stat().st_mtime_ns == before, "a resumed study reuses finished runs"
    assert json.loads((out / "summary.json").read_text())["looks"] == 1, "the same runs: no second look"
    assert json.loads((out / "summary.json").read_text())["side_by_side"] == summary["side_by_side"]
    if recipe.endswith("users-setting.yaml"):  # seeds added to one arm: only its new run trains
        grown = study()
        grown.arms[0].seeds = [1, 2]
        run_study(grown, resume=True)
        assert first.stat().st_mtime_ns == before
        grown_summary = json.loads((out / "summary.json").read_text())
        rows = grown_summary["rows"]
        assert [row["seeds"] for row in rows if row["arm"] == arms[0]] == [2] * len(expected["tasks"])
        assert grown_summary["looks"] == 2, "seeds added after a summary was read: a second look"
        assert all(row["seeds"] == 1 for row in rows if row["arm"] != arms[0])


def test_a_study_continues_with_seeds_added_and_refuses_other_changes(tmp_path):
    recipe = StudyRecipe.model_validate({
        "run": {"output_dir": str(tmp_path / "study")}, "student": str(tmp_path), "teacher_init": str(tmp_path),
        "seeds": [1, 2, 3],
        "tasks": [{"name": "ncbi_disease"}],
        "arms": [{"name": "budget", "command": "finetune"}, {"name": "kd", "overrides": {"kd": {"alpha": 1.0}}}]})
    recorded = recipe.model_dump(mode="json")
    grown = recipe.model_copy(deep=True)
    grown.seeds, grown.arms[1].seeds = [1, 2, 3, 4], [1, 2, 3, 7]
    assert grown.continued_from(recorded) == grown.model_dump(mode="json")
    assert recorded["seeds"] == [1, 2, 3] and recorded["arms"][1]["seeds"] is None, "the record itself is kept"
    moved = recipe.model_copy(deep=True)
    moved.seeds = [4, 1, 2, 3]  # the teachers train with the first seed: not an extension
    assert moved.continued_from(recorded)["seeds"] == [1, 2, 3]
    fewer = recipe.model_copy(deep=True)
    fewer.arms[0].seeds = [1, 2]
    assert fewer.continued_from(recorded)["arms"][0]["seeds"] is None
    changed = grown.model_copy(deep=True)
    changed.arms[1].overrides = {"kd": {"alpha": 0.5}}
    assert changed.continued_from(recorded)["arms"][1]["overrides"] == {"kd": {"alpha": 1.0}}


def test_small_study_recipes_run_on_the_embedded_teacher_out_of_the_box():
    minilm = str(embedded_model_folder(EMBEDDED["minilm-l6"]))
    for name in ("transfer-study-small.yaml", "meta-study-small.yaml"):
        recipe = load_recipe(StudyRecipe, RECIPES / name)
        assert 1 <= len(recipe.seeds) <= 2 and recipe.arms
        assert recipe.teacher_init == recipe.student == minilm and recipe.student_layers == [0, 2, 4]
