"""`biodistil finetune` end to end on a tiny task: model, metrics (with S_init) and test predictions."""

import json

from kd_fixtures import write_pair_task
from recipe_fixtures import QUIET, RECIPES

from biodistil.cli.main import main


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
