"""Building students and checking vocabularies."""

import re

import pytest
import torch

from biodistil.config import ArchitectureConfig, StudentConfig
from biodistil.data.vocab import train_wordpiece
from biodistil.errors import BiodistilError
from biodistil.models.loading import load_masked_lm, load_tokenizer
from biodistil.models.student import (
    alternate_layers,
    build_student,
    check_same_vocabulary,
    student_from_teacher_layers,
)


def test_alternate_layers():
    assert alternate_layers(12) == [0, 2, 4, 6, 8, 10]
    assert alternate_layers(4) == [0, 2]


def test_student_copies_embeddings_head_and_chosen_layers(teacher):
    student = student_from_teacher_layers(teacher, [1, 3])
    assert student.config.num_hidden_layers == 2
    t, s = teacher.state_dict(), student.state_dict()
    assert torch.equal(s["bert.embeddings.word_embeddings.weight"], t["bert.embeddings.word_embeddings.weight"])
    assert torch.equal(s["cls.predictions.transform.dense.weight"], t["cls.predictions.transform.dense.weight"])
    for student_layer, teacher_layer in ((0, 1), (1, 3)):
        key = "bert.encoder.layer.{}.attention.self.query.weight"
        assert torch.equal(s[key.format(student_layer)], t[key.format(teacher_layer)])
    student.eval(), teacher.eval()
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    # the copied layers compute exactly what the teacher's layers compute
    teacher_hidden = teacher.bert(ids, output_hidden_states=True).hidden_states
    layer = teacher.bert.encoder.layer[3]
    assert torch.allclose(layer(teacher_hidden[3])[0], teacher_hidden[4], atol=1e-5)
    assert torch.allclose(student.bert.encoder.layer[1](teacher_hidden[3])[0], teacher_hidden[4], atol=1e-5)


def test_default_is_every_other_layer_and_bad_lists_fail(teacher):
    assert student_from_teacher_layers(teacher).config.num_hidden_layers == 2
    for bad in ([], [0, 0], [0, 4], [-1]):
        with pytest.raises(BiodistilError, match=re.escape("student.layers")):
            student_from_teacher_layers(teacher, bad)


def test_student_from_architecture_uses_teacher_vocabulary(teacher, tokenizer):
    cfg = StudentConfig(init="architecture", architecture=ArchitectureConfig(
        num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32, max_position_embeddings=64))
    student, student_tokenizer = build_student(cfg, teacher, tokenizer)
    assert student.config.hidden_size == 16 and student.config.vocab_size == len(tokenizer)
    check_same_vocabulary(teacher, tokenizer, student, student_tokenizer)


def test_vocabulary_mismatch_fails_early(teacher, tokenizer):
    other = train_wordpiece(["completely different words here"] * 20, vocab_size=120, min_frequency=1)
    with pytest.raises(BiodistilError, match="tokenizers differ"):
        check_same_vocabulary(teacher, tokenizer, teacher, other)


def test_loading_errors_are_clear(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network wait in tests
    with pytest.raises(BiodistilError, match=r"there is no folder .*no-such-org/no-such-model.*, and as a Hub id"):
        load_masked_lm("no-such-org/no-such-model")
    with pytest.raises(BiodistilError, match=re.escape("no config.json")):
        load_masked_lm(str(tmp_path))
    with pytest.raises(BiodistilError, match=r"there is no folder .*, and as a Hub id"):
        load_tokenizer("no-such-org/no-such-model")


@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert"])
def test_every_family_builds_students_and_gives_features(model_type, tokenizer):
    from biodistil.models.features import FeatureRequest, extract_features
    from biodistil.models.student import model_from_architecture

    arch = ArchitectureConfig(model_type=model_type, num_layers=4, hidden_size=16, num_heads=2,
                              intermediate_size=32, max_position_embeddings=64)
    teacher = model_from_architecture(arch, tokenizer).eval()
    student = student_from_teacher_layers(teacher, [0, 3]).eval()
    batch = tokenizer(["the protein kinase gene", "cancer"], return_tensors="pt", padding=True)
    batch = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    positions = batch["attention_mask"].bool()
    features = extract_features(student, batch, FeatureRequest(hidden={0, -1}, logits=True), positions)
    logits = features.logits.at(positions).logits()
    assert logits.shape == (int(positions.sum()), len(tokenizer))
    assert set(features.hidden) == {0, 2}
    with torch.no_grad():
        full = student(**batch)
    # logits at the chosen positions equal the model's own full-vocabulary logits there
    assert torch.allclose(logits, full.logits[positions], atol=1e-5)
