"""Dev selection and final test scores, written once for `finetune` and `kd` (`biodistil.finetune.selection`)."""

import json

from kd_fixtures import save_teacher

from biodistil.config import TrainConfig
from biodistil.finetune.on_task import ClassifierModule
from biodistil.finetune.selection import TEST_PREDICTIONS, ScoringSplit, select_on_dev, write_test_results
from biodistil.models.loading import load_tokenizer
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.scoring import score_model


def test_dev_selection_scores_dev_like_score_model_once_per_epoch(teacher_dir, pair_task, tmp_path):
    model = build_classifier(save_teacher(teacher_dir, pair_task, tmp_path / "model"), pair_task)
    tokenizer = load_tokenizer(str(tmp_path / "model"))
    dev = pair_task.load_split("dev")
    cfg = TrainConfig(batch_size=4, eval_every=0)
    assert select_on_dev(None, cfg, 40, lambda m: m.model) == (None, None, cfg)
    evaluate_fn, selection, chosen = select_on_dev(ScoringSplit.encode(pair_task, dev, tokenizer), cfg, 42,
                                                   lambda m: m.model, patience=2)
    assert chosen.eval_every == 10 and cfg.eval_every == 0  # once per epoch of 42 features in batches of 4
    assert (selection.metric, selection.mode, selection.patience) == (pair_task.headline_key, "max", 2)
    assert evaluate_fn(ClassifierModule(model)) == score_model(model, tokenizer, pair_task, dev, 8).scores
    kept = select_on_dev(ScoringSplit.encode(pair_task, dev, tokenizer), cfg.model_copy(update={"eval_every": 3}),
                         42, lambda m: m.model, metric="auroc")
    assert kept.cfg.eval_every == 3 and kept.selection.metric == "auroc"


def test_test_results_write_predictions_and_notes(teacher_dir, pair_task, tmp_path, capsys):
    model = build_classifier(save_teacher(teacher_dir, pair_task, tmp_path / "model"), pair_task)
    test = pair_task.load_split("test")
    scored = ScoringSplit.encode(pair_task, test, load_tokenizer(str(tmp_path / "model"))).scored(model, 8)
    written = write_test_results(tmp_path, pair_task, test, scored.predictions, {"test": 2})
    rows = [json.loads(line) for line in (tmp_path / TEST_PREDICTIONS).read_text().splitlines()]
    assert len(rows) == len(test) and set(written) == {"degenerate", "notes"}
    assert written["notes"][0].startswith("Long examples cut to")
    assert "Warning: Long examples cut to" in capsys.readouterr().err
