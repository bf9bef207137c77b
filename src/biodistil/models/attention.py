"""Attention probabilities and Q/K/V of chosen layers while the model itself runs a fast attention kernel.

SDPA and FlashAttention never materialise the [B, H, L, L] probability matrix, so they cannot return it.
Instead of switching the whole model to the slow eager path, forward hooks on only the layers a loss inspects
record what those layers compute anyway during the normal forward pass (the query/key/value projections, and
for rotary families the rotation they receive; the family's `QKVReader`, `biodistil.models.qkv`); the hooks are
removed right after it. For those layers the probabilities are then recomputed as

    a = softmax(Q·Kᵀ/√d_head + P + M),  M = −∞ on padded key columns and, in a local (sliding-window) layer of
                                            window w, on keys j with |i − j| > w for query i; P the bias a family
                                            adds to every layer's scores (MPNet's relative-position bias, hooked
                                            where the encoder computes it), 0 for the others

which costs one extra Q·Kᵀ, softmax and [B, H, L, L] tensor per inspected layer; layers nobody inspects pay
nothing. The recomputed probabilities are those before attention dropout (identical to eager attention in
eval mode). TinyBERT's attention loss reads the unnormalised scores Q·Kᵀ/√d instead (`attention_scores`).
Q/K/V are handed to MiniLMv2's relation loss, which needs no probabilities at all.
"""

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from biodistil.models.families import family_of, layer_list, num_heads, score_bias_module
from biodistil.models.qkv import HeadQKV, Record


@contextmanager
def capture_qkv(model: PreTrainedModel, layers: Iterable[int]) -> Iterator[dict[int, Record]]:
    """Hook `layers` (1-based) for one forward pass; yields {layer: record}, filled during the forward pass.

    Turn a filled record into per-head Q, K, V with `read_qkv`. Hooks are removed on exit.
    """
    reader = family_of(model.config).qkv
    blocks = layer_list(model)
    captured: dict[int, Record] = {}
    handles = []
    try:
        for layer in sorted(set(layers)):
            handles.extend(reader.hook(blocks[layer - 1], captured.setdefault(layer, {})))
        bias = score_bias_module(model)
        if bias is not None and captured:
            handles.append(bias.register_forward_hook(_record_bias(list(captured.values()))))
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _record_bias(records: list[Record]):
    def hook(module, inputs, output):  # [L_q, L_k, H] -> [1, H, L_q, L_k], shared by every layer
        for record in records:
            record["bias"] = output.permute(2, 0, 1).unsqueeze(0)
    return hook


def score_bias(record: Record) -> torch.Tensor | None:
    """The bias the layer added to its attention scores, [1, H, L, L] (None: none)."""
    return record.get("bias")


def read_qkv(model: PreTrainedModel, record: Record) -> HeadQKV:
    """Per-head Q, K (after the family's position rotation, if any) and V [B, H, L, d] from a filled record."""
    return family_of(model.config).qkv.heads(record, num_heads(model.config))


def attention_scores(query: torch.Tensor, key: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Unnormalised attention scores s = Q_h·K_hᵀ/√d (+ the family's bias P) per head h, before any mask or softmax.

    `query`/`key` are per-head [B, H, L, d]; `bias` [1, H, L, L] or None. Returns float32 scores [B, H, L, L] (rows
    = queries). Entries in padded rows or columns, or outside a local window, are plain values that attention
    losses ignore.
    """
    scores = query.float() @ key.float().transpose(-1, -2) / math.sqrt(query.size(-1))
    return scores if bias is None else scores + bias.float()


def allowed_keys(mask: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """[B, 1, L, L] bool: key j is visible to query i when j is a real token and, with a window w, |i − j| ≤ w.

    `mask` [B, L] is True for real tokens.
    """
    allowed = mask.bool()[:, None, None, :]
    if window is None:
        return allowed
    positions = torch.arange(mask.size(1), device=mask.device)
    near = (positions[:, None] - positions[None, :]).abs() <= window
    return allowed & near[None, None]


def attention_probabilities(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor, window: int | None = None,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """a = softmax(Q_h·K_hᵀ/√d + P + M) per head h, M = −∞ where `allowed_keys(mask, window)` is False, P the
    family's score bias (`bias`, None: 0).

    `query`/`key` are per-head [B, H, L, d]; `mask` [B, L] is True for real tokens. Returns float32
    probabilities [B, H, L, L] (rows = queries). Padded query rows still hold a distribution over the real keys,
    as in the model's own attention; attention losses ignore them.
    """
    scores = attention_scores(query, key, bias)
    scores = scores.masked_fill(~allowed_keys(mask, window), torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)


def restrict_to_window(probabilities: torch.Tensor, window: int | None) -> torch.Tensor:
    """a'_ij = a_ij·[|i − j| ≤ w] / Σ_k a_ik·[|i − k| ≤ w]: the layer's attention as it would be with window w
    (softmax over the nearer keys only; the same as recomputing it with the narrower mask). None: unchanged."""
    if window is None:
        return probabilities
    length = probabilities.size(-1)
    positions = torch.arange(length, device=probabilities.device)
    near = ((positions[:, None] - positions[None, :]).abs() <= window).to(probabilities.dtype)
    kept = probabilities * near
    return kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny)
