"""Several teachers in task KD: the mixtures and confidence weights against values worked out by hand, the objective's
mixture and per-teacher sums, gradients reaching the student only, the pre-flight table and its refusals, and a run
with two cached teachers that resumes exactly."""

import json
import math

import numpy as np
import pytest
import torch
from kd_fixtures import kd_recipe, save_teacher
from safetensors.torch import load_file

from biodistil.data.batch import Batch
from biodistil.errors import BiodistilError
from biodistil.kd.command import run_kd
from biodistil.kd.module import KDCollator, KDModule, kd_features
from biodistil.kd.objective import KDObjective
from biodistil.kd.recipe import KDOptions, KDRecipe
from biodistil.losses.multi_teacher import confidence_weights, mixed_teacher_logits
from biodistil.models.features import classifier_features
from biodistil.models.loading import load_tokenizer
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.encoding import FeatureCollator
from biodistil.tasks.registry import get_task
from biodistil.teachers.loading import load_teacher_classifier
from biodistil.teachers.signal import OnlineTeacher, classifier_forward

LN3 = math.log(3.0)
FIRST, SECOND = torch.tensor([[LN3, 0.0]]), torch.tensor([[0.0, LN3]])  # p = (0.75, 0.25) and (0.25, 0.75)


def test_a_softmax_mixture_is_the_weighted_mean_of_the_probabilities():
    mixed = mixed_teacher_logits([FIRST, SECOND], torch.tensor([0.75, 0.25]), "softmax", temperature=1.0)
    assert torch.softmax(mixed, -1).tolist()[0] == pytest.approx([0.625, 0.375], abs=1e-6)  # .75·.75 + .25·.25
    tempered = mixed_teacher_logits([FIRST, SECOND], torch.tensor([0.5, 0.5]), "softmax", temperature=2.0)
    expected = 0.5 * torch.softmax(FIRST / 2, -1) + 0.5 * torch.softmax(SECOND / 2, -1)
    torch.testing.assert_close(torch.softmax(tempered / 2, -1), expected)


def test_sigmoid_and_logit_mixtures_by_hand():
    binary = mixed_teacher_logits([FIRST, SECOND], torch.tensor([0.5, 0.5]), "sigmoid", binary_pair=True)
    assert binary.tolist()[0] == pytest.approx([0.0, 0.0], abs=1e-6), "σ(−ln3) = .25 and σ(ln3) = .75 mix to .5"
    per_label = mixed_teacher_logits([torch.tensor([[LN3, 0.0]]), torch.tensor([[LN3, LN3]])],
                                     torch.tensor([0.5, 0.5]), "sigmoid")
    assert torch.sigmoid(per_label).tolist()[0] == pytest.approx([0.75, 0.625], abs=1e-6)
    mean = mixed_teacher_logits([FIRST, SECOND], torch.tensor([0.75, 0.25]), "logits")
    assert mean.tolist()[0] == pytest.approx([0.75 * LN3, 0.25 * LN3])


def test_confidence_weights_follow_the_gold_label_else_the_entropy():
    prior = torch.tensor([0.5, 0.5])
    rows = [torch.cat([FIRST, FIRST]), torch.cat([SECOND, torch.zeros(1, 2)])]  # row 2: the second teacher unsure
    weights = confidence_weights(rows, prior, torch.tensor([0, -100]))
    # row 1, gold label 0: c = (0.75, 0.25); row 2, no label: c = exp(−H) = (0.75^0.75·0.25^0.25, 0.5)
    sure = 0.75 ** 0.75 * 0.25 ** 0.25
    assert weights[:, 0].tolist() == pytest.approx([0.75, 0.25], abs=1e-6)
    assert weights[:, 1].tolist() == pytest.approx([sure / (sure + 0.5), 0.5 / (sure + 0.5)], abs=1e-6)
    skewed = confidence_weights(rows, torch.tensor([0.2, 0.8]), torch.tensor([0, 0]))
    assert skewed[:, 0].tolist() == pytest.approx([0.15 / 0.35, 0.2 / 0.35], abs=1e-6), "λ_k·c_k, normalised"
    multi = confidence_weights([torch.tensor([[LN3, -LN3]]), torch.zeros(1, 2)], prior, torch.tensor([[1.0, 0.0]]),
                               multi_label=True)
    assert multi[:, 0].tolist() == pytest.approx([0.75 / 1.25, 0.5 / 1.25], abs=1e-6), "geometric mean over labels"


def _batch(labels=None) -> Batch:
    return Batch({"attention_mask": torch.ones(1, 3, dtype=torch.long)}, labels)


def _features(logits):
    return classifier_features(logits, {}, 1)


def test_the_objective_distils_the_mixture_or_sums_one_term_per_teacher():
    bioasq = get_task("bioasq")
    student, teachers = _features(torch.zeros(1, 2)), [_features(FIRST), _features(SECOND)]
    mixture = KDObjective(KDOptions(temperature=1.0), bioasq, teacher_weights=(0.75, 0.25))
    loss, logs = mixture(student, teachers, _batch())
    by_hand = 0.625 * math.log(0.625 / 0.5) + 0.375 * math.log(0.375 / 0.5)
    assert loss.item() == pytest.approx(by_hand, rel=1e-5) and logs["soft"].item() == pytest.approx(by_hand, rel=1e-5)
    apart = KDObjective(KDOptions(temperature=1.0, combine="per_teacher"), bioasq, teacher_weights=(0.75, 0.25))
    loss, logs = apart(student, teachers, _batch())
    one = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)  # KL(p_k ‖ (.5, .5)), the same for both teachers
    assert loss.item() == pytest.approx(one, rel=1e-5)
    assert logs["soft@0"].item() == pytest.approx(one, rel=1e-5) and logs["soft@1"].item() == pytest.approx(one)
    with_ce = KDObjective(KDOptions(temperature=1.0, beta=0.5), bioasq, teacher_weights=(0.75, 0.25))
    loss, logs = with_ce(student, teachers, _batch(torch.tensor([0])))
    assert loss.item() == pytest.approx(by_hand + 0.5 * math.log(2.0), rel=1e-5), "CE once, on the gold label"
    confident = KDObjective(KDOptions(temperature=1.0, confidence=True), bioasq, teacher_weights=(0.5, 0.5))
    _, logs = confident(student, teachers, _batch(torch.tensor([0])))
    # gold label 0: w = (.75, .25), the mixture (.625, .375) again
    assert logs["soft"].item() == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.parametrize("soft_loss", ["hinton", "sigmoid", "logit_mse"])
def test_per_teacher_terms_with_fixed_weights_give_the_student_the_mixtures_gradient(soft_loss):
    """Each soft term is linear in its target up to a part free of the student (KL: Σ_k λ_k·KL(p_k ‖ q) =
    KL(p_mix ‖ q) + Σ_k λ_k·KL(p_k ‖ p_mix)), so `per_teacher` trains as `mixture` does (Study 5's two arms)."""
    bioasq = get_task("bioasq")
    teachers = [_features(FIRST), _features(SECOND)]
    grads, losses = [], []
    for combine in ("mixture", "per_teacher"):
        logits = torch.tensor([[0.3, -0.2]], requires_grad=True)
        objective = KDObjective(KDOptions(soft_loss=soft_loss, temperature=2.0, combine=combine), bioasq,
                                teacher_weights=(0.75, 0.25))
        loss, _ = objective(_features(logits), teachers, _batch())
        loss.backward()
        grads.append(logits.grad)
        losses.append(loss.item())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)
    assert grads[0].abs().max() > 1e-3, "the student learns"
    if soft_loss == "hinton":  # T²·Σ_k λ_k·KL(p_k ‖ p_mix) at T = 2: p_1 = softmax((ln 3, 0)/2) = (√3, 1)/(√3 + 1)
        p = (math.sqrt(3) / (math.sqrt(3) + 1), 1 / (math.sqrt(3) + 1))
        mix = (0.75 * p[0] + 0.25 * p[1], 0.75 * p[1] + 0.25 * p[0])
        spread = sum(a * math.log(a / b) for a, b in zip(p, mix, strict=True)) * 0.75 + sum(
            a * math.log(a / b) for a, b in zip(p[::-1], mix, strict=True)) * 0.25
        assert losses[1] - losses[0] == pytest.approx(4 * spread, rel=1e-4)


def test_two_online_teachers_send_gradients_to_the_student_only(kd_models, pair_task, teacher_dir, tmp_path):
    teacher_path, student_path = kd_models
    other = save_teacher(teacher_dir, pair_task, tmp_path / "other", seed=7)
    teachers = [load_teacher_classifier(path, pair_task) for path in (teacher_path, other)]
    student = build_classifier(student_path, pair_task)
    signals = [OnlineTeacher(model, classifier_forward, slot) for slot, model in enumerate(teachers)]
    module = KDModule(student, pair_task, KDOptions(), signals, teacher_weights=(0.5, 0.5))
    tokenizer = load_tokenizer(str(student_path))
    batch = KDCollator(FeatureCollator(tokenizer.pad_token_id, False))(
        kd_features(pair_task, pair_task.load_split("train")[:8], tokenizer))
    loss, _ = module(batch)
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for model in teachers for p in model.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert not {id(p) for p in module.parameters()} & {id(p) for m in teachers for p in m.parameters()}
    outputs = module.teacher_outputs(batch)
    assert len(outputs) == 2 and not torch.equal(outputs[0].logits.logits(), outputs[1].logits.logits())


def _two_teachers(kd_models, pair_task, teacher_dir, tmp_path, weights=(1.0, 3.0)):
    first, _ = kd_models
    second = save_teacher(teacher_dir, pair_task, tmp_path / "second", seed=5)
    return [{"name_or_path": str(path), "weight": w} for path, w in zip((first, second), weights, strict=True)]


def test_a_run_with_two_cached_teachers_records_them_and_resumes_exactly(kd_models, pair_task, teacher_dir,
                                                                         tmp_path):
    _, student = kd_models
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    teachers = _two_teachers(kd_models, pair_task, teacher_dir, tmp_path)
    sections = {"kd": {"epochs": None, "confidence": True}, "transfer": {"keep_labels": True},
                "train": {"max_steps": 4, "save_every": 2}}

    def recipe(out):
        return kd_recipe(task_file, teachers, student, out, **sections)

    run_kd(recipe(tmp_path / "straight"))
    metrics = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    assert [row["weight"] for row in metrics["teachers"]] == [0.25, 0.75] and metrics["confidence"]
    assert len(metrics["teachers_test"]) == 2 and metrics["teacher"] in metrics["teachers_test"]
    assert "teachers" in (tmp_path / "straight" / "report.md").read_text()
    logged = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(row["soft"]) for row in logged if "soft" in row)
    run_kd(recipe(tmp_path / "resumed"), stop_after=2)
    run_kd(recipe(tmp_path / "resumed"), resume=True)
    final = {name: load_file(str(tmp_path / name / "checkpoints" / "step-0000004" / "trainable.safetensors"))
             for name in ("straight", "resumed")}
    assert final["straight"].keys() == final["resumed"].keys()
    for key, value in final["straight"].items():
        assert torch.equal(value, final["resumed"][key]), key


def test_pre_flight_refuses_a_teacher_of_another_label_set(kd_models, pair_task, teacher_dir, tmp_path):
    from kd_fixtures import write_token_task

    _, student = kd_models
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    ner = get_task(str(write_token_task(tmp_path / "ner")))
    wrong = save_teacher(teacher_dir, ner, tmp_path / "ner-teacher")
    both = [{"name_or_path": str(kd_models[0])}, {"name_or_path": str(wrong)}]
    with pytest.raises(BiodistilError, match=r"teachers\[1\].*labels"):
        run_kd(kd_recipe(task_file, both, student, tmp_path / "run"))
    raw = kd_recipe(task_file, both, student, tmp_path / "run").model_dump(mode="json")
    with pytest.raises(ValueError, match="not both"):
        KDRecipe.model_validate({**raw, "teacher": {"name_or_path": str(kd_models[0])}})
    with pytest.raises(ValueError, match=r"kd\.confidence"):
        KDRecipe.model_validate({**raw, "teachers": None, "teacher": {"name_or_path": str(kd_models[0])},
                                 "kd": {**raw["kd"], "confidence": True}})
    with pytest.raises(ValueError, match=r"kd\.patient"):
        KDRecipe.model_validate({**raw, "kd": {**raw["kd"], "patient": {}}})


def test_the_ensemble_of_one_teacher_is_that_teacher_and_of_two_their_mixture(kd_models, pair_task, teacher_dir,
                                                                              tmp_path):
    from biodistil.methods.several_teachers import ensemble_test_scores
    from biodistil.teachers.task_cache import TeacherRequest, cached_teacher_outputs, teacher_test_scores

    first, _ = kd_models
    second = save_teacher(teacher_dir, pair_task, tmp_path / "second", seed=5)
    test = pair_task.load_split("test")
    rows = [cached_teacher_outputs(path, test, TeacherRequest(pair_task), tmp_path / "cache")
            for path in (first, second)]
    gold = [pair_task.label_to_id[e.label] for e in test]
    alone = ensemble_test_scores([first], [1.0], pair_task, test, tmp_path / "cache")
    own = [int(rows[0].logits[rows[0].by_example[i]].argmax()) for i in range(len(test))]
    assert alone["accuracy"] == pytest.approx(sum(p == y for p, y in zip(own, gold, strict=True)) / len(test))
    # the teacher scored by its own forward pass (other batches, other padding: a random head's near-tied
    # probabilities may flip on rounding, so within one example)
    direct = teacher_test_scores(str(first), pair_task, test, tmp_path / "cache")
    assert abs(alone["accuracy"] - direct["accuracy"]) <= 1 / len(test) + 1e-9
    both = ensemble_test_scores([first, second], [1.0, 3.0], pair_task, test, tmp_path / "cache")
    mixed = [0.25 * torch.softmax(torch.tensor(rows[0].logits[rows[0].by_example[i]]), -1).double()
             + 0.75 * torch.softmax(torch.tensor(rows[1].logits[rows[1].by_example[i]]), -1).double()
             for i in range(len(test))]  # float32 probabilities mixed in float64, as the ensemble mixes them
    accuracy = sum(int(p.argmax()) == y for p, y in zip(mixed, gold, strict=True)) / len(test)
    assert both["accuracy"] == pytest.approx(accuracy), "argmax of 0.25·p_1 + 0.75·p_2, worked out here"


@pytest.mark.slow
def test_a_study_fine_tunes_more_teachers_and_its_arms_name_them(kd_models, pair_task, teacher_dir, tmp_path):
    import yaml

    from biodistil.config import validate_recipe
    from biodistil.kd.recipe import StudyRecipe
    from biodistil.kd.study import run_study

    _, student = kd_models
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    quiet = {"batch_size": 8, "progress_bar": False, "tensorboard": False, "eval_every": 0, "save_every": 0}
    raw = {"run": {"output_dir": str(tmp_path / "study")}, "seeds": [1], "resamples": 200, "student": str(student),
           "teacher_init": str(teacher_dir),
           "tasks": [{"name": task_file, "more_teachers": {"other": {"teacher_init": str(teacher_dir),
                                                                     "teacher_overrides": {"run": {"seed": 9}}}}}],
           "defaults": {"finetune": {"finetune": {"epochs": 1}, "train": quiet},
                        "kd": {"kd": {"epochs": 1}, "train": quiet}},
           "arms": [{"name": "kd-first"}, {"name": "kd-other", "overrides": {"teacher": {"name_or_path": "@other"}}},
                    {"name": "kd-both", "overrides": {"teachers": [{"name_or_path": "@teacher"},
                                                                   {"name_or_path": "@other", "weight": 2}]}}]}
    run_study(validate_recipe(StudyRecipe, raw))
    summary = json.loads((tmp_path / "study" / "summary.json").read_text())
    teachers = summary["teachers"]["tiny_qa"]
    assert set(teachers["more_teachers"]) == {"other"} and "accuracy" in teachers["ensemble"]["test"]
    assert teachers["ensemble"]["teachers"] == ["teacher", "other"]
    folder = tmp_path / "study" / "tiny_qa"
    configs = {arm: yaml.safe_load((folder / arm / "seed-1" / "config.yaml").read_text())
               for arm in ("kd-first", "kd-other", "kd-both")}
    assert configs["kd-first"]["teacher"]["name_or_path"] == str(folder / "teacher" / "model")
    assert configs["kd-other"]["teacher"]["name_or_path"] == str(folder / "teacher-other" / "model")
    assert [t["name_or_path"] for t in configs["kd-both"]["teachers"]] == [
        str(folder / "teacher" / "model"), str(folder / "teacher-other" / "model")]
    bad = {**raw, "arms": [{"name": "kd", "overrides": {"teacher": {"name_or_path": "@nobody"}}}],
           "run": {"output_dir": str(tmp_path / "bad")}}
    with pytest.raises(BiodistilError, match="@nobody"):
        run_study(validate_recipe(StudyRecipe, bad))


def test_a_teacher_runs_in_its_own_dtype_online_and_cached_apart(kd_models, pair_task, tmp_path):
    """`teachers[].dtype`: online the teacher's weights are bf16 (its outputs reach the losses as float32); cached, a
    bf16 teacher's outputs are an entry of their own beside the float32 one, and close to them."""
    from biodistil.kd.command import teacher_signal
    from biodistil.tasks.splits import read_split
    from biodistil.teachers.signal import CachedTeacher, OnlineTeacher
    from biodistil.teachers.task_cache import TeacherRequest, cached_teacher_outputs

    teacher, student = kd_models
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    recipe = kd_recipe(task_file, [{"name_or_path": str(teacher), "dtype": "bfloat16"},
                                   {"name_or_path": str(teacher)}], student, tmp_path / "run",
                       kd={"teacher_outputs": "online"})
    assert [entry.dtype for entry in recipe.teacher_entries()] == ["bfloat16", "float32"]
    examples = read_split(pair_task, "train", None)[:8]
    online = teacher_signal(recipe, str(teacher), pair_task, examples, [], 4, torch.device("cpu"), 0, torch.bfloat16)
    assert isinstance(online, OnlineTeacher) and next(online.model.parameters()).dtype == torch.bfloat16
    outputs = {dtype: cached_teacher_outputs(teacher, examples, TeacherRequest(pair_task, progress_bar=False,
                                                                              dtype=dtype), tmp_path / "store")
               for dtype in (torch.float32, torch.bfloat16)}
    assert outputs[torch.float32].folder != outputs[torch.bfloat16].folder, "one entry per dtype"
    full, half = (np.asarray(outputs[d].logits[: len(examples)], dtype=np.float32) for d in outputs)
    assert np.abs(full - half).max() < 0.05 * max(1.0, float(np.abs(full).max())), "bf16 rounding, not another model"
    assert np.abs(full - half).max() > 0, "the bf16 teacher really ran in bf16"
    cached_recipe = recipe.model_copy(update={"kd": recipe.kd.model_copy(update={"teacher_outputs": "cached"})})
    cached = teacher_signal(cached_recipe, str(teacher), pair_task, examples, [], 4, torch.device("cpu"), 1,
                            torch.bfloat16)
    assert isinstance(cached, CachedTeacher) and cached.slot == 1
