"""Prediction-layer losses on vocabulary logits (TinyBERT's output loss)."""

import torch

from biodistil.losses.distillation import tempered_log_probs


def soft_cross_entropy_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """TinyBERT prediction loss −(1/N) Σ_rows Σ_vocab softmax(z_T/T) · log softmax(z_S/T).

    Logits are [N, V] rows already restricted to the positions that count. Unlike `soft_kl_loss` this keeps
    the teacher's entropy (it differs from the KL by a constant in the student) and has no T² factor,
    as in TinyBERT. Returns 0 (with a graph) for no rows.
    """
    if student_logits.numel() == 0:
        return student_logits.sum() * 0.0
    log_p_student, log_p_teacher = tempered_log_probs(student_logits, teacher_logits, temperature)
    return -(log_p_teacher.exp() * log_p_student).sum(-1).mean()
