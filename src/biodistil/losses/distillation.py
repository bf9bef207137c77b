"""Token-level distillation losses for masked language models (DistilBERT, bio-lm distill + align)."""

import torch
import torch.nn.functional as F


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Masked-language-model cross-entropy, CE(labels, student) = mean over target positions of -log p(label).

    `logits` is [..., V] and `labels` the matching [...] ids, `ignore_index` where a position is no target.
    Returns 0 (with a graph) when no position is a target.
    """
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    flat_labels = labels.reshape(-1)
    if not bool((flat_labels != ignore_index).any()):
        return flat_logits.sum() * 0.0
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=ignore_index)


def soft_kl_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Temperature-scaled distillation loss T²·KL(softmax(z_T/T) ‖ softmax(z_S/T)) (Hinton et al., 2015).

    Logits are [N, V] rows already restricted to the positions that count; the KL is summed over the
    vocabulary and averaged over rows. The T² factor keeps gradient size independent of T.
    """
    if student_logits.numel() == 0:
        return student_logits.sum() * 0.0
    log_p_student, log_p_teacher = tempered_log_probs(student_logits, teacher_logits, temperature)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)
    return kl.mean() * temperature * temperature


def tempered_log_probs(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax(z_S/T), log softmax(z_T/T)) in float32, after checking the two shapes agree."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} != teacher {tuple(teacher_logits.shape)}")
    t = float(temperature)
    return F.log_softmax(student_logits.float() / t, dim=-1), F.log_softmax(teacher_logits.float() / t, dim=-1)


def cosine_embedding_loss(
    student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Hidden-state alignment 1 − cos(h_T, h_S), averaged over the positions where `mask` is True.

    Hidden states are [B, L, D] with equal D (project the student first when widths differ).
    """
    if student_hidden.shape != teacher_hidden.shape:
        raise ValueError(
            f"student hidden {tuple(student_hidden.shape)} != teacher {tuple(teacher_hidden.shape)}; "
            "project the student to the teacher's width first"
        )
    cos = F.cosine_similarity(student_hidden.float(), teacher_hidden.float(), dim=-1)
    return masked_mean(1.0 - cos, mask)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the entries where `mask` is True (0 with a graph when none is)."""
    weights = mask.to(values.dtype)
    count = weights.sum()
    if count == 0:
        return values.sum() * 0.0
    return (values * weights).sum() / count
