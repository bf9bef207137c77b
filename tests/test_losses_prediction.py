"""The soft cross-entropy of TinyBERT's output loss (losses/prediction.py), checked against hand-computed values."""

import math

import pytest
import torch

from biodistil.losses.prediction import soft_cross_entropy_loss


def test_soft_cross_entropy_by_hand() -> None:
    # row 1: p_T = (1/2, 1/2), p_S = (1/4, 3/4) → −½·ln ¼ − ½·ln ¾ = ½·ln(16/3)
    # row 2: p_T = (3/4, 1/4), p_S = (1/2, 1/2) → ln 2; mean over rows
    student = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    teacher = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    expected = (0.5 * math.log(16.0 / 3.0) + math.log(2.0)) / 2
    assert soft_cross_entropy_loss(student, teacher).item() == pytest.approx(expected, rel=1e-5)


def test_soft_cross_entropy_temperature_divides_logits_without_t_squared() -> None:
    # T = 2: teacher (0, 2·ln 3)/2 → p_T = (1/4, 3/4); student (0, 0) → −¼·ln ½ − ¾·ln ½ = ln 2
    student = torch.zeros(1, 2)
    teacher = torch.tensor([[0.0, 2 * math.log(3.0)]])
    assert soft_cross_entropy_loss(student, teacher, temperature=2.0).item() == pytest.approx(math.log(2.0), rel=1e-5)


def test_soft_cross_entropy_is_kl_plus_teacher_entropy_and_has_gradient() -> None:
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(5, 7, generator=generator, requires_grad=True)
    teacher = torch.randn(5, 7, generator=generator)
    p_t = teacher.softmax(-1)
    entropy = -(p_t * p_t.log()).sum(-1).mean()
    kl = (p_t * (p_t.log() - student.log_softmax(-1))).sum(-1).mean()
    loss = soft_cross_entropy_loss(student, teacher)
    assert loss.item() == pytest.approx((kl + entropy).item(), rel=1e-5)
    loss.backward()
    assert student.grad.abs().sum() > 0


def test_soft_cross_entropy_empty_and_shape_errors() -> None:
    empty = torch.zeros(0, 4, requires_grad=True)
    assert soft_cross_entropy_loss(empty, torch.zeros(0, 4)).item() == 0.0
    with pytest.raises(ValueError, match="student logits"):
        soft_cross_entropy_loss(torch.zeros(2, 3), torch.zeros(2, 4))
