"""Task-specific distillation losses on classifier outputs: logit rows [N, C] and [CLS] states [B, D].

Hinton's KD on classifier logits is `biodistil.losses.distillation.soft_kl_loss`, the loss of the `logit_kl`
term on both halves of the toolkit (`biodistil.methods.objective`).
"""

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

from biodistil.losses.distillation import masked_mean


def _check_same_shape(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> None:
    if student_logits.shape != teacher_logits.shape:
        shapes = f"{tuple(student_logits.shape)} != teacher {tuple(teacher_logits.shape)}"
        raise ValueError(f"student logits {shapes}")


def logit_mse_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    class_reduction: Literal["mean", "sum"] = "mean",
) -> torch.Tensor:
    """Logit regression over the N rows `mask` keeps, always averaged over rows; over the C classes:

    - class_reduction="mean": (1/(N·C)) Σ_rows Σ_classes (z_S − z_T)², the per-logit MSE;
    - class_reduction="sum": (1/N) Σ_rows ‖z_S − z_T‖², the squared norm summed over the classes — VE-KD's
      L′_MSE = (1/n) Σ_i ‖L′_t(i) − L′_s(i)‖² over token positions i and the vocabulary (its code:
      MSELoss(reduction="sum") divided by the number of rows). C times the per-logit mean.
    """
    _check_same_shape(student_logits, teacher_logits)
    squared = (student_logits.float() - teacher_logits.float()).pow(2)
    if class_reduction == "mean":
        per_row = squared.mean(-1)
    elif class_reduction == "sum":
        per_row = squared.sum(-1)
    else:
        raise ValueError(f"class_reduction must be 'mean' or 'sum', got {class_reduction!r}")
    return masked_mean(per_row, torch.ones_like(per_row, dtype=torch.bool) if mask is None else mask.bool())


def _positive_logit(logits: torch.Tensor, who: str) -> torch.Tensor:
    """[N] or [N, 1] → the positive-class logit z; [N, 2] → z = z_1 − z_0 (so σ(z) = softmax(z)[1])."""
    if logits.dim() == 1:
        return logits
    if logits.dim() == 2 and logits.size(1) == 1:
        return logits[:, 0]
    if logits.dim() == 2 and logits.size(1) == 2:
        return logits[:, 1] - logits[:, 0]
    raise ValueError(f"{who} logits must be [N], [N, 1] or [N, 2] for sigmoid KD, got {tuple(logits.shape)}")


def sigmoid_kd_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Label-free binary KD: BCE(q_T, q_S) = −mean_N [q_T·log q_S + (1 − q_T)·log(1 − q_S)], q = σ(z/T).

    z is the positive-class logit for [N] / [N, 1] logits and z_1 − z_0 for [N, 2] logits. No T² factor.
    """
    _check_same_shape(student_logits, teacher_logits)
    t = float(temperature)
    z_student = _positive_logit(student_logits, "student").float() / t
    q_teacher = torch.sigmoid(_positive_logit(teacher_logits, "teacher").float() / t)
    return F.binary_cross_entropy_with_logits(z_student, q_teacher)


def patient_kd_loss(
    student_cls_states: Sequence[torch.Tensor], teacher_cls_states: Sequence[torch.Tensor]
) -> torch.Tensor:
    """PatientKD Σ_i MSE(h_S,i / ‖h_S,i‖₂, h_T,i / ‖h_T,i‖₂) over mapped layer pairs of [CLS] vectors [B, D].

    The MSE is averaged over batch and dims, then summed over the layer pairs.
    """
    if len(student_cls_states) != len(teacher_cls_states) or not student_cls_states:
        raise ValueError(
            f"need the same non-zero number of student and teacher layers, got "
            f"{len(student_cls_states)} and {len(teacher_cls_states)}"
        )
    terms = []
    for i, (student, teacher) in enumerate(zip(student_cls_states, teacher_cls_states, strict=True)):
        if student.shape != teacher.shape:
            raise ValueError(
                f"layer pair {i}: student [CLS] {tuple(student.shape)} != teacher {tuple(teacher.shape)}; "
                "PatientKD needs equal widths (project the student first)"
            )
        student_unit = F.normalize(student.float(), p=2, dim=-1)
        teacher_unit = F.normalize(teacher.float(), p=2, dim=-1)
        terms.append(F.mse_loss(student_unit, teacher_unit))
    return torch.stack(terms).sum()
