"""MetaDistil and MetaAdaptiveKD: the teacher learns, α and β learn and stay positive, the approximation holds,
and a meta-learning run resumes exactly (teacher and its optimizer are checkpointed with the run)."""

import json

import pytest
import torch
from kd_fixtures import kd_recipe, no_dropout_copy, save_student, save_teacher, write_pair_task
from safetensors.torch import load_file

from biodistil.config import TrainConfig
from biodistil.kd.command import run_kd
from biodistil.kd.meta import MetaTeacherUpdate
from biodistil.kd.module import KDCollator, KDModule, kd_features
from biodistil.kd.recipe import KDOptions, MetaConfig
from biodistil.models.loading import load_tokenizer
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.encoding import FeatureCollator
from biodistil.tasks.registry import get_task
from biodistil.teachers.loading import load_teacher_classifier
from biodistil.teachers.signal import OnlineTeacher, classifier_forward


@pytest.fixture(scope="module")
def setting(tmp_path_factory, teacher_dir, tokenizer):
    root = tmp_path_factory.mktemp("meta")
    task_file = write_pair_task(root / "task")
    task = get_task(str(task_file))
    calm_teacher = no_dropout_copy(teacher_dir, root / "teacher_init")  # dropout 0: exact gradient comparisons
    teacher = save_teacher(calm_teacher, task, root / "teacher")
    student = save_student(tokenizer, root / "student", dropout=0.0)
    return task_file, task, teacher, student


def meta_module(setting, adaptive=False):
    _, task, teacher_path, student_path = setting
    torch.manual_seed(0)
    cfg = KDOptions(alpha=0.5, beta=0.5, temperature=2.0)
    teacher = load_teacher_classifier(teacher_path, task)
    module = KDModule(build_classifier(student_path, task), task, cfg, OnlineTeacher(teacher, classifier_forward),
                      trainable_teacher=True, adaptive=adaptive)
    tokenizer = load_tokenizer(str(student_path))
    collate = KDCollator(FeatureCollator(tokenizer.pad_token_id, False))
    examples = task.load_split("train")
    train, quiz = kd_features(task, examples[:32], tokenizer), kd_features(task, examples[32:], tokenizer)
    return module, collate, train, quiz


def pre_step(module, collate, quiz, **meta):
    cfg = MetaConfig(mode="adaptive" if module.adaptive else "metadistil", **meta)
    return MetaTeacherUpdate(module, quiz, collate, cfg, TrainConfig(learning_rate=0.05, batch_size=8), seed=1)


def test_metadistil_sends_gradient_to_the_teacher_and_changes_it(setting):
    module, collate, train, quiz = meta_module(setting)
    module.train()
    teacher_before = [p.detach().clone() for p in module.teacher.parameters()]
    student_before = [p.detach().clone() for p in module.student.parameters()]
    update = pre_step(module, collate, quiz, teacher_learning_rate=1e-3)
    logs = update(module, [collate(train[:8])], step=0)
    assert logs["meta_grad_norm"] > 0, "the quiz loss reaches the teacher through the pilot step"
    assert any(not torch.equal(a, p) for a, p in zip(teacher_before, module.teacher.parameters(), strict=True))
    assert all(torch.equal(a, p) for a, p in zip(student_before, module.student.parameters(), strict=True)), \
        "the pilot is a functional copy: the real student is untouched"
    assert all(p.grad is None for p in module.student.parameters())
    assert "teacher_model" in dict(module.named_children()), "a meta-learned teacher is trained and checkpointed"


def test_meta_adaptive_weights_change_and_stay_positive(setting):
    module, collate, train, quiz = meta_module(setting, adaptive=True)
    module.train()
    update = pre_step(module, collate, quiz, weights_learning_rate=0.5)  # large steps: positivity must still hold
    seen = []
    for step in range(4):
        update(module, [collate(train[8 * step: 8 * step + 8])], step=step)
        alpha, beta = module.weights(detach=True)
        seen.append((float(alpha), float(beta)))
    assert all(a > 0 and b > 0 for a, b in seen)
    assert seen[-1] != (0.5, 0.5) and seen[0] != seen[-1], f"α and β did not move: {seen}"


def test_first_order_finite_difference_approximates_the_second_order_meta_gradient(setting):
    module, collate, train, quiz = meta_module(setting, adaptive=True)
    module.train()
    batch, quiz_batch = collate(train[:8]), collate(quiz[:8])
    named = [(n, p) for n, p in module.student.named_parameters()]
    buffers = dict(module.student.named_buffers())
    exact_update = pre_step(module, collate, quiz, order="second")
    approx_update = pre_step(module, collate, quiz, order="first", finite_difference=1e-3)
    targets = exact_update.meta_parameters()
    exact, _ = exact_update._second_order(named, buffers, [batch], quiz_batch, targets)
    approx, _ = approx_update._finite_difference(named, buffers, [batch], quiz_batch, targets)
    flat = lambda grads: torch.cat([g.reshape(-1) for g in grads if g is not None])  # noqa: E731
    cosine = torch.nn.functional.cosine_similarity(flat(exact), flat(approx), dim=0)
    assert cosine > 0.99
    assert torch.allclose(flat(exact).norm(), flat(approx).norm(), rtol=0.05)


@pytest.mark.slow
def test_meta_run_resumes_exactly(setting, tmp_path):
    task_file, _, teacher, student = setting
    sections = {"transfer": {"keep_labels": True}, "kd": {"beta": 0.5, "alpha": 0.5, "epochs": None},
                "meta": {"mode": "adaptive", "quiz_fraction": 0.25, "order": "first"},
                "train": {"max_steps": 4, "save_every": 2}}
    straight = kd_recipe(task_file, teacher, student, tmp_path / "straight", **sections)
    run_kd(straight)
    interrupted = kd_recipe(task_file, teacher, student, tmp_path / "resumed", **sections)
    run_kd(interrupted, stop_after=2)
    assert (tmp_path / "resumed" / "checkpoints" / "step-0000002" / "optimizer-pre_step.safetensors").is_file()
    run_kd(interrupted, resume=True)
    final = {name: load_file(str(tmp_path / name / "checkpoints" / "step-0000004" / "trainable.safetensors"))
             for name in ("straight", "resumed")}
    assert any(key.startswith("teacher_model.") for key in final["straight"])
    for key, value in final["straight"].items():
        assert torch.equal(value, final["resumed"][key]), key
    meta_log = [json.loads(line) for line in (tmp_path / "resumed" / "meta.jsonl").read_text().splitlines()]
    assert [record["step"] for record in meta_log] == [1, 2, 3, 4]
    assert all(record["meta_alpha"] > 0 and record["meta_beta"] > 0 for record in meta_log)
