"""Several teachers as one: the weighted mixture of their predictions, expressed as logits any soft term reads, and
the per-example weights of confidence weighting.

With teachers k = 1..K, weights λ_k (Σ λ_k = 1) and, optionally, per example x (per word of a token task):

    w_k(x) = λ_k·c_k(x) / Σ_j λ_j·c_j(x),   c_k(x) = p_k(y | x) where x has a gold label y, else exp(−H(p_k(·|x)))

(p_k at temperature 1; for multi-label tasks the geometric mean over labels of p_k(y_l | x), and exp(−mean binary
entropy)). The mixture of the soft term's distributions is then given as logits z_mix, so that the term computed on
z_mix is the term on the mixture:

    softmax:  z_mix = T·log Σ_k w_k·softmax(z_k/T)              (softmax(z_mix/T) = Σ_k w_k·softmax(z_k/T))
    sigmoid:  z_mix = T·logit(Σ_k w_k·σ(z_k/T)) per logit      (binary KD of the positive class; per label)
    logits:   z_mix = Σ_k w_k·z_k                               (logit regression: the weighted mean of the logits)
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from biodistil.losses.distillation import PROBABILITY_FLOOR, Linear, rows_shape, scaled_chunk, teacher_probs

Space = Literal["softmax", "sigmoid", "logits"]
_TINY = PROBABILITY_FLOOR


@dataclass(frozen=True)
class MixedRows:
    """K teachers' logit rows [N, V] as their softmax-space mixture at temperature T, formed on demand: a chunk of rows
    at a time inside a fused KL (`scaled_rows`: log Σ_k w_k·softmax(z_k/T) = z_mix/T, a `RowSource`; `parts`: the
    chunk unmixed, for a compiled row kernel that mixes it in its own pass), or whole (`logits`: z_mix), so that
    neither the mixture nor a teacher's [N, V] logits need exist whole. Each teacher's rows are a tensor or its head's
    `Linear` (x, W, b); `weights` [K] or [K, N]."""

    sources: tuple[torch.Tensor | Linear, ...]
    weights: torch.Tensor
    temperature: float

    @property
    def shape(self) -> tuple[int, int]:
        return rows_shape(self.sources[0])

    def scaled_rows(self, rows: slice, temperature: float) -> torch.Tensor:
        """z_mix/T = log Σ_k w_k·softmax(z_k/T) for a chunk of rows, float32 (the mixture a row kernel forms from
        `parts`)."""
        return teacher_probs(*self.parts(rows, temperature))[0]

    def parts(self, rows: slice, temperature: float) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """A chunk of rows unmixed, for a row kernel that mixes them itself (`RowSource`): each teacher's z_k/T and
        log w_k ([K, 1, 1] or [K, rows, 1]; weights floored at 1e-12 as the mixture is)."""
        if float(temperature) != float(self.temperature):
            raise ValueError(f"a mixture formed at temperature {self.temperature} read at {temperature}")
        shares = self.weights[:, None, None] if self.weights.dim() == 1 else self.weights[:, rows, None]
        return (tuple(scaled_chunk(source, rows, temperature) for source in self.sources),
                shares.float().clamp_min(_TINY).log())

    def logits(self) -> torch.Tensor:
        """z_mix [N, V] = T·log Σ_k w_k·softmax(z_k/T)."""
        return self.scaled_rows(slice(None), self.temperature).mul_(self.temperature)

    def select(self, rows: torch.Tensor) -> "MixedRows":
        """These rows at `rows` (a bool mask or indices of the N rows)."""
        sources = tuple((source[0][rows], source[1], source[2]) if isinstance(source, tuple) else source[rows]
                        for source in self.sources)
        return MixedRows(sources, self.weights if self.weights.dim() == 1 else self.weights[:, rows],
                         self.temperature)


def mixed_teacher_logits(logits: Sequence[torch.Tensor], weights: torch.Tensor, space: Space,
                         temperature: float = 1.0, binary_pair: bool = False) -> torch.Tensor:
    """z_mix [N, C] of K teachers' logits [N, C]; `weights` [K] or [K, N] (summing to 1 over K). `binary_pair`: two
    logits whose difference z_1 − z_0 is the positive logit (sigmoid space): z_mix = [0, T·logit(q_mix)]."""
    t = float(temperature)
    if space == "softmax":  # one teacher's probabilities at a time, summed in place (no [K, N, C] stack)
        return MixedRows(tuple(logits), weights.float().to(logits[0].device), t).logits()
    stacked = torch.stack([z.float() for z in logits])  # [K, N, C]
    w = _per_row(weights.float().to(stacked.device), stacked)
    if space == "logits":
        return (w * stacked).sum(0)
    if space == "sigmoid":
        positive = stacked[..., 1:] - stacked[..., :1] if binary_pair else stacked
        q = (w * torch.sigmoid(positive / t)).sum(0).clamp(_TINY, 1 - _TINY)
        z = t * torch.logit(q)
        return torch.cat([torch.zeros_like(z), z], dim=-1) if binary_pair else z
    raise ValueError(f"space must be softmax, sigmoid or logits, not {space!r}")


def confidence_weights(logits: Sequence[torch.Tensor], prior: torch.Tensor, labels: torch.Tensor | None = None,
                       multi_label: bool = False) -> torch.Tensor:
    """w_k(x) [K, N] (module docstring): each teacher's prior λ_k [K] times its confidence on row x, normalised over
    the teachers. `labels`: [N] class ids (−100: no gold label) or, `multi_label`, [N, C] 0/1 vectors."""
    confidence = torch.stack([_confidence(z.float(), labels, multi_label) for z in logits])  # [K, N]
    weighted = prior.float().to(confidence.device)[:, None] * confidence
    return weighted / weighted.sum(0, keepdim=True).clamp_min(_TINY)


def _confidence(logits: torch.Tensor, labels: torch.Tensor | None, multi_label: bool) -> torch.Tensor:
    """c(x) [N]: p(y | x) at a gold label, exp(−H(p(·|x))) elsewhere (per label, geometric means: multi-label)."""
    if multi_label:
        log_p, log_not = F.logsigmoid(logits), F.logsigmoid(-logits)
        entropy = -(log_p.exp() * log_p + log_not.exp() * log_not).mean(-1)
        unsure = (-entropy).exp()
        if labels is None:
            return unsure
        gold = (labels.float() * log_p + (1 - labels.float()) * log_not).mean(-1).exp()
        return gold
    log_p = F.log_softmax(logits, dim=-1)
    unsure = (log_p.exp() * log_p).sum(-1).exp()  # exp(−H)
    if labels is None:
        return unsure
    labelled = labels != -100
    gold = log_p.gather(-1, labels.clamp_min(0).long()[:, None]).squeeze(-1).exp()
    return torch.where(labelled, gold, unsure)


def _per_row(weights: torch.Tensor, stacked: torch.Tensor) -> torch.Tensor:
    """Weights broadcast against [K, N, C]: [K] → [K, 1, 1], [K, N] → [K, N, 1]."""
    if weights.dim() == 1:
        return weights[:, None, None]
    return weights[..., None]
