"""The kd loss as terms of the objective registry, checked against hand-worked values:
L = α·soft + β·CE + γ·PatientKD on classifier logits (per example, or per token with a mask)."""

import math

import pytest
import torch

from biodistil.data.batch import Batch
from biodistil.errors import BiodistilError
from biodistil.kd.objective import KDObjective, check_loss_fits_task, kd_terms
from biodistil.kd.recipe import KDOptions
from biodistil.models.features import classifier_features
from biodistil.tasks.registry import get_task

LN3 = math.log(3.0)
# teacher logits (ln 3, 0) → p_T = (3/4, 1/4); student logits (0, 0) → p_S = (1/2, 1/2)
# KL(p_T ‖ p_S) = 3/4·ln(3/4 / 1/2) + 1/4·ln(1/4 / 1/2) = .75·ln 1.5 + .25·ln .5
KL_BY_HAND = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
BIOASQ = get_task("bioasq")


def batch(labels=None, kd_mask=None) -> Batch:
    masks = {} if kd_mask is None else {"kd": kd_mask}
    return Batch({"attention_mask": torch.ones(1, 3, dtype=torch.long)}, labels, masks)


def features(logits, cls=None):
    return classifier_features(torch.tensor(logits), {1: torch.tensor(cls)} if cls is not None else {}, 1)


def test_recipe_options_become_terms_of_the_registry():
    terms = kd_terms(KDOptions(soft_loss="hinton", alpha=0.7, beta=0.3, patient={"gamma": 2.0}), [(1, 2)])
    assert [(t.name, t.cfg.loss, t.cfg.weight) for t in terms] == [
        ("soft", "logit_kl", 0.7), ("ce", "ce", 0.3), ("pkd", "patient_kd", 2.0)]
    assert terms[2].pairs == ((1, 2),)
    assert [t.cfg.loss for t in kd_terms(KDOptions(soft_loss="logit_mse"))] == ["logit_mse"]
    assert [t.cfg.loss for t in kd_terms(KDOptions(soft_loss="none", beta=1.0))] == ["ce"]


def test_hinton_by_hand_at_temperature_one_with_ce_and_patient_kd():
    objective = KDObjective(KDOptions(alpha=0.7, beta=0.3, temperature=1.0, patient={"gamma": 2.0}), BIOASQ,
                            [(1, 1)])
    # [CLS] states (1, 0) vs (0, 1) after normalisation: MSE = ((1−0)² + (0−1)²)/2 = 1; CE(label 0, p_S) = ln 2
    student = features([[0.0, 0.0]], cls=[[[3.0, 0.0]]])
    teacher = features([[LN3, 0.0]], cls=[[[0.0, 5.0]]])
    loss, logs = objective(student, teacher, batch(torch.tensor([0])))
    assert logs["soft"].item() == pytest.approx(KL_BY_HAND, rel=1e-5)
    assert logs["ce"].item() == pytest.approx(math.log(2.0), rel=1e-5)
    assert logs["pkd"].item() == pytest.approx(1.0, rel=1e-5)
    assert loss.item() == pytest.approx(0.7 * KL_BY_HAND + 0.3 * math.log(2.0) + 2.0, rel=1e-5)


def test_temperature_scales_the_logits_and_multiplies_by_t_squared():
    # at T = 2 the teacher logits (2·ln 3, 0) give the same p_T = (3/4, 1/4): soft = T²·KL = 4·KL_BY_HAND;
    # the CE ignores T: student (0, 0) with label 1 → ln 2
    objective = KDObjective(KDOptions(alpha=1.0, beta=1.0, temperature=2.0), BIOASQ)
    loss, logs = objective(features([[0.0, 0.0]]), features([[2.0 * LN3, 0.0]]), batch(torch.tensor([1])))
    assert logs["soft"].item() == pytest.approx(4.0 * KL_BY_HAND, rel=1e-5)
    assert loss.item() == pytest.approx(4.0 * KL_BY_HAND + math.log(2.0), rel=1e-5)


def test_label_free_batches_have_no_ce_term():
    objective = KDObjective(KDOptions(alpha=1.0, beta=0.0, temperature=1.0), BIOASQ)
    loss, logs = objective(features([[0.0, 0.0]]), features([[LN3, 0.0]]), batch())
    assert "ce" not in logs and loss.item() == pytest.approx(KL_BY_HAND, rel=1e-5)


def test_learned_weights_receive_gradients():
    # MetaAdaptiveKD learns α and β: ∂L/∂α = soft, ∂L/∂β = CE
    alpha = torch.tensor(0.5, requires_grad=True)
    beta = torch.tensor(0.5, requires_grad=True)
    logits = torch.zeros(1, 2, requires_grad=True)
    objective = KDObjective(KDOptions(alpha=0.5, beta=0.5, temperature=1.0), BIOASQ)
    student = classifier_features(logits, {}, 0)
    loss, _ = objective(student, features([[LN3, 0.0]]), batch(torch.tensor([0])), {"soft": alpha, "ce": beta})
    loss.backward()
    assert alpha.grad.item() == pytest.approx(KL_BY_HAND, rel=1e-5)
    assert beta.grad.item() == pytest.approx(math.log(2.0), rel=1e-5)
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_token_logits_count_kd_mask_positions_and_skip_unlabelled_ones():
    # 3 tokens; token 2 is padding (garbage logits, label −100, not in kd_mask); token 1 is in kd_mask but has
    # label −100 (a later sub-word: KD, no CE)
    task = get_task("ncbi_disease")
    student = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [50.0, -50.0, 0.0]]])
    teacher = torch.tensor([[[LN3, 0.0, 0.0], [LN3, 0.0, 0.0], [-50.0, 50.0, 0.0]]])
    objective = KDObjective(KDOptions(alpha=1.0, beta=1.0, temperature=1.0), task)
    _, logs = objective(classifier_features(student, {}, 0), classifier_features(teacher, {}, 0),
                        batch(torch.tensor([[0, -100, -100]]), kd_mask=torch.tensor([[1, 1, 0]])))
    # rows 0 and 1 alike: p_T = softmax(ln 3, 0, 0) = (3/5, 1/5, 1/5), p_S uniform → KL = Σ p_T·ln(3·p_T)
    p_teacher = [0.6, 0.2, 0.2]
    kl = sum(p * math.log(3 * p) for p in p_teacher)
    assert logs["soft"].item() == pytest.approx(kl, rel=1e-5)
    assert logs["ce"].item() == pytest.approx(math.log(3.0), rel=1e-5), "only token 0 has a label"


def test_sigmoid_soft_loss_is_binary_kd_on_the_logit_difference():
    objective = KDObjective(KDOptions(soft_loss="sigmoid", alpha=1.0, beta=0.0, temperature=2.0), BIOASQ)
    # z = z_1 − z_0: teacher 2 → q_T = σ(1); student 0 → q_S = 1/2; BCE = ln 2 whatever q_T
    loss, _ = objective(features([[0.0, 0.0]]), features([[0.0, 2.0]]), batch())
    assert loss.item() == pytest.approx(math.log(2.0), rel=1e-5)


def test_multi_label_ce_is_per_label_bce_and_sigmoid_is_per_label():
    hoc = get_task("hoc")
    objective = KDObjective(KDOptions(soft_loss="sigmoid", alpha=1.0, beta=1.0, temperature=1.0), hoc)
    zeros = [[0.0] * hoc.num_labels]
    labels = torch.tensor([[1.0] + [0.0] * (hoc.num_labels - 1)])
    loss, logs = objective(features(zeros), features(zeros), batch(labels))
    assert loss.item() == pytest.approx(2 * math.log(2.0), rel=1e-5)
    assert logs["ce"].item() == pytest.approx(math.log(2.0), rel=1e-5), "BCE of σ(0) = 1/2 is ln 2 per label"
    assert logs["soft"].item() == pytest.approx(math.log(2.0), rel=1e-5)
    assert objective.task_loss(features(zeros), batch(labels)).item() == pytest.approx(math.log(2.0), rel=1e-5)


def test_soft_losses_must_fit_the_task():
    with pytest.raises(BiodistilError, match="multi-label"):
        check_loss_fits_task(KDOptions(soft_loss="hinton"), get_task("hoc"))
    with pytest.raises(BiodistilError, match="binary"):
        check_loss_fits_task(KDOptions(soft_loss="sigmoid"), get_task("ncbi_disease"))
    check_loss_fits_task(KDOptions(soft_loss="sigmoid"), BIOASQ)
