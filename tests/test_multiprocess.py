"""Every task-side command under `accelerate launch` with 2 processes (gloo on CPU, one thread each) against one
process: `finetune` trains together (DDP) and matches one process at the same global batch; `evaluate` and `study`
share their runs out and write what one process writes; an interrupted evaluation resumes under either count."""

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from kd_fixtures import no_dropout_copy, write_pair_task, write_token_task
from numerics import free_port
from recipe_fixtures import RECIPES
from safetensors.torch import load_file

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
TIMING = ("wall_seconds", "seconds", "tokens_per_second")  # what differs between two runs of the same work


def run_biodistil(argv: list[str], cwd: Path, processes: int) -> subprocess.CompletedProcess:
    """`biodistil ARGV` in `processes` processes (`accelerate launch --multi_gpu`: torchrun, gloo on CPU), or plainly
    in one; fails the test with the end of its output when it fails."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
              "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
              "--dynamo_backend", "no"]
    command = [*(launch if processes > 1 else [sys.executable]), "-m", "biodistil", *argv]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


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


# ------------------------------------------------------------------------------------------- finetune


@pytest.mark.slow
def test_finetune_trains_together_under_two_processes_as_one_process_at_the_same_global_batch(tmp_path, teacher_dir):
    model = no_dropout_copy(teacher_dir, tmp_path / "model")  # dropout masks are drawn per process
    # NER: the tiny model learns it in 16 steps, and entity F1 counts whole tags, which the last bits of float32
    # cannot flip (AUROC on a barely trained pair classifier could: its scores differed by 1e-5 between examples)
    task = write_token_task(tmp_path / "task", sizes={"train": 32, "dev": 12, "test": 12})
    argv = ["finetune", str(RECIPES / "finetune-bioasq.yaml"), f"model.name_or_path={model}", f"task.name={task}",
            "finetune.epochs=4", "finetune.patience=null", "train.learning_rate=1e-2", "train.eval_every=2",
            "train.log_every=1", "train.progress_bar=false", "train.tensorboard=true",
            "train.precision=no"]  # float32: bf16 autocast rounds batches of 4 and of 8 differently
    run_biodistil([*argv, "train.batch_size=8", "--out", "one"], tmp_path, processes=1)
    two = run_biodistil([*argv, "train.batch_size=4", "--out", "two"], tmp_path, processes=2)
    one, both = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("one", "two"))
    assert both["train"]["steps"] == one["train"]["steps"] == 16
    assert both["train"]["best_step"] == one["train"]["best_step"] > 2, "dev selection, the same in both"
    assert one["dev"]["f1"] > 0.3 and one["test"]["f1"] > 0.3, ("the model learnt the task", one)
    for split in ("dev", "test", "init"):
        assert set(both[split]) == set(one[split]) and "f1" in one[split]
        assert all(abs(both[split][key] - one[split][key]) <= 1e-3 for key in one[split]), (split, one, both)
    weights = [load_file(tmp_path / name / "model" / "model.safetensors") for name in ("one", "two")]
    assert weights[0].keys() == weights[1].keys()
    assert max((weights[0][key] - weights[1][key]).abs().max().item() for key in weights[0]) < 1e-5
    # one process wrote the run folder: one record per step, the model and the report once
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, 17))
    assert [r["step"] for r in records if r["split"] == "eval"] == list(range(2, 17, 2))
    assert sorted(p.name for p in (tmp_path / "two" / "model").iterdir()) == sorted(
        p.name for p in (tmp_path / "one" / "model").iterdir())
    assert two.stdout.count("two/model") == 1, "the main process alone prints the result"


# ------------------------------------------------------------------------------------------- evaluate


def evaluation_recipe(folder: Path, teacher_dir: Path) -> Path:
    """2 models (the tiny teacher and its layers 0 and 2) × 2 tasks (pairs, NER) × 2 seeds: 8 cells."""
    recipe = {"run": {"seed": 7},
              "models": [{"name": "full", "path": str(teacher_dir)},
                         {"name": "half", "path": str(teacher_dir), "layers": [0, 2]}],
              "tasks": [str(write_pair_task(folder / "qa")), str(write_token_task(folder / "ner"))],
              "num_seeds": 2, "train": {"learning_rate": 3e-3, "batch_size": 8, "epochs": 2, "progress_bar": False}}
    path = folder / "evaluate.yaml"
    path.write_text(json.dumps(recipe))
    return path


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory, teacher_dir):
    """The same evaluation run by one process and by two: (folder, recipe, one's output, two's output)."""
    folder = tmp_path_factory.mktemp("evaluations")
    recipe = evaluation_recipe(folder, teacher_dir)
    one = run_biodistil(["evaluate", str(recipe), "--out", "one"], folder, processes=1)
    two = run_biodistil(["evaluate", str(recipe), "--out", "two"], folder, processes=2)
    return folder, recipe, one.stdout, two.stdout


def assert_same_results(folder: Path, name: str) -> None:
    """`folder/name` holds the results and report of `folder/one`, the one-process run."""
    one, other = folder / "one", folder / name
    assert without_timings(json.loads((other / "results.json").read_text()), other) == \
        without_timings(json.loads((one / "results.json").read_text()), one)
    assert (other / "report.md").read_text().replace(str(other), "ROOT") == \
        (one / "report.md").read_text().replace(str(one), "ROOT")


@pytest.mark.slow
def test_evaluate_shares_its_cells_out_over_two_processes_and_reports_as_one_does(evaluations):
    folder, _, one, two = evaluations
    assert_same_results(folder, "two")
    cells = fine_tuned(one)
    assert len(cells) == 8 and set(cells.values()) == {1}
    assert fine_tuned(two) == cells, "every cell fine-tuned once, by one process"
    per_process = Counter(re.findall(r"^\[\d+/8, process (\d)\] .+: fine-tuning$", two, re.MULTILINE))
    assert per_process == {"0": 4, "1": 4}, "each process has the same expected work: 2 cells of each model"
    for record in sorted((folder / "two" / "cells").rglob("train/metrics.jsonl")):  # each folder written once
        reference = folder / "one" / record.relative_to(folder / "two")
        assert record.read_text().count("\n") == reference.read_text().count("\n")
    assert two.count(str(folder / "two" / "report.md")) == 1


@pytest.mark.slow
def test_an_interrupted_evaluation_resumes_under_one_or_two_processes(evaluations):
    folder, recipe, _, _ = evaluations
    out = folder / "two"
    cells = sorted(path.parent for path in (out / "cells").rglob("metrics.json"))
    stamps = {cell: (cell / "metrics.json").stat().st_mtime_ns for cell in cells}

    def interrupt(lost: list[Path]) -> None:  # as a kill during these cells leaves them: no metrics.json
        for cell in lost:
            (cell / "metrics.json").unlink()
            (cell / "train" / "checkpoints" / "step-0000001").mkdir(parents=True)

    def resume(processes: int, lost: list[Path]) -> None:
        output = run_biodistil(["evaluate", str(recipe), "--out", "two", "--resume"], folder, processes).stdout
        assert sum(fine_tuned(output).values()) == len(lost) and output.count("finished before, skipped") == 8 - len(
            lost)
        for cell in cells:
            assert ((cell / "metrics.json").stat().st_mtime_ns == stamps[cell]) == (cell not in lost), cell
            assert not (cell / "train" / "checkpoints").exists()
            stamps[cell] = (cell / "metrics.json").stat().st_mtime_ns
        assert_same_results(folder, "two")

    interrupt(cells[:2])  # a two-process run interrupted, continued by one process
    resume(1, cells[:2])
    interrupt(cells[3:6])  # a one-process run interrupted, continued by two
    resume(2, cells[3:6])


# ------------------------------------------------------------------------------------------- study


@pytest.mark.slow
def test_a_study_shares_teachers_then_arms_and_seeds_out_over_two_processes(tmp_path, teacher_dir, kd_models):
    train = {"batch_size": 8, "learning_rate": 3e-3, "progress_bar": False, "tensorboard": False}
    recipe = {"seeds": [1, 2], "student": str(kd_models[1]), "teacher_init": str(teacher_dir),
              "tasks": [{"name": str(write_pair_task(tmp_path / "qa"))},
                        {"name": str(write_token_task(tmp_path / "ner"))}],
              "defaults": {"finetune": {"finetune": {"epochs": 1}, "train": train},
                           "kd": {"kd": {"epochs": 1, "soft_loss": "hinton"}, "train": train}},
              "arms": [{"name": "tuned", "command": "finetune"}, {"name": "distilled", "command": "kd"}]}
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(recipe))
    run_biodistil(["study", str(path), "--out", "one"], tmp_path, processes=1)
    run_biodistil(["study", str(path), "--out", "two"], tmp_path, processes=2)
    one, two = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("one", "two"))
    assert two["rows"] == one["rows"] and len(two["rows"]) == 4
    assert without_timings(two["runs"]) == without_timings(one["runs"]) and len(two["runs"]) == 8
    assert without_timings(two["teachers"]) == without_timings(one["teachers"])
    for name in ("one", "two"):  # each run folder written once, by one process
        assert len(list((tmp_path / name).rglob("metrics.json"))) == 8 + 2
