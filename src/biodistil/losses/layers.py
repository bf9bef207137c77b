"""Task-agnostic layer losses: hidden states, attention maps, MiniLMv2 relations, VE-KD tolerance.

Shapes: hidden states [B, L, D]; attention maps [B, H, L, L] (probabilities, or for `attention_mse_loss`
also the unnormalised scores Q·Kᵀ/√d) with rows = queries and columns = keys; `mask` [B, L] bool, True for
real tokens. Padded query rows and padded key columns never contribute, so values stored at padded
positions do not change any loss here. The layer-wise cosine loss is `cosine_embedding_loss`
(`biodistil.losses.distillation`).
"""

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.nn.functional as F

from biodistil.losses.distillation import masked_mean

ATTENTION_EPS = 1e-12

Reduction = Literal["mean", "sum"]


def _check_same_shape(name: str, student: torch.Tensor, teacher: torch.Tensor) -> None:
    if student.shape != teacher.shape:
        raise ValueError(f"student {name} {tuple(student.shape)} != teacher {tuple(teacher.shape)}")


def _check_attention(student_attn: torch.Tensor, teacher_attn: torch.Tensor, mask: torch.Tensor) -> None:
    _check_same_shape("attention", student_attn, teacher_attn)
    if student_attn.dim() != 4 or mask.shape != (student_attn.size(0), student_attn.size(-1)):
        raise ValueError(
            f"attention must be [B, H, L, L] with mask [B, L]; got {tuple(student_attn.shape)} "
            f"and mask {tuple(mask.shape)}"
        )


def _row_mask(mask: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, L] token mask → [B, H, L] mask of real query rows."""
    return mask.bool()[:, None, :].expand(-1, num_heads, -1)


def _key_mask(mask: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """[B, L] token mask → [B, 1, 1, L] mask of real key columns (broadcasts over heads and rows); with a window w,
    [B, 1, L, L] that also drops the keys j with |i − j| > w from query row i."""
    keys = mask.bool()[:, None, None, :]
    if window is None:
        return keys
    positions = torch.arange(mask.size(1), device=mask.device)
    return keys & ((positions[:, None] - positions[None, :]).abs() <= window)[None, None]


def hidden_mse_loss(
    student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Hidden-state loss MSE(h_S, h_T) (TinyBERT after projection; MobileBERT's MSE(h_S^l, h_T^l)).

    Squared error averaged over the feature dim, then over the N real tokens:
    (1/(N·D)) Σ_tokens Σ_d (h_S − h_T)².
    Widths must match; project the student first when they differ.
    """
    _check_same_shape("hidden", student_hidden, teacher_hidden)
    per_token = (student_hidden.float() - teacher_hidden.float()).pow(2).mean(-1)
    return masked_mean(per_token, mask.bool())


def attention_mse_loss(
    student_attn: torch.Tensor, teacher_attn: torch.Tensor, mask: torch.Tensor, window: int | None = None
) -> torch.Tensor:
    """TinyBERT attention loss (1/H) Σ_heads MSE(a_S, a_T) over real (query, key) pairs.

    The squared error is averaged over heads and over every entry whose query row AND key column are
    real tokens; each head has the same number of such entries, so this is the mean over heads of the
    per-head MSE. `a` may be attention probabilities, or — as TinyBERT defines the loss — the unnormalised
    scores Q·Kᵀ/√d before the softmax (`biodistil.models.attention.attention_scores`); padded key columns
    are excluded either way, so no −∞ or masking constant ever enters the loss. With `window` w (local attention)
    only the pairs with |i − j| ≤ w count.
    """
    _check_attention(student_attn, teacher_attn, mask)
    pair_mask = _row_mask(mask, student_attn.size(1))[..., None] & _key_mask(mask, window)
    squared = (student_attn.float() - teacher_attn.float()).pow(2)
    return masked_mean(squared, pair_mask)


def attention_kl_loss(
    student_attn: torch.Tensor,
    teacher_attn: torch.Tensor,
    mask: torch.Tensor,
    reduction: Reduction = "mean",
    eps: float = ATTENTION_EPS,
    window: int | None = None,
) -> torch.Tensor:
    """Attention-distribution loss with KL(a_S ‖ a_T) = Σ_keys a_S · (log a_S − log a_T) per query row.

    Note the direction: student first (as in the CompactBioBERT / MobileBERT write-up), not the usual
    teacher-first KL. Probabilities are clamped to `eps` before the log; padded key columns are excluded, and with
    `window` w (local attention) so are the keys j with |i − j| > w.
    - reduction="mean": (1/(H·N)) Σ_heads Σ_tokens KL, averaged over heads and all real query rows
      of the batch (CompactBioBERT).
    - reduction="sum": (1/H) Σ_heads Σ_tokens KL, summed over the real query rows of each sequence,
      averaged over heads and over the batch (MobileBERT).
    """
    _check_attention(student_attn, teacher_attn, mask)
    p_student = student_attn.float()
    log_ratio = p_student.clamp_min(eps).log() - teacher_attn.float().clamp_min(eps).log()
    terms = torch.where(_key_mask(mask, window), p_student * log_ratio, torch.zeros_like(log_ratio))
    per_row = terms.sum(-1)  # [B, H, L]
    rows = _row_mask(mask, per_row.size(1))
    if reduction == "mean":
        return masked_mean(per_row, rows)
    if reduction == "sum":
        per_head = (per_row * rows.to(per_row.dtype)).sum(-1)  # [B, H]
        return per_head.mean()
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def _split_heads(x: torch.Tensor, num_heads: int, who: str) -> torch.Tensor:
    """[B, L, D] → [B, A, L, D/A]; D must be divisible by the number of relation heads A."""
    if x.dim() != 3:
        raise ValueError(f"{who} relation input must be [B, L, D], got {tuple(x.shape)}")
    batch, length, width = x.shape
    if num_heads < 1 or width % num_heads != 0:
        raise ValueError(f"{who} width {width} is not divisible by num_relation_heads={num_heads}")
    return x.float().view(batch, length, num_heads, width // num_heads).transpose(1, 2)


def _relation_log_probs(x: torch.Tensor, mask: torch.Tensor, num_heads: int, who: str) -> torch.Tensor:
    """log softmax(x_h · x_hᵀ / √d_h) over real keys: [B, L, D] → [B, A, L, L]."""
    heads = _split_heads(x, num_heads, who)
    scores = heads @ heads.transpose(-1, -2) / math.sqrt(heads.size(-1))
    scores = scores.masked_fill(~_key_mask(mask), torch.finfo(scores.dtype).min)
    return F.log_softmax(scores, dim=-1)


def minilm_relation_loss(
    student_x: torch.Tensor, teacher_x: torch.Tensor, mask: torch.Tensor, num_relation_heads: int
) -> torch.Tensor:
    """MiniLMv2 self-attention relation loss for one relation type (Q-Q, K-K or V-V).

    Inputs are concatenated-head vectors [B, L, D_S] and [B, L, D_T] (widths may differ). Each is split
    into A = `num_relation_heads` heads, R = softmax(x_h · x_hᵀ / √d_h) over real keys, and the loss is
    KL(R_T ‖ R_S) = Σ_keys R_T · (log R_T − log R_S), averaged over relation heads and real query rows.
    """
    if student_x.shape[:2] != teacher_x.shape[:2] or mask.shape != student_x.shape[:2]:
        raise ValueError(
            f"student {tuple(student_x.shape)}, teacher {tuple(teacher_x.shape)} "
            f"and mask {tuple(mask.shape)} must share [B, L]"
        )
    log_r_student = _relation_log_probs(student_x, mask, num_relation_heads, "student")
    log_r_teacher = _relation_log_probs(teacher_x, mask, num_relation_heads, "teacher")
    terms = log_r_teacher.exp() * (log_r_teacher - log_r_student)
    terms = torch.where(_key_mask(mask), terms, torch.zeros_like(terms))
    return masked_mean(terms.sum(-1), _row_mask(mask, num_relation_heads))


def minilm_relations_loss(
    student_qkv: Mapping[str, torch.Tensor],
    teacher_qkv: Mapping[str, torch.Tensor],
    mask: torch.Tensor,
    num_relation_heads: int,
    relations: Sequence[str] = ("q", "k", "v"),
) -> torch.Tensor:
    """MiniLMv2 loss Σ_{r ∈ relations} KL(R_T^r ‖ R_S^r): the Q-Q, K-K and V-V terms are summed, not averaged.

    `student_qkv` / `teacher_qkv` map a relation name ("q", "k", "v") to its [B, L, D] vectors.
    """
    if not relations:
        raise ValueError("relations must name at least one of 'q', 'k', 'v'")
    missing = [r for r in relations if r not in student_qkv or r not in teacher_qkv]
    if missing:
        raise ValueError(
            f"relation(s) {missing} missing: student has {sorted(student_qkv)}, "
            f"teacher has {sorted(teacher_qkv)}"
        )
    terms = [
        minilm_relation_loss(student_qkv[r], teacher_qkv[r], mask, num_relation_heads) for r in relations
    ]
    return torch.stack(terms).sum()


def tolerance_hinge(
    loss: torch.Tensor, weight: float | torch.Tensor = 1.0, epsilon: float | torch.Tensor = 0.0
) -> torch.Tensor:
    """VE-KD tolerance L' = max(W·L − ε, 0): zero (no gradient) below ε, W·L − ε with gradient above."""
    return torch.relu(weight * loss - epsilon)
