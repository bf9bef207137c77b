"""Issue 54: fault cases of whole jobs, typed as a user types them: a study arm whose record is lost or damaged runs
again (and says so); a study refused before its first stage leaves nothing that blocks the corrected command.
(A pipeline killed between a stage's model and its summary: tests/test_run_lifecycle.py.)"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from kd_fixtures import write_pair_task

from biodistil.cli.main import main

pytestmark = pytest.mark.slow  # whole commands: their checks are of files and messages

STUDY = """
run: {output_dir: runs/study}
seeds: [1]
student: models/student
tasks: [{name: tasks/tiny_qa/tiny_qa.yaml, teacher: models/teacher}]
defaults:
  finetune: {task: {max_length: 48}, finetune: {epochs: 1, score_init: false},
             train: {batch_size: 16, learning_rate: 0.001, warmup_steps: 0, eval_every: 0, save_every: 0,
                     progress_bar: false, tensorboard: false}}
arms: [{name: finetuned, command: finetune}]
"""


@pytest.fixture()
def project(tmp_path, kd_models, monkeypatch) -> Path:
    """A user's project folder: a fine-tuned teacher, a student, a tiny pair task and study.yaml."""
    teacher, student = kd_models
    shutil.copytree(teacher, tmp_path / "models" / "teacher")
    shutil.copytree(student, tmp_path / "models" / "student")
    write_pair_task(tmp_path / "tasks" / "tiny_qa", {"train": 16, "dev": 8, "test": 8})
    (tmp_path / "study.yaml").write_text(STUDY, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


ARM = Path("runs/study/tiny_qa/finetuned/seed-1")


@pytest.mark.parametrize("damage", ["missing", "damaged"])
def test_study_resume_runs_again_a_finished_arm_whose_metrics_are_lost_or_damaged_and_says_so(
        project, capsys, damage):
    assert main(["study", "study.yaml"]) == 0
    if damage == "missing":
        (project / ARM / "metrics.json").unlink()
    else:
        (project / ARM / "metrics.json").write_text('{"test": {"accuracy"', encoding="utf-8")  # a copy cut short
    capsys.readouterr()
    assert main(["study", "study.yaml", "--resume"]) == 0
    out = capsys.readouterr().out
    said = "missing; the finished run runs again" if damage == "missing" else "damaged record"
    assert f"{ARM / 'metrics.json'}" in out and said in out
    assert out.count(f"{ARM / 'metrics.json'}:") == 1, "said once"
    assert json.loads((project / ARM / "metrics.json").read_text())["test"], "the arm ran again"
    rows = json.loads((project / "runs" / "study" / "summary.json").read_text())["rows"]
    assert [row["arm"] for row in rows] == ["finetuned"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the override is refused only on a machine without CUDA")
def test_a_study_refused_before_its_first_stage_leaves_nothing_that_blocks_the_corrected_command(project, capsys):
    assert main(["study", "study.yaml", "defaults.finetune.train.device=cuda", "--out", "runs/x"]) != 0
    assert "cuda" in capsys.readouterr().err.lower()
    assert main(["study", "study.yaml", "--out", "runs/x"]) == 0, "the corrected command runs"
    err = capsys.readouterr().err
    assert "recipe differs" not in err and "stopped before its first stage; starting it again" in err
    assert (project / "runs" / "x" / "summary.json").is_file()
