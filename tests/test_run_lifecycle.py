"""One run lifecycle (issue 32): `open_run` opens every training run in one order, `RunFolder.finish` finishes it in
one order — model, card, metrics, report, and summary.json last, the only "finished" marker (`finished`)."""

import os
from pathlib import Path

import pytest
import torch
import yaml

from biodistil.config import PretrainRecipe, validate_recipe
from biodistil.errors import BiodistilError
from biodistil.models.saving import export_model
from biodistil.training.run import Report, finished, open_run


def recipe_in(folder: Path, teacher_dir: Path, corpus_file: Path) -> PretrainRecipe:
    return validate_recipe(PretrainRecipe, {
        "run": {"output_dir": str(folder)},
        "model": {"init": "scratch", "tokenizer_name_or_path": str(teacher_dir),
                  "architecture": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32}},
        "data": {"train": [str(corpus_file)]}, "train": {"progress_bar": False, "tensorboard": False}})


def test_a_run_finishes_model_card_metrics_report_then_summary_and_a_kill_before_the_summary_is_unfinished(
        tmp_path, teacher_dir, corpus_file, teacher, tokenizer, monkeypatch):
    recipe = recipe_in(tmp_path / "run", teacher_dir, corpus_file)
    run, accelerator = open_run(recipe, resume=False)
    assert (run.path / "config.yaml").is_file() and (run.path / "provenance.json").is_file()
    assert accelerator.device == torch.device("cpu") and not finished(run.path)
    order = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (order.append(Path(dst).name), replace(src, dst))[1])
    summary = {"result": {"steps": 1}, "finished": True}
    report = Report("A run", {"steps": 1})

    def kill(summary: dict) -> None:
        raise KeyboardInterrupt("killed before the summary")

    with monkeypatch.context() as patch:
        patch.setattr(run, "write_summary", kill)
        with pytest.raises(KeyboardInterrupt):
            run.finish(summary, report, metrics={"f1": 0.5},
                       save_model=lambda folder: export_model(teacher, tokenizer, folder))
    assert (run.path / "report.md").is_file() and not finished(run.path), "everything but the marker: unfinished"
    written = [name for name in order if name in ("model", "README.md", "metrics.json", "report.md", "summary.json")]
    assert written == ["model", "README.md", "metrics.json", "report.md"]
    order.clear()
    run.finish(summary, report, metrics={"f1": 0.5}, save_model=lambda folder: export_model(teacher, tokenizer, folder))
    assert [name for name in order if name in ("metrics.json", "report.md", "summary.json")][-1] == "summary.json"
    assert finished(run.path) is not None
    (run.path / "summary.json").write_text('{"finished": false}')
    assert not finished(run.path), "a run stopped early with --stop-after"
    (run.path / "summary.json").write_text("{not json")
    assert not finished(run.path), "a damaged marker counts as unfinished"


def test_open_run_checks_the_models_before_anything_starts(tmp_path, teacher_dir, corpus_file):
    recipe = recipe_in(tmp_path / "run", teacher_dir, corpus_file)
    with pytest.raises(BiodistilError, match=r"teacher\.name_or_path"):
        open_run(recipe, resume=False, models=[(str(tmp_path / "absent"), "teacher.name_or_path", False)])
    assert not (tmp_path / "run").exists(), "no run folder for a run that cannot start"


def write_pipeline(folder: Path, teacher_dir: Path, corpus_file: Path) -> None:
    stage = {"run": {"seed": 1}, "model": {"init": "scratch", "tokenizer_name_or_path": str(teacher_dir),
             "architecture": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32}},
             "data": {"train": [str(corpus_file)], "block_size": 32, "eval_fraction": 0},
             "train": {"max_steps": 2, "batch_size": 4, "eval_every": 0, "save_every": 1, "progress_bar": False,
                       "tensorboard": False}}
    (folder / "pipe.yaml").write_text(yaml.safe_dump(
        {"run": {"output_dir": "runs/pipe"}, "stages": [{"name": "teacher", "command": "pretrain",
                                                          "settings": stage}]}))


@pytest.mark.slow
def test_a_pipeline_killed_between_a_stages_model_and_its_summary_continues_the_stage_rather_than_skipping_it(
        tmp_path, teacher_dir, corpus_file, monkeypatch, capsys):
    from biodistil.cli.main import main
    from biodistil.training.run import JobFolder

    monkeypatch.chdir(tmp_path)
    write_pipeline(tmp_path, teacher_dir, corpus_file)
    stage = tmp_path / "runs" / "pipe" / "teacher"

    def kill(self, summary: dict) -> None:
        raise KeyboardInterrupt("killed after the model, before its summary")

    with monkeypatch.context() as patch:
        patch.setattr(JobFolder, "write_summary", kill)
        assert main(["pipeline", "pipe.yaml"]) != 0, "interrupted"
    assert (stage / "model" / "config.json").is_file() and not (stage / "summary.json").exists()
    capsys.readouterr()
    assert main(["pipeline", "pipe.yaml"]) in (0, None)
    out = capsys.readouterr().out
    assert "skipping" not in out, "the unfinished stage was skipped"
    assert finished(stage) is not None and finished(stage)["result"]["steps"] == 2
    main(["pipeline", "pipe.yaml"])
    assert "stage 'teacher' already exported" in capsys.readouterr().out, "a finished stage is skipped"


def test_a_quick_demo_stage_with_its_model_but_no_summary_runs_again(tmp_path, corpus_file):
    """The quick demo reads "finished" as the pipeline does: a stage killed after its model, before its summary, runs
    again; a finished one is reused."""
    from biodistil.demo_quick import QUICK, _stage, _teacher_recipe

    folder = tmp_path / "teacher"
    calls = []

    def killed_before_the_summary(recipe: PretrainRecipe, resume: bool) -> None:
        calls.append(resume)
        (folder / "model").mkdir(parents=True, exist_ok=True)
        (folder / "model" / "config.json").write_text("{}")
        if len(calls) == 2:
            (folder / "summary.json").write_text('{"result": {"steps": 12}}')

    raw = _teacher_recipe(QUICK, corpus_file, tmp_path)
    for _ in range(3):
        assert _stage(folder, PretrainRecipe, killed_before_the_summary, raw) == folder / "model"
    assert calls == [False, False], "run, run again (no summary), then reused (finished)"
