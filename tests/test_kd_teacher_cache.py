"""The teacher-output cache: keyed by the teacher's weights (and the transfer set, see test_kd_command)."""

import torch

from biodistil.kd import teacher_cache
from biodistil.kd.teacher_cache import load_teacher_classifier
from biodistil.models.loading import load_tokenizer


def test_teacher_fingerprint_follows_the_weights(kd_models, pair_task, tmp_path):
    teacher_path, _ = kd_models
    changed = load_teacher_classifier(teacher_path, pair_task)
    with torch.no_grad():
        changed.classifier.bias.add_(1.0)
    changed.save_pretrained(tmp_path / "changed")
    load_tokenizer(str(teacher_path)).save_pretrained(tmp_path / "changed")
    assert teacher_cache.model_fingerprint(teacher_path) == teacher_cache.model_fingerprint(teacher_path)
    assert teacher_cache.model_fingerprint(tmp_path / "changed") != teacher_cache.model_fingerprint(teacher_path)
