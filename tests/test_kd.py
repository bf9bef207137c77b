"""Task-specific KD: the combined loss by hand, gap closed, a frozen teacher, the teacher-output cache."""

import math

import pytest
import torch
from test_kd_fixtures import save_student, save_teacher, write_pair_task, write_token_task

import biodistil.data.teacher_cache as teacher_cache
from biodistil.config import validate_recipe
from biodistil.data.formats import TokenExample
from biodistil.data.teacher_cache import TeacherRequest, attach_teacher_outputs, cached_teacher_outputs
from biodistil.data.transfer_sets import unlabelled
from biodistil.errors import BiodistilError
from biodistil.methods.finetune import build_classifier
from biodistil.methods.task_kd import (
    KDCollator,
    KDModule,
    gap_closed,
    kd_features,
    load_teacher_classifier,
    run_kd,
)
from biodistil.methods.task_recipe import KDOptions, KDRecipe
from biodistil.models.loading import load_tokenizer
from biodistil.tasks.encoding import FeatureCollator, encode_split, model_inputs
from biodistil.tasks.registry import get_task

LN3 = math.log(3.0)
KL_BY_HAND = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)  # KL((3/4, 1/4) ‖ (1/2, 1/2))


@pytest.fixture(scope="module")
def pair_task(tmp_path_factory):
    return get_task(str(write_pair_task(tmp_path_factory.mktemp("tiny_qa"))))


@pytest.fixture(scope="module")
def kd_models(tmp_path_factory, teacher_dir, tokenizer, pair_task):
    root = tmp_path_factory.mktemp("kd_models")
    return save_teacher(teacher_dir, pair_task, root / "teacher"), save_student(tokenizer, root / "student")


def kd_recipe(task_file, teacher, student, out, **sections) -> KDRecipe:
    raw = {"run": {"output_dir": str(out), "seed": 3}, "teacher": {"name_or_path": str(teacher)},
           "student": {"name_or_path": str(student)}, "task": {"name": str(task_file)},
           "kd": {"soft_loss": "hinton", "temperature": 2.0, "epochs": 2, "cache_dir": str(out.parent / "cache")},
           "train": {"batch_size": 8, "learning_rate": 1e-3, "save_every": 0, "eval_every": 0, "log_every": 1,
                     "tensorboard": False, "progress_bar": False}}
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return validate_recipe(KDRecipe, raw)


def test_distill_loss_is_alpha_soft_plus_beta_ce_plus_gamma_pkd_by_hand():
    cfg = KDOptions(soft_loss="hinton", alpha=0.7, beta=0.3, temperature=1.0, patient={"gamma": 2.0})
    task = get_task("bioasq")
    module = KDModule(torch.nn.Linear(1, 1), task, cfg, pairs=[(1, 1)])
    from biodistil.methods.task_kd import Outputs

    # [CLS] states (1, 0) vs (0, 1) after normalisation: MSE = ((1−0)² + (0−1)²)/2 = 1
    student = Outputs(torch.tensor([[0.0, 0.0]]), [torch.tensor([[3.0, 0.0]])])
    teacher = Outputs(torch.tensor([[LN3, 0.0]]), [torch.tensor([[0.0, 5.0]])])
    loss, logs = module.distill_loss(student, teacher, {"labels": torch.tensor([0])}, 0.7, 0.3)
    assert logs["soft"].item() == pytest.approx(KL_BY_HAND, rel=1e-5)
    assert logs["ce"].item() == pytest.approx(math.log(2.0), rel=1e-5)
    assert logs["pkd"].item() == pytest.approx(1.0, rel=1e-5)
    assert loss.item() == pytest.approx(0.7 * KL_BY_HAND + 0.3 * math.log(2.0) + 2.0, rel=1e-5)


def test_sigmoid_soft_loss_and_label_free_batches():
    cfg = KDOptions(soft_loss="sigmoid", alpha=1.0, beta=0.0, temperature=2.0)
    module = KDModule(torch.nn.Linear(1, 1), get_task("bioasq"), cfg)
    from biodistil.methods.task_kd import Outputs

    # z = z_1 − z_0: teacher 2 → q_T = σ(1); student 0 → q_S = 1/2; BCE = ln 2 whatever q_T
    loss, logs = module.distill_loss(Outputs(torch.tensor([[0.0, 0.0]])), Outputs(torch.tensor([[0.0, 2.0]])), {},
                                     1.0, 0.0)
    assert loss.item() == pytest.approx(math.log(2.0), rel=1e-5) and logs["ce"].item() == 0.0


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


def test_plain_kd_sends_no_gradient_to_the_teacher(kd_models, pair_task, tmp_path):
    teacher_path, student_path = kd_models
    teacher = load_teacher_classifier(teacher_path, pair_task)
    before = {name: p.detach().clone() for name, p in teacher.named_parameters()}
    student = build_classifier(student_path, pair_task)
    module = KDModule(student, pair_task, KDOptions(), teacher)
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
    table = cached_teacher_outputs(teacher_path, examples, TeacherRequest(pair_task, (2, 4)), tmp_path)
    cached = KDCollator(FeatureCollator(tokenizer.pad_token_id, False))(
        kd_features(pair_task, examples, tokenizer, table))
    teacher = load_teacher_classifier(teacher_path, pair_task)
    with torch.no_grad():
        out = teacher(**model_inputs(teacher, cached), output_hidden_states=True)
    assert torch.allclose(cached["teacher_logits"], out.logits, atol=1e-5)
    assert torch.allclose(cached["teacher_cls"][:, 1], out.hidden_states[4][:, 0], atol=1e-5)
    assert "labels" not in cached, "an unlabelled transfer set gives label-free batches"


def test_token_task_outputs_are_cached_per_word(teacher_dir, tokenizer, tmp_path):
    task = get_task(str(write_token_task(tmp_path / "ner")))
    teacher_path = save_teacher(teacher_dir, task, tmp_path / "teacher")
    examples = [TokenExample(e.id, e.tokens, []) for e in task.load_split("train")]
    table = cached_teacher_outputs(teacher_path, examples, TeacherRequest(task), tmp_path / "cache")
    features = kd_features(task, examples, tokenizer, table)
    assert len(features) > len(examples), "long sentences are split into windows"
    teacher = load_teacher_classifier(teacher_path, task)
    encoded = encode_split(task, teacher_cache.with_placeholder_labels(examples, task), tokenizer)
    for feature, plain, word_ids in zip(features, encoded.features, encoded.word_ids, strict=True):
        with torch.no_grad():
            logits = teacher(input_ids=torch.tensor([plain["input_ids"]])).logits[0]
        firsts = [p for p, w in enumerate(word_ids) if w is not None and (p == 0 or word_ids[p - 1] != w)]
        assert [p for p, m in enumerate(feature["kd_mask"]) if m] == firsts
        for position in firsts:
            assert torch.allclose(torch.tensor(feature["teacher_logits"][position]), logits[position], atol=1e-5)
    positions = [[int(label != -100) for label in f["labels"]] for f in encoded.features]
    assert attach_teacher_outputs(encoded, table, task, positions)[0]["kd_mask"] == features[0]["kd_mask"]


def test_teacher_cache_serves_every_epoch_and_is_rebuilt_when_the_transfer_set_changes(
        kd_models, pair_task, tmp_path, monkeypatch):
    teacher_path, student_path = kd_models
    calls = []
    real = teacher_cache.forward_teacher

    def counting(model, batch, hidden):
        calls.append(len(batch["input_ids"]))
        return real(model, batch, hidden)

    monkeypatch.setattr(teacher_cache, "forward_teacher", counting)
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


def test_teacher_fingerprint_follows_the_weights(kd_models, pair_task, tmp_path):
    teacher_path, _ = kd_models
    changed = load_teacher_classifier(teacher_path, pair_task)
    with torch.no_grad():
        changed.classifier.bias.add_(1.0)
    changed.save_pretrained(tmp_path / "changed")
    load_tokenizer(str(teacher_path)).save_pretrained(tmp_path / "changed")
    assert teacher_cache.model_fingerprint(teacher_path) == teacher_cache.model_fingerprint(teacher_path)
    assert teacher_cache.model_fingerprint(tmp_path / "changed") != teacher_cache.model_fingerprint(teacher_path)
