"""Commands under `accelerate launch` with 2 processes (gloo on CPU, one thread each) against one process: `finetune`
trains together (DDP) and matches one process at the same global batch; `evaluate` and `study` share their runs out
and write what one process writes; an interrupted evaluation resumes under either count; `distill` trains on both
processes and `cache-teacher` writes a cache whose shards the two processes split. Every scenario is launched once
(`launched`: one launch the two-process commands that share runs out, one those that train together, one process
all the one-process commands, tests/launched_jobs.py); the interrupted evaluations are resumed inside those launches."""

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from distill_fixtures import cache_recipe, distill_recipe
from kd_fixtures import no_dropout_copy, write_pair_task, write_token_task
from numerics import free_port
from recipe_fixtures import RECIPES
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM

from biodistil.methods.task_agnostic import run_cache_teacher

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
pytestmark = pytest.mark.pinned_threads  # every command runs in the launched processes, at 1 thread each
# what differs between two runs of the same work
TIMING = ("wall_seconds", "seconds", "earlier_seconds", "tokens_per_second")
JOBS = Path(__file__).resolve().parent / "launched_jobs.py"


def launcher(processes: int) -> list[str]:
    """How to start `processes` processes: `accelerate launch --multi_gpu` (torchrun; biodistil then uses gloo on a
    CPU-only machine), or a plain interpreter for one."""
    if processes == 1:
        return [sys.executable]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
            "--dynamo_backend", "no"]


def run_jobs(jobs: list[dict], folder: Path, processes: int) -> None:
    """The jobs ({name, cwd, argv}) one after another in `processes` processes started once."""
    path = folder / f"jobs-{jobs[0]['name']}.json"
    path.write_text(json.dumps(jobs), encoding="utf-8")
    done = subprocess.run([*launcher(processes), str(JOBS), str(path)], env=ENV, capture_output=True, text=True,
                          timeout=600, cwd=folder)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def job_output(cwd: Path, name: str) -> str:
    """What a job printed, the main process's output first."""
    return "".join(path.read_text() for path in sorted(cwd.glob(f"{name}.rank*.out")))


def without_timings(value, root: Path | None = None):
    """`value` (a JSON record) without its wall times and throughputs, with the run folder `root` written ROOT."""
    if isinstance(value, dict):
        return {key: without_timings(item, root) for key, item in value.items() if key not in TIMING}
    if isinstance(value, list):
        return [without_timings(item, root) for item in value]
    return value.replace(str(root), "ROOT") if isinstance(value, str) and root is not None else value


def fine_tuned(output: str) -> Counter:
    """How often each cell was fine-tuned, from the progress lines of an evaluation (`[i/n, process p] cell: ...`)."""
    return Counter(re.findall(r"^\[\d+/\d+(?:, process \d)?\] (.+): fine-tuning$", output, re.MULTILINE))


@dataclass
class Launched:
    """The folders of every scenario after its commands ran once in one process and once in two."""

    finetune: Path
    evaluations: Path
    evaluation_recipe: Path
    study: Path
    distill: Path
    cache: Path


def finetune_argv(folder: Path, teacher_dir: Path) -> list[str]:
    model = no_dropout_copy(teacher_dir, folder / "model")  # dropout masks are drawn per process
    # NER: the tiny model learns it in 16 steps, and entity F1 counts whole tags, which the last bits of float32
    # cannot flip (AUROC on a barely trained pair classifier could: its scores differed by 1e-5 between examples)
    task = write_token_task(folder / "task", sizes={"train": 32, "dev": 12, "test": 12})
    return ["finetune", str(RECIPES / "finetune-bioasq.yaml"), f"model.name_or_path={model}", f"task.name={task}",
            "finetune.epochs=4", "finetune.patience=null", "train.learning_rate=1e-2", "train.eval_every=2",
            "train.log_every=1", "train.progress_bar=false", "train.tensorboard=true",
            "train.precision=no"]  # float32: bf16 autocast rounds batches of 4 and of 8 differently


def study_recipe(folder: Path, teacher_dir: Path, student: Path) -> Path:
    train = {"batch_size": 8, "learning_rate": 3e-3, "progress_bar": False, "tensorboard": False}
    recipe = {"seeds": [1], "resamples": 200, "student": str(student), "teacher_init": str(teacher_dir),
              "tasks": [{"name": str(write_pair_task(folder / "qa"))},
                        {"name": str(write_token_task(folder / "ner"))}],
              "defaults": {"finetune": {"finetune": {"epochs": 1}, "train": train},
                           "kd": {"kd": {"epochs": 1, "soft_loss": "hinton"}, "train": train}},
              "arms": [{"name": "tuned", "command": "finetune"}, {"name": "distilled", "command": "kd"}]}
    path = folder / "study.yaml"
    path.write_text(json.dumps(recipe))
    return path


def recipe_file(recipe, path: Path) -> Path:
    path.write_text(json.dumps(recipe.model_dump(mode="json")), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def launched(tmp_path_factory, teacher_dir, kd_models, corpus_file) -> Launched:
    root = tmp_path_factory.mktemp("launched")
    where = Launched(*(root / name for name in ("finetune", "evaluations", "evaluate.yaml", "study", "distill",
                                                "cache")))
    for folder in (where.finetune, where.evaluations, where.study, where.distill, where.cache):
        folder.mkdir()
    finetune = finetune_argv(where.finetune, teacher_dir)
    where.evaluation_recipe = evaluation_recipe(where.evaluations, teacher_dir)
    study = study_recipe(where.study, teacher_dir, kd_models[1])
    distill = recipe_file(distill_recipe(teacher_dir, corpus_file, where.distill / "ddp", max_steps=6, save_every=3,
                                         eval_every=3), where.distill / "recipe.yaml")
    cached = cache_recipe(teacher_dir, corpus_file, where.cache, out="ddp", max_steps=6, save_every=3, eval_every=3)
    cached = cached.model_copy(update={"teacher_cache": cached.teacher_cache.model_copy(update={"shard_blocks": 32})})
    recipe_file(cached, where.cache / "recipe.yaml")

    def job(name: str, cwd: Path, argv: list[str]) -> dict:
        return {"name": name, "cwd": str(cwd), "argv": argv}

    def interrupted(name: str, cells: list[int]) -> dict:  # see launched_jobs.interrupt
        return {"name": name, "cwd": str(where.evaluations),
                "interrupt": {"out": "two", "cells": cells, "stamps": f"{name}.json"}}

    resume = ["evaluate", str(where.evaluation_recipe), "--out", "two", "--resume"]
    # evaluate and study share runs out over a launch's processes; the other commands train them together (DDP):
    # a launch does one or the other, so two launches. The two-process evaluation is interrupted and resumed by two
    # processes, then interrupted again and resumed by one.
    run_jobs([job("evaluate-two", where.evaluations, ["evaluate", str(where.evaluation_recipe), "--out", "two"]),
              job("study-two", where.study, ["study", str(study), "--out", "two"]),
              interrupted("interrupted-for-two", [1, 2]), job("resumed-by-two", where.evaluations, resume)],
             root, processes=2)
    run_jobs([job("finetune-two", where.finetune, [*finetune, "train.batch_size=4", "--out", "two"]),
              job("distill", where.distill, ["distill", str(distill)]),
              job("cache-teacher", where.cache, ["cache-teacher", str(where.cache / "recipe.yaml")]),
              job("distill-from-cache", where.cache, ["distill", str(where.cache / "recipe.yaml")])],
             root, processes=2)
    run_jobs([job("finetune-one", where.finetune, [*finetune, "train.batch_size=8", "--out", "one"]),
              job("evaluate-one", where.evaluations, ["evaluate", str(where.evaluation_recipe), "--out", "one"]),
              job("study-one", where.study, ["study", str(study), "--out", "one"]),
              interrupted("interrupted-for-one", [0]), job("resumed-by-one", where.evaluations, resume)],
             root, processes=1)
    return where


# ------------------------------------------------------------------------------------------- finetune


@pytest.mark.slow
def test_finetune_trains_together_under_two_processes_as_one_process_at_the_same_global_batch(launched):
    folder = launched.finetune
    one, both = (json.loads((folder / name / "metrics.json").read_text()) for name in ("one", "two"))
    assert both["train"]["steps"] == one["train"]["steps"] == 16
    assert both["train"]["best_step"] == one["train"]["best_step"] > 2, "dev selection, the same in both"
    assert one["dev"]["f1"] > 0.3 and one["test"]["f1"] > 0.3, ("the model learnt the task", one)
    for split in ("dev", "test", "init"):
        assert set(both[split]) == set(one[split]) and "f1" in one[split]
        assert all(abs(both[split][key] - one[split][key]) <= 1e-3 for key in one[split]), (split, one, both)
    weights = [load_file(folder / name / "model" / "model.safetensors") for name in ("one", "two")]
    assert weights[0].keys() == weights[1].keys()
    assert max((weights[0][key] - weights[1][key]).abs().max().item() for key in weights[0]) < 1e-5
    # one process wrote the run folder: one record per step, the model and the report once
    records = [json.loads(line) for line in (folder / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, 17))
    assert [r["step"] for r in records if r["split"] == "eval"] == list(range(2, 17, 2))
    assert sorted(p.name for p in (folder / "two" / "model").iterdir()) == sorted(
        p.name for p in (folder / "one" / "model").iterdir())
    assert job_output(folder, "finetune-two").count("two/model") == 1, "the main process alone prints the result"


# ------------------------------------------------------------------------------------------- evaluate


def evaluation_recipe(folder: Path, teacher_dir: Path) -> Path:
    """2 models (the tiny teacher and its layers 0 and 2) × 2 tasks (pairs, NER), one seed: 4 cells."""
    recipe = {"run": {"seed": 7},
              "models": [{"name": "full", "path": str(teacher_dir)},
                         {"name": "half", "path": str(teacher_dir), "layers": [0, 2]}],
              "tasks": [str(write_pair_task(folder / "qa")), str(write_token_task(folder / "ner"))],
              "num_seeds": 1, "train": {"learning_rate": 3e-3, "batch_size": 8, "epochs": 2, "progress_bar": False}}
    path = folder / "evaluate.yaml"
    path.write_text(json.dumps(recipe))
    return path


def assert_same_results(folder: Path, name: str) -> None:
    """`folder/name` holds the results and report of `folder/one`, the one-process run."""
    one, other = folder / "one", folder / name
    assert without_timings(json.loads((other / "results.json").read_text()), other) == \
        without_timings(json.loads((one / "results.json").read_text()), one)
    assert (other / "report.md").read_text().replace(str(other), "ROOT") == \
        (one / "report.md").read_text().replace(str(one), "ROOT")


@pytest.mark.slow
def test_evaluate_shares_its_cells_out_over_two_processes_and_reports_as_one_does(launched):
    folder = launched.evaluations
    one, two = job_output(folder, "evaluate-one"), job_output(folder, "evaluate-two")
    assert_same_results(folder, "two")
    cells = fine_tuned(one)
    assert len(cells) == 4 and set(cells.values()) == {1}
    assert fine_tuned(two) == cells, "every cell fine-tuned once, by one process"
    owners = dict((cell, process) for process, cell in
                  re.findall(r"^\[\d+/4, process (\d)\] (.+): fine-tuning$", two, re.MULTILINE))
    assert set(owners.values()) == {"0", "1"}, "both processes fine-tune"
    alone = [cell for cell, process in owners.items() if list(owners.values()).count(process) == 1]
    assert all(cell.startswith("full") for cell in alone), "shared by expected work: a cell alone is a 4-layer one"
    for record in sorted((folder / "two" / "cells").rglob("train/metrics.jsonl")):  # each folder written once
        reference = folder / "one" / record.relative_to(folder / "two")
        assert record.read_text().count("\n") == reference.read_text().count("\n")
    assert two.count(str(folder / "two" / "report.md")) == 1


@pytest.mark.slow
def test_an_interrupted_evaluation_resumes_under_one_or_two_processes(launched):
    """The two-process evaluation, interrupted during cells 1-2 and resumed by two processes, then during cell 0 and
    resumed by one: each resume fine-tunes the lost cells alone, leaves the others' files as they were, and the
    results equal the one-process evaluation's."""
    folder = launched.evaluations
    stamps = [json.loads((folder / f"interrupted-for-{count}.json").read_text()) for count in ("two", "one")]
    cells = list(stamps[0])  # in the order the interrupts counted them
    assert len(cells) == 4 and list(stamps[1]) == cells
    final = {cell: (Path(cell) / "metrics.json").stat().st_mtime_ns for cell in cells}
    for before, after, lost, resumed in ((stamps[0], stamps[1], cells[1:3], "resumed-by-two"),
                                         (stamps[1], final, cells[:1], "resumed-by-one")):
        output = job_output(folder, resumed)
        assert sum(fine_tuned(output).values()) == len(lost), resumed
        assert output.count("finished before, skipped") == 4 - len(lost), resumed
        assert {cell for cell in cells if after[cell] != before[cell]} == set(lost), resumed
    for cell in cells:
        assert not (Path(cell) / "train" / "checkpoints").exists()
    assert_same_results(folder, "two")


# ------------------------------------------------------------------------------------------- study


@pytest.mark.slow
def test_a_study_shares_teachers_then_arms_and_seeds_out_over_two_processes(launched):
    folder = launched.study
    one, two = (json.loads((folder / name / "summary.json").read_text()) for name in ("one", "two"))
    assert two["rows"] == one["rows"] and len(two["rows"]) == 4
    assert without_timings(two["runs"]) == without_timings(one["runs"]) and len(two["runs"]) == 4
    assert without_timings(two["teachers"]) == without_timings(one["teachers"])
    for name in ("one", "two"):  # each run folder written once, by one process
        assert len(list((folder / name).rglob("metrics.json"))) == 4 + 2


# ------------------------------------------------------------------------------------------- distill


@pytest.mark.slow
def test_distill_trains_on_two_processes(launched):
    folder = launched.distill
    assert AutoModelForMaskedLM.from_pretrained(folder / "ddp" / "model").config.hidden_size == 16
    state = json.loads((folder / "ddp" / "checkpoints" / "step-0000006" / "trainer_state.json").read_text())
    assert state["state"]["step"] == 6
    # two processes each took batches of 8: tokens seen count both
    assert state["state"]["tokens_seen"] == 6 * 2 * 8 * 32


@pytest.mark.slow
def test_two_processes_write_and_read_disjoint_shards(launched, teacher_dir, corpus_file):
    folder = launched.cache
    cache = next((folder / "cache").iterdir())
    shards = sorted((cache / "pattern-0").glob("shard-*.arrow"))
    ranks = [pa.ipc.open_file(pa.memory_map(str(s))).schema.metadata[b"rank"].decode() for s in shards]
    assert ranks == ["0", "1"] * (len(shards) // 2) + ["0"] * (len(shards) % 2), "shard s written by rank s mod 2"
    assert "0 shards built here" in (folder / "ddp" / "report.md").read_text()
    assert (folder / "ddp" / "model" / "model.safetensors").is_file()
    recipe = cache_recipe(teacher_dir, corpus_file, folder, out="ddp", max_steps=6, save_every=3, eval_every=3)
    recipe = recipe.model_copy(update={"teacher_cache": recipe.teacher_cache.model_copy(update={"shard_blocks": 32})})
    assert run_cache_teacher(recipe) == cache, "complete: the command finds it and builds nothing"
