"""`biodistil kd` end to end: the recipe's checks, the gap closed, and the teacher-output cache serving every
epoch and run (rebuilt when the transfer set changes)."""

import math

import pytest
from kd_fixtures import kd_recipe

from biodistil.config import validate_recipe
from biodistil.errors import BiodistilError
from biodistil.kd.command import gap_closed, run_kd
from biodistil.kd.recipe import KDRecipe
from biodistil.teachers import task_cache


def test_gap_closed_by_hand():
    gaps = gap_closed({"auroc": 0.8, "f1": 0.5}, {"auroc": 0.5, "f1": 0.5}, {"auroc": 0.9, "f1": 0.5})
    assert gaps["auroc"] == pytest.approx(0.75)
    assert math.isnan(gaps["f1"]), "no gap between initialisation and teacher: undefined"


def test_recipe_checks_labels_and_meta_modes(tmp_path):
    base = {"teacher": {"name_or_path": "t"}, "student": {"name_or_path": "s"}, "task": {"name": "gad"}}
    with pytest.raises(BiodistilError, match="keep_labels"):
        validate_recipe(KDRecipe, {**base, "kd": {"beta": 0.5}})
    with pytest.raises(BiodistilError, match="online"):
        validate_recipe(KDRecipe, {**base, "kd": {"teacher_outputs": "cached"}, "meta": {},
                                   "transfer": {"keep_labels": True}})
    with pytest.raises(BiodistilError, match="beta > 0"):
        validate_recipe(KDRecipe, {**base, "kd": {"soft_loss": "none"}, "transfer": {"keep_labels": True}})
    assert validate_recipe(KDRecipe, {**base, "meta": {}, "transfer": {"keep_labels": True}}).outputs_mode() == \
        "online"


def test_teacher_cache_serves_every_epoch_and_is_rebuilt_when_the_transfer_set_changes(
        kd_models, pair_task, tmp_path, monkeypatch):
    teacher_path, student_path = kd_models
    calls = []
    real = task_cache.forward_teacher

    def counting(model, batch, hidden):
        calls.append(len(batch["input_ids"]))
        return real(model, batch, hidden)

    monkeypatch.setattr(task_cache, "forward_teacher", counting)
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    run_kd(kd_recipe(task_file, teacher_path, student_path, tmp_path / "first"))
    assert sum(calls) == 48, "the teacher saw each of the 48 transfer examples once, for both epochs"
    metrics = (tmp_path / "first" / "metrics.json").read_text()
    assert '"steps": 12' in metrics and '"gap_closed"' in metrics
    calls.clear()
    run_kd(kd_recipe(task_file, teacher_path, student_path, tmp_path / "second"))
    assert calls == [], "a second run on the same transfer set reads the cache"
    changed = {"source": {"kind": "in_domain", "max_examples": 40}}
    run_kd(kd_recipe(task_file, teacher_path, student_path, tmp_path / "third", transfer=changed))
    assert sum(calls) == 40, "a changed transfer set gets fresh teacher outputs"
    assert (tmp_path / "third" / "model" / "config.json").is_file()
    assert (tmp_path / "third" / "test_predictions.jsonl").read_text().count("\n") == 24
