"""Attention probabilities and Q/K/V of chosen layers while the model itself runs a fast attention kernel.

SDPA and FlashAttention never materialise the [B, H, L, L] probability matrix, so they cannot return it.
Instead of switching the whole model to the slow eager path, forward hooks on the query/key/value
projections (`nn.Linear`) of only the layers a loss inspects record their outputs during the normal forward
pass; the hooks are removed right after it. For those layers the probabilities are then recomputed as

    a = softmax(Q·Kᵀ/√d_head + padding mask)

which costs one extra Q·Kᵀ, softmax and [B, H, L, L] tensor per inspected layer; layers nobody inspects pay
nothing. The recomputed probabilities are those before attention dropout (identical to eager attention in
eval mode). TinyBERT's attention loss reads the unnormalised scores Q·Kᵀ/√d instead (`attention_scores`).
Q/K/V are handed unchanged to MiniLMv2's relation loss, which needs no probabilities at all.
"""

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.models.families import qkv_modules

QKV = ("q", "k", "v")


@contextmanager
def capture_qkv(model: PreTrainedModel, layers: Iterable[int]) -> Iterator[dict[int, dict[str, torch.Tensor]]]:
    """Record the query/key/value projection outputs ([B, L, H·d]) of `layers` (1-based) during one forward.

    Yields a dict filled during the forward pass: {layer: {"q": Q, "k": K, "v": V}}. Hooks are removed on exit.
    """
    captured: dict[int, dict[str, torch.Tensor]] = {}
    handles = []
    try:
        for layer in sorted(set(layers)):
            slot = captured.setdefault(layer, {})
            for name, module in zip(QKV, qkv_modules(model, layer), strict=True):
                handles.append(module.register_forward_hook(_recorder(slot, name)))
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _recorder(slot: dict[str, torch.Tensor], name: str):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        slot[name] = output

    return hook


def attention_scores(query: torch.Tensor, key: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Unnormalised attention scores s = Q_h·K_hᵀ/√d per head h, before any padding mask or softmax.

    `query`/`key` are concatenated-head projections [B, L, H·d]. Returns float32 scores [B, H, L, L]
    (rows = queries). Entries in padded rows or columns are plain Q·Kᵀ/√d values that attention losses ignore.
    """
    batch, length, width = query.shape
    if width % num_heads:
        raise ValueError(f"projection width {width} is not a multiple of {num_heads} heads")
    head = width // num_heads
    q = query.float().view(batch, length, num_heads, head).transpose(1, 2)
    k = key.float().view(batch, key.size(1), num_heads, head).transpose(1, 2)
    return q @ k.transpose(-1, -2) / math.sqrt(head)


def attention_probabilities(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor, num_heads: int
) -> torch.Tensor:
    """a = softmax(Q_h·K_hᵀ/√d + M) per head h, with M = −∞ on padded key columns.

    `query`/`key` are concatenated-head projections [B, L, H·d]; `mask` [B, L] is True for real tokens.
    Returns float32 probabilities [B, H, L, L] (rows = queries). Padded query rows still hold a distribution
    over the real keys, as in the model's own attention; attention losses ignore them.
    """
    scores = attention_scores(query, key, num_heads)
    scores = scores.masked_fill(~mask.bool()[:, None, None, :], torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)
