"""`biodistil finetune` end to end on a tiny task: model, metrics (with S_init) and test predictions."""

import json

import pytest
import torch
from kd_fixtures import write_pair_task
from recipe_fixtures import QUIET, RECIPES
from transformers import AutoModel

from biodistil.cli.main import main
from biodistil.config import load_recipe
from biodistil.errors import BiodistilError
from biodistil.finetune.init_model import init_model_path
from biodistil.kd.recipe import KDRecipe


def test_finetune_command_saves_model_metrics_and_predictions(tmp_path, teacher_dir):
    task_file = write_pair_task(tmp_path / "task")
    out = tmp_path / "run"
    code = main(["finetune", str(RECIPES / "finetune-bioasq.yaml"), f"model.name_or_path={teacher_dir}",
                 f"task.name={task_file}", "finetune.epochs=1", "train.learning_rate=1e-3", *QUIET, "--out", str(out)])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["test"]) == {"accuracy", "auroc"} and set(metrics["init"]) == {"accuracy", "auroc"}
    assert metrics["dev"] and metrics["train"]["steps"] == 6
    assert (out / "model" / "config.json").is_file() and (out / "model" / "tokenizer.json").is_file()
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"] == {"0": "yes",
                                                                                                  "1": "no"}
    predictions = [json.loads(line) for line in (out / "test_predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 24 and predictions[0]["predicted"] in ("yes", "no")
    assert main(["finetune", str(RECIPES / "finetune-bioasq.yaml"), "--out", str(out), "--resume"]) == 2


def test_a_finetune_run_can_start_from_fresh_weights_drawn_from_its_seed(tmp_path, teacher_dir):
    """model.reinitialise, the no-pre-training baseline of a study arm: the model's layers with weights drawn from
    run.seed, written to the run's init_model; a kd teacher refuses it (a teacher is used as it is)."""
    out = tmp_path / "run"
    code = main(["finetune", str(RECIPES / "finetune-bioasq.yaml"), f"model.name_or_path={teacher_dir}",
                 "model.layers=[0,2]", "model.reinitialise=true", "run.seed=3",
                 f"task.name={write_pair_task(tmp_path / 'task')}", "finetune.epochs=1", *QUIET, "--out", str(out)])
    assert code == 0
    name = "encoder.layer.1.attention.self.query.weight"
    started = dict(AutoModel.from_pretrained(out / "init_model").named_parameters())[name]
    drawn = AutoModel.from_pretrained(init_model_path(str(teacher_dir), [0, 2], tmp_path / "drawn", True, seed=3))
    copied = AutoModel.from_pretrained(init_model_path(str(teacher_dir), [0, 2], tmp_path / "copied"))
    assert torch.equal(started, dict(drawn.named_parameters())[name])
    assert (started - dict(copied.named_parameters())[name]).abs().max() > 1e-3, "not the pre-trained layer"
    with pytest.raises(BiodistilError, match=r"teacher\.reinitialise"):
        load_recipe(KDRecipe, RECIPES / "kd-gad-pkd.yaml", ["teacher.reinitialise=true"])


def test_finetune_resumes_an_interrupted_run_and_restarts_a_failed_one(tmp_path, teacher_dir, capsys):
    task_file = write_pair_task(tmp_path / "task")
    out = tmp_path / "run"
    command = ["finetune", str(RECIPES / "finetune-bioasq.yaml"), f"model.name_or_path={teacher_dir}",
               f"task.name={task_file}", "finetune.epochs=1", "train.save_every=2", *QUIET, "--out", str(out)]
    assert main(command) == 0
    for name in ("summary.json", "metrics.json"):  # as kill -9 after the last checkpoint leaves it
        (out / name).unlink()
    assert main(command) == 2
    assert "interrupted at step 6; continue it with --resume" in capsys.readouterr().err
    assert main([*command[:-2], "train.learning_rate=0.5", *command[-2:], "--resume"]) == 2
    assert "train.learning_rate: 2e-05 -> 0.5" in capsys.readouterr().err
    assert main([*command, "--resume"]) == 0 and (out / "metrics.json").is_file()
    for item in out.iterdir():  # as a failure before the first checkpoint leaves it
        if item.name != "config.yaml":
            item.unlink() if item.is_file() else __import__("shutil").rmtree(item)
    assert main(command) == 0 and (out / "metrics.json").is_file()


def test_bf16_autocast_on_cpu_finetunes_into_an_fp32_model(tmp_path, teacher_dir, fresh_accelerator_state):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    task_file = write_pair_task(tmp_path / "task")
    out = tmp_path / "run"
    code = main(["finetune", str(RECIPES / "finetune-bioasq.yaml"), f"model.name_or_path={teacher_dir}",
                 f"task.name={task_file}", "finetune.epochs=8", "finetune.patience=null", "train.learning_rate=3e-3",
                 "train.precision=bf16", "train.log_every=6", *QUIET, "--out", str(out)])
    assert code == 0
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"], "loss falls under bf16 autocast"
    assert {w.dtype for w in load_file(str(out / "model" / "model.safetensors")).values()} == {torch.float32}
    model = AutoModelForSequenceClassification.from_pretrained(out / "model", dtype=torch.float32)
    assert all(torch.isfinite(p).all() for p in model.parameters())
