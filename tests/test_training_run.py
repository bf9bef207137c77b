"""The one way a multi-stage job runs a stage: skip when finished, resume when interrupted, restart when empty."""

import pytest

from biodistil.config import deep_merge
from biodistil.training.run import run_stage


def checkpointed(folder):
    """A folder as an interrupted run leaves it: a complete checkpoint at step 2 and a stray file."""
    step = folder / "checkpoints" / "step-0000002"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text("{}")
    (folder / "stray.txt").write_text("left over")
    return folder


def test_a_finished_stage_is_skipped(tmp_path):
    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / "summary.json").write_text('{"finished": true}')
    calls = []
    assert not run_stage(tmp_path / "stage", calls.append)
    assert calls == []


def test_a_stage_with_its_model_but_no_summary_is_continued_not_skipped(tmp_path):
    folder = checkpointed(tmp_path / "stage")
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text("{}")  # killed after saving the model, before its summary
    calls = []
    assert run_stage(folder, calls.append)
    assert calls == [True]


def test_an_interrupted_stage_resumes_from_its_checkpoint(tmp_path):
    folder = checkpointed(tmp_path / "stage")
    calls = []
    assert run_stage(folder, calls.append)
    assert calls == [True] and (folder / "stray.txt").is_file(), "resumed in place"


def test_a_stage_without_checkpoint_restarts_in_an_empty_folder(tmp_path):
    folder = tmp_path / "stage"
    folder.mkdir()
    (folder / "stray.txt").write_text("left over")
    calls = []
    run_stage(folder, lambda resume: calls.append((resume, folder.exists())))
    assert calls == [(False, False)]


def test_a_stage_that_cannot_resume_restarts_even_after_a_checkpoint(tmp_path):
    folder = checkpointed(tmp_path / "stage")
    calls = []
    run_stage(folder, lambda resume: calls.append((resume, folder.exists())), resumable=False)
    assert calls == [(False, False)]


def test_deep_merge_merges_sections_and_shares_nothing():
    base = {"train": {"batch_size": 8, "learning_rate": 1e-3}, "seeds": [1, 2]}
    override = {"train": {"batch_size": 16}, "task": {"name": "gad"}}
    merged = deep_merge(base, override)
    assert merged == {"train": {"batch_size": 16, "learning_rate": 1e-3}, "seeds": [1, 2], "task": {"name": "gad"}}
    merged["train"]["batch_size"] = 1
    merged["seeds"].append(3)
    merged["task"]["name"] = "x"
    assert base == {"train": {"batch_size": 8, "learning_rate": 1e-3}, "seeds": [1, 2]}
    assert override == {"train": {"batch_size": 16}, "task": {"name": "gad"}}


def test_busy_cores_are_measured_now_from_cpu_counters(monkeypatch):
    from biodistil.training import threads

    readings = iter([("proc", 1000, 4000), ("proc", 1150, 4200)])  # 150 of 200 jiffies busy over the sample
    monkeypatch.setattr(threads, "cpu_counters", lambda: next(readings))
    cores = len(threads.os.sched_getaffinity(0))
    assert threads.busy_cores(0.0) == pytest.approx(cores * 0.75)
    readings = iter([("cgroup", 5_000_000, 10_000_000), ("cgroup", 5_300_000, 10_200_000)])  # 0.3 s CPU in 0.2 s
    monkeypatch.setattr(threads, "cpu_counters", lambda: next(readings))
    assert threads.busy_cores(0.0) == pytest.approx(1.5)
    monkeypatch.setattr(threads, "cpu_counters", lambda: None)
    assert threads.busy_cores(0.0) is None


def test_a_study_folder_is_continued_not_emptied(tmp_path):
    from biodistil.config import RunConfig, Section
    from biodistil.training.run import RunFolder

    class Recipe(Section):
        run: RunConfig

    recipe = Recipe(run=RunConfig(output_dir=str(tmp_path / "study")))
    RunFolder(recipe.run.output_dir, recipe, stages=True)
    (tmp_path / "study" / "task" / "arm").mkdir(parents=True)
    (tmp_path / "study" / "task" / "arm" / "config.yaml").write_text("run: {}\n")  # a stage that began
    again = RunFolder(recipe.run.output_dir, recipe, stages=True)
    assert again.resume and (tmp_path / "study" / "task" / "arm").is_dir()


def test_a_stage_puts_accelerates_process_state_back(tmp_path):
    """A stage trained under bf16 leaves the process's Accelerate state as it found it (float32 here), so that the
    next stage or the caller's own Accelerator is not refused or changed by it."""
    from accelerate.state import AcceleratorState

    from biodistil.training.engine import make_accelerator

    make_accelerator("no")
    inside = []
    run_stage(tmp_path / "stage", lambda resume: inside.append(make_accelerator("bf16").mixed_precision))
    assert inside == ["bf16"] and AcceleratorState().mixed_precision == "no"
