"""Losses across tokenizers: the student's and the teacher's tokens pooled to the units they share (words).

The alignment (`biodistil.data.token_alignment`) gives each side a membership matrix M [B, W, L] (M[u, i] = 1 when
token i belongs to unit u) and a pooling matrix P [B, W, L]: the mean over a unit's tokens, P[u, i] = M[u, i] / |u|
(or its first token); `unit_mask` [B, W] marks the units each text has. A unit's state is P·h; every loss then
compares the two sides unit by unit with the loss one tokenizer would use token by token (`biodistil.losses.layers`,
same reductions, same directions), so a word-level term reads like its token-level twin.

Vocabulary logits (masked-LM output) are compared at aligned rows, the first token of each whole-word-masked word on
each side (`biodistil.data.token_alignment.first_tokens`): `shared_vocab_kl_loss` over the strings both
vocabularies name (`biodistil.data.shared_vocabulary`), and `uld_loss`, which needs no shared string at all.

Conventions: student first, teacher second. As everywhere in `biodistil.losses`, nothing is detached: a teacher
given without gradient (a frozen or inference-mode teacher, a cache) stays without one and the gradient reaches the
student only; a teacher tensor that requires grad (MetaDistil's teacher update) receives its gradient too.
"""

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from biodistil.losses.distillation import cosine_embedding_loss
from biodistil.losses.layers import (
    Reduction,
    attention_kl_loss,
    attention_mse_loss,
    hidden_mse_loss,
    minilm_relations_loss,
)

# log-probabilities of key groups are floored here: a group without tokens (log 0) adds nothing instead of NaN
LOG_FLOOR = -1.0e4


# ------------------------------------------------------------------------------------------ pooling
def pool_to_words(states: torch.Tensor, pooling: torch.Tensor) -> torch.Tensor:
    """Unit states P·h: [B, L, D] token states and a [B, W, L] pooling matrix → [B, W, D] (a zero row for a unit
    without tokens). With the mean pooling matrix, h_u = (1/|u|)·Σ_{i ∈ u} h_i."""
    if states.dim() != 3 or pooling.dim() != 3 or pooling.shape[::2] != states.shape[:2]:
        raise ValueError(f"states must be [B, L, D] and pooling [B, W, L]; got {tuple(states.shape)} and "
                         f"{tuple(pooling.shape)}")
    return torch.bmm(pooling.to(states.dtype), states)


def pool_attention(attention: torch.Tensor, membership: torch.Tensor) -> torch.Tensor:
    """Word × word attention from token attention probabilities A [B, H, L, L] (rows = queries):

        Ā[u, v] = (1/|u|)·Σ_{i ∈ u} Σ_{j ∈ v} A[i, j],    a[u, v] = Ā[u, v] / Σ_{v'} Ā[u, v'],

    i.e. Ā = P·A·Mᵀ with P the mean pooling and M the 0/1 membership [B, W, L] (its nonzero pattern is read, so the
    mean pooling matrix may be passed). Keys are summed (the probability of attending to any token of v) and queries
    averaged, so Ā's rows stay sub-distributions; the mass on tokens of no unit (unshared words, padding) is then
    renormalised away. A unit without tokens gets a zero row. Probabilities only: scores Q·Kᵀ/√d do not add up.
    """
    if attention.dim() != 4 or membership.dim() != 3 or membership.shape[::2] != attention.shape[::2]:
        raise ValueError(f"attention must be [B, H, L, L] and membership [B, W, L]; got {tuple(attention.shape)} and "
                         f"{tuple(membership.shape)}")
    member = (membership != 0).to(attention.dtype)
    pooling = member / member.sum(-1, keepdim=True).clamp_min(1.0)
    pooled = pooling[:, None] @ attention @ member[:, None].transpose(-1, -2)  # [B, H, W, W]
    return pooled / pooled.sum(-1, keepdim=True).clamp_min(torch.finfo(pooled.dtype).tiny)


# ------------------------------------------------------------------------------------------ hidden states
def word_hidden_mse_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, student_pooling: torch.Tensor,
                         teacher_pooling: torch.Tensor, unit_mask: torch.Tensor) -> torch.Tensor:
    """Word-level hidden-state MSE: (1/(N·D))·Σ_units Σ_d (P_S·h_S − P_T·h_T)², over the N units of `unit_mask`.

    Hidden states [B, L_S, D] and [B, L_T, D] (project the student first when widths differ), poolings [B, W, L_side].
    """
    return hidden_mse_loss(pool_to_words(student_hidden, student_pooling),
                           pool_to_words(teacher_hidden, teacher_pooling), unit_mask)


def word_hidden_cosine_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, student_pooling: torch.Tensor,
                            teacher_pooling: torch.Tensor, unit_mask: torch.Tensor) -> torch.Tensor:
    """Word-level cosine loss (1/N)·Σ_units (1 − cos(P_S·h_S, P_T·h_T)) over the N units of `unit_mask`."""
    return cosine_embedding_loss(pool_to_words(student_hidden, student_pooling),
                                 pool_to_words(teacher_hidden, teacher_pooling), unit_mask)


# ------------------------------------------------------------------------------------------ attention, relations
def word_attention_kl_loss(
    student_attention: torch.Tensor, teacher_attention: torch.Tensor, student_membership: torch.Tensor,
    teacher_membership: torch.Tensor, unit_mask: torch.Tensor, reduction: Reduction = "mean",
) -> torch.Tensor:
    """KL(a_S ‖ a_T) = Σ_v a_S[u, v]·(log a_S[u, v] − log a_T[u, v]) per query unit u, on the word × word maps of
    `pool_attention`, averaged over heads and units ("mean") or summed over each text's units ("sum"), the reductions
    and the student-first direction of `attention_kl_loss`. Both models need the same number of heads."""
    return attention_kl_loss(pool_attention(student_attention, student_membership),
                             pool_attention(teacher_attention, teacher_membership), unit_mask, reduction)


def word_attention_mse_loss(
    student_attention: torch.Tensor, teacher_attention: torch.Tensor, student_membership: torch.Tensor,
    teacher_membership: torch.Tensor, unit_mask: torch.Tensor,
) -> torch.Tensor:
    """(1/H)·Σ_heads MSE(a_S, a_T) over the (query unit, key unit) pairs of the word × word maps of `pool_attention`
    (attention probabilities; TinyBERT's unnormalised scores cannot be pooled)."""
    return attention_mse_loss(pool_attention(student_attention, student_membership),
                              pool_attention(teacher_attention, teacher_membership), unit_mask)


def word_relations_loss(
    student_qkv: Mapping[str, torch.Tensor], teacher_qkv: Mapping[str, torch.Tensor], student_pooling: torch.Tensor,
    teacher_pooling: torch.Tensor, unit_mask: torch.Tensor, num_relation_heads: int,
    relations: Sequence[str] = ("q", "k", "v"),
) -> torch.Tensor:
    """MiniLMv2 relations on word-pooled vectors: Σ_r KL(R_T^r ‖ R_S^r) with R^r = softmax(x̄_h·x̄_hᵀ/√d_h) per
    relation head h over the units, x̄ = P·x the mean of each unit's Q (K, V) vectors [B, L, D_side] (widths may
    differ: A relation heads of D/A each), averaged over heads and query units (`minilm_relations_loss`)."""
    return minilm_relations_loss({r: pool_to_words(x, student_pooling) for r, x in student_qkv.items()},
                                 {r: pool_to_words(x, teacher_pooling) for r, x in teacher_qkv.items()},
                                 unit_mask, num_relation_heads, relations)


# ------------------------------------------------------------------------------------------ vocabulary logits
def grouped_log_probs(log_probs: torch.Tensor, groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """log p(g) = log Σ_{v: g(v) = g} p_v: [N, V] log-probabilities and each token's group [V] (0..G−1) → [N, G],
    computed as a log-sum-exp per group (exact where probabilities underflow); a group without tokens gets LOG_FLOOR."""
    index = groups.long().to(log_probs.device).expand_as(log_probs)
    empty = log_probs.new_full((log_probs.size(0), num_groups), float("-inf"))
    peak = empty.scatter_reduce(1, index, log_probs.detach(), "amax").clamp_min(LOG_FLOOR)
    sums = torch.zeros_like(peak).scatter_add(1, index, (log_probs - peak.gather(1, index)).exp())
    return (sums.clamp_min(torch.finfo(sums.dtype).tiny).log() + peak).clamp_min(LOG_FLOOR)


def shared_vocab_kl_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, student_keys: torch.Tensor,
    teacher_keys: torch.Tensor, num_keys: int, temperature: float = 1.0, tail: bool = False,
) -> torch.Tensor:
    """T²·KL(q_T ‖ q_S) over the strings both vocabularies name, averaged over the N aligned rows.

    Logits [N, V_S] and [N, V_T] (each side's row of the same masked word); `*_keys` [V] give each token's shared key
    (0..K−1, −1 for none: `biodistil.data.shared_vocabulary`). Each side's distribution p = softmax(z/T) is summed per
    key, p(k) = Σ_{v: key(v) = k} p_v, then
    - tail=False (default): renormalised over the shared keys, q(k) = p(k) / Σ_{k'} p(k'): the KL of the two models'
      predictions among the strings both can write, whatever mass each puts elsewhere;
    - tail=True: kept with one tail bucket per side, q(tail) = 1 − Σ_k p(k) (the mass on tokens the other vocabulary
      lacks, special tokens included), as the top-k KL's tail: K+1 buckets. Meaningful when both vocabularies have
      tokens of their own; a student whose vocabulary the teacher's covers has a tail of special tokens only.

        L = T²·(1/N)·Σ_rows Σ_k q_T(k)·(log q_T(k) − log q_S(k)).
    """
    if student_logits.size(0) != teacher_logits.size(0):
        raise ValueError(f"student rows {student_logits.size(0)} != teacher rows {teacher_logits.size(0)}")
    if student_logits.size(0) == 0:
        return student_logits.sum() * 0.0
    t = float(temperature)
    log_q_student = _key_log_probs(student_logits.float() / t, student_keys, num_keys, tail)
    log_q_teacher = _key_log_probs(teacher_logits.float() / t, teacher_keys, num_keys, tail)
    kl = (log_q_teacher.exp() * (log_q_teacher - log_q_student)).sum(-1)
    return kl.mean() * t * t


def _key_log_probs(tempered: torch.Tensor, keys: torch.Tensor, num_keys: int, tail: bool) -> torch.Tensor:
    """log q over the K keys (renormalised) or the K keys and the tail bucket (the last column)."""
    if keys.numel() != tempered.size(-1):
        raise ValueError(f"{keys.numel()} token keys for logit rows of {tempered.size(-1)} tokens")
    groups = torch.where(keys >= 0, keys, num_keys)
    grouped = grouped_log_probs(F.log_softmax(tempered, dim=-1), groups, num_keys + 1)
    if tail:
        return grouped
    shared = grouped[:, :num_keys]
    return shared - torch.logsumexp(shared, dim=-1, keepdim=True)


def uld_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Universal Logit Distillation (Boizard et al., 2024), which needs no shared token:

        L = (1/N)·Σ_rows Σ_{i=1}^{V} |p_S,(i) − p_T,(i)|,

    p = softmax(z/T) sorted in decreasing order (p_(1) ≥ p_(2) ≥ ...), the shorter vocabulary padded with zeros to
    V = max(V_S, V_T): the paper's closed form of the Wasserstein-1 distance between the two distributions under a
    uniform transport cost, comparing the shapes of the two predictions, not which token each names. Logits [N, V_S]
    and [N, V_T], aligned rows; no T² factor (the paper uses T = 1).
    """
    if student_logits.size(0) != teacher_logits.size(0):
        raise ValueError(f"student rows {student_logits.size(0)} != teacher rows {teacher_logits.size(0)}")
    if student_logits.size(0) == 0:
        return student_logits.sum() * 0.0
    width = max(student_logits.size(-1), teacher_logits.size(-1))
    student, teacher = (F.pad(F.softmax(z.float() / float(temperature), dim=-1).sort(dim=-1, descending=True).values,
                        (0, width - z.size(-1)))
                        for z in (student_logits, teacher_logits))
    return (student - teacher).abs().sum(-1).mean()
