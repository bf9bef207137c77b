"""The KD module and its teacher signals: a frozen teacher gets no gradient and is not part of what is trained;
cached and online teacher outputs are the same through one interface; token tasks are cached per word."""

import pytest
import torch
from kd_fixtures import save_teacher, write_token_task

from biodistil.data.formats import TokenExample
from biodistil.kd.module import KDCollator, KDModule, kd_data, kd_features
from biodistil.kd.recipe import KDOptions
from biodistil.kd.transfer import unlabelled
from biodistil.models.features import FeatureRequest
from biodistil.models.loading import load_tokenizer
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.encoding import FeatureCollator, encode_split, model_inputs
from biodistil.tasks.registry import get_task
from biodistil.teachers.loading import load_teacher_classifier
from biodistil.teachers.signal import CachedTeacher, OnlineTeacher, classifier_forward
from biodistil.teachers.task_cache import NO_ROW, TeacherRequest, cached_teacher_outputs, with_placeholder_labels


def test_plain_kd_sends_no_gradient_to_the_teacher(kd_models, pair_task, tmp_path):
    teacher_path, student_path = kd_models
    teacher = load_teacher_classifier(teacher_path, pair_task)
    before = {name: p.detach().clone() for name, p in teacher.named_parameters()}
    student = build_classifier(student_path, pair_task)
    module = KDModule(student, pair_task, KDOptions(), OnlineTeacher(teacher, classifier_forward))
    tokenizer = load_tokenizer(str(student_path))
    examples = pair_task.load_split("train")[:8]
    batch = KDCollator(FeatureCollator(tokenizer.pad_token_id, False))(
        kd_features(pair_task, examples, tokenizer))
    loss, _ = module(batch)
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert any(p.grad is not None for p in student.parameters())
    assert "teacher" not in dict(module.named_children()), "a frozen teacher is not part of the trained module"
    torch.optim.SGD(module.parameters(), lr=1.0).step()
    assert all(torch.equal(p, before[name]) for name, p in teacher.named_parameters())


def test_cached_outputs_equal_online_outputs(kd_models, pair_task, tmp_path):
    teacher_path, student_path = kd_models
    tokenizer = load_tokenizer(str(student_path))
    examples = [unlabelled(e) for e in pair_task.load_split("train")[:10]]
    outputs = cached_teacher_outputs(teacher_path, examples, TeacherRequest(pair_task, (2, 4), teacher_layers=4),
                                     tmp_path)
    features, collate = kd_data(pair_task, examples, tokenizer, CachedTeacher(outputs))
    cached = collate(features)
    teacher = load_teacher_classifier(teacher_path, pair_task)
    with torch.no_grad():
        out = teacher(**model_inputs(teacher, cached.inputs), output_hidden_states=True)
    assert torch.allclose(cached.teacher["logits"], out.logits, atol=1e-5)
    assert torch.allclose(cached.teacher["cls"][:, 1], out.hidden_states[4][:, 0], atol=1e-5)
    assert cached.labels is None, "an unlabelled transfer set gives label-free batches"
    signals = CachedTeacher(outputs), OnlineTeacher(teacher, classifier_forward)
    from_cache, online = (signal.get_signal(cached, FeatureRequest(hidden={2, 4})) for signal in signals)
    assert torch.allclose(from_cache.logits.logits(), online.logits.logits(), atol=1e-5), \
        "one interface, the same teacher outputs"
    for layer in (2, 4):
        assert torch.allclose(from_cache.hidden_at(layer)[:, 0], online.hidden_at(layer)[:, 0], atol=1e-5)


def test_token_task_outputs_are_cached_per_word(teacher_dir, tokenizer, tmp_path):
    task = get_task(str(write_token_task(tmp_path / "ner")))
    teacher_path = save_teacher(teacher_dir, task, tmp_path / "teacher")
    examples = [TokenExample(e.id, e.tokens, []) for e in task.load_split("train")]
    outputs = cached_teacher_outputs(teacher_path, examples, TeacherRequest(task), tmp_path / "cache")
    features, collate = kd_data(task, examples, tokenizer, CachedTeacher(outputs))
    assert len(features) > len(examples), "long sentences are split into windows"
    teacher = load_teacher_classifier(teacher_path, task)
    encoded = encode_split(task, with_placeholder_labels(examples, task), tokenizer)
    for feature, plain, word_ids in zip(features, encoded.features, encoded.word_ids, strict=True):
        with torch.no_grad():
            logits = teacher(input_ids=torch.tensor([plain["input_ids"]])).logits[0]
        batch = collate([feature])
        firsts = [p for p, w in enumerate(word_ids) if w is not None and (p == 0 or word_ids[p - 1] != w)]
        assert [p for p, m in enumerate(batch.masks["kd"][0].tolist()) if m] == firsts
        for position in firsts:
            assert torch.allclose(batch.teacher["logits"][0, position], logits[position], atol=1e-5)
    rows = outputs.attach(kd_features(task, examples, tokenizer)[0])["rows@0"]
    assert [int(row != NO_ROW) for row in rows] == features[0]["kd_mask"]


def test_a_labelled_budget_in_unlabelled_text_gives_ce_on_the_labelled_examples_only(kd_models, pair_task):
    teacher_path, student_path = kd_models
    teacher = load_teacher_classifier(teacher_path, pair_task)
    student = build_classifier(student_path, pair_task)
    tokenizer = load_tokenizer(str(student_path))
    examples = pair_task.load_split("train")[:8]
    mixed = [e if i in (1, 4, 6) else unlabelled(e) for i, e in enumerate(examples)]
    collate = KDCollator(FeatureCollator(tokenizer.pad_token_id, False))
    batch = collate(kd_features(pair_task, mixed, tokenizer))
    assert batch.labels.tolist() == [-100 if i not in (1, 4, 6) else pair_task.label_to_id[examples[i].label]
                                        for i in range(8)]
    module = KDModule(student.eval(), pair_task, KDOptions(alpha=1.0, beta=1.0),
                      OnlineTeacher(teacher, classifier_forward))
    _, terms = module(batch)
    with torch.no_grad():
        logits = student(**model_inputs(student, batch.inputs)).logits
    labelled = batch.labels != -100
    expected = torch.nn.functional.cross_entropy(logits[labelled], batch.labels[labelled])
    assert float(terms["ce"]) == pytest.approx(float(expected), rel=1e-4)
    assert float(expected) > 1e-3
