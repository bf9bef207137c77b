"""Task-specific KD losses checked against hand-worked values."""

import math

import pytest
import torch

from biodistil.losses.task import logit_mse_loss, patient_kd_loss, sigmoid_kd_loss


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- logit MSE


def test_logit_mse_by_hand() -> None:
    # row 1: (1, 2) − (0, 0) → (1 + 4)/2 = 2.5; row 2: (1, 1) − (1, 3) → (0 + 4)/2 = 2; mean = 2.25
    student = torch.tensor([[1.0, 2.0], [1.0, 1.0]])
    teacher = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    assert logit_mse_loss(student, teacher).item() == pytest.approx(2.25)
    assert logit_mse_loss(student, teacher, mask=torch.tensor([True, False])).item() == pytest.approx(2.5)


def test_logit_mse_summed_over_classes_is_vekd_squared_norm_per_row() -> None:
    # VE-KD: (1/n)·Σ_i ‖z_T(i) − z_S(i)‖². Row 1: 1 + 4 = 5; row 2: 0 + 4 = 4; mean over rows = 4.5 (= C × 2.25)
    student = torch.tensor([[1.0, 2.0], [1.0, 1.0]])
    teacher = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    assert logit_mse_loss(student, teacher, class_reduction="sum").item() == pytest.approx(4.5)
    # token logits [B, L, C] with a mask: only row 1 counts → 5; the padded row's garbage never enters
    tokens_s = torch.tensor([[[1.0, 2.0], [100.0, -100.0]]])
    tokens_t = torch.zeros(1, 2, 2)
    keep = torch.tensor([[True, False]])
    assert logit_mse_loss(tokens_s, tokens_t, keep, class_reduction="sum").item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="class_reduction"):
        logit_mse_loss(student, teacher, class_reduction="max")  # type: ignore[arg-type]


def test_logit_mse_of_no_rows_is_zero_with_a_graph() -> None:
    student = torch.zeros(0, 3, requires_grad=True)
    loss = logit_mse_loss(student, torch.zeros(0, 3), class_reduction="sum")
    loss.backward()
    assert loss.item() == 0.0 and student.grad is not None


# ---------------------------------------------------------------- sigmoid KD


def _bce_by_hand(student_z: list[float], teacher_z: list[float], temperature: float) -> float:
    total = 0.0
    for zs, zt in zip(student_z, teacher_z, strict=True):
        q_s, q_t = _sigmoid(zs / temperature), _sigmoid(zt / temperature)
        total += -(q_t * math.log(q_s) + (1.0 - q_t) * math.log(1.0 - q_s))
    return total / len(student_z)


def test_sigmoid_kd_equals_bce_by_hand() -> None:
    # T = 2: q_T = (σ(1), σ(−1)), q_S = (σ(0), σ(1))
    student, teacher = [0.0, 2.0], [2.0, -2.0]
    expected = _bce_by_hand(student, teacher, 2.0)
    # spelled out for the first row: −(σ(1)·ln .5 + σ(−1)·ln .5) = ln 2
    assert _bce_by_hand(student[:1], teacher[:1], 2.0) == pytest.approx(math.log(2.0))
    got = sigmoid_kd_loss(torch.tensor(student), torch.tensor(teacher), temperature=2.0)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    got_column = sigmoid_kd_loss(torch.tensor(student)[:, None], torch.tensor(teacher)[:, None], 2.0)
    assert got_column.item() == pytest.approx(expected, rel=1e-5)


def test_sigmoid_kd_two_class_logits_use_the_difference() -> None:
    # [N, 2] logits, z = z_1 − z_0: student (0.5 − 0.5, 3 − 1) = (0, 2); teacher (2.5 − 0.5, −1 − 1) = (2, −2)
    student = torch.tensor([[0.5, 0.5], [1.0, 3.0]])
    teacher = torch.tensor([[0.5, 2.5], [1.0, -1.0]])
    got = sigmoid_kd_loss(student, teacher, temperature=2.0)
    assert got.item() == pytest.approx(_bce_by_hand([0.0, 2.0], [2.0, -2.0], 2.0), rel=1e-5)


def test_sigmoid_kd_is_stable_for_large_logits_and_rejects_other_shapes() -> None:
    student = torch.tensor([200.0, -200.0], requires_grad=True)
    loss = sigmoid_kd_loss(student, torch.tensor([-200.0, 200.0]), temperature=1.0)
    loss.backward()
    # each row: q_T ≈ 0 (or 1), q_S ≈ 1 (or 0) → BCE ≈ 200
    assert torch.isfinite(loss) and loss.item() == pytest.approx(200.0, rel=1e-4)
    assert torch.isfinite(student.grad).all()
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        sigmoid_kd_loss(torch.zeros(2, 3), torch.zeros(2, 3), 1.0)


# ---------------------------------------------------------------- PatientKD


def test_patient_kd_by_hand() -> None:
    # layer 1: (3, 4)/5 = (.6, .8) vs (1, 0) → ((.4)² + (.8)²)/2 = .4
    # layer 2: (0, 2)/2 = (0, 1) vs (5, 0)/5 = (1, 0) → (1 + 1)/2 = 1; sum over layers = 1.4
    student = [torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 2.0]])]
    teacher = [torch.tensor([[1.0, 0.0]]), torch.tensor([[5.0, 0.0]])]
    assert patient_kd_loss(student, teacher).item() == pytest.approx(1.4, rel=1e-5)


def test_patient_kd_averages_over_the_batch() -> None:
    # row 1 as layer 1 above (.4); row 2 identical directions (2, 0) vs (1, 0) → 0; mean = .2
    student = [torch.tensor([[3.0, 4.0], [2.0, 0.0]])]
    teacher = [torch.tensor([[1.0, 0.0], [1.0, 0.0]])]
    assert patient_kd_loss(student, teacher).item() == pytest.approx(0.2, rel=1e-5)


def test_patient_kd_rejects_mismatches() -> None:
    with pytest.raises(ValueError, match="equal widths"):
        patient_kd_loss([torch.zeros(2, 3)], [torch.zeros(2, 4)])
    with pytest.raises(ValueError, match="same non-zero number"):
        patient_kd_loss([torch.zeros(2, 3)], [torch.zeros(2, 3), torch.zeros(2, 3)])
    with pytest.raises(ValueError, match="same non-zero number"):
        patient_kd_loss([], [])
