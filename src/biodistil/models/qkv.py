"""Reading one layer's per-head queries, keys and values from a normal forward pass, the way its family computes them.

A `QKVReader` registers forward hooks on one transformer block (only on blocks a loss inspects) that record
what the block computes anyway, and afterwards turns the record into per-head tensors [B, H, L, d]:

* `SeparateProjections` (BERT, RoBERTa, DistilBERT, MobileBERT): three `nn.Linear` outputs Q, K, V [B, L, H·d],
  split into heads.
* `FusedRotaryProjection` (ModernBERT): the fused projection Wqkv [B, L, 3·H·d] = [Q | K | V], and the rotary
  (cos, sin) the block receives; the queries and keys are returned after the rotary embedding,
  q' = q·cos + rotate_half(q)·sin (RoFormer eq. 34, the form Hugging Face computes), so that Q'·K'ᵀ/√d is the
  block's own attention score.

Only the hooked outputs are kept; nothing is recomputed except the rotation (elementwise, B·L·H·d).
"""

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from biodistil.errors import BiodistilError

Record = dict[str, Any]  # what the hooks of one block recorded during one forward pass
HeadQKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # per-head Q, K, V, each [B, H, L, d]


def submodule(root: nn.Module, path: str) -> nn.Module:
    module = root
    for name in path.split("."):
        module = getattr(module, name)
    return module


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, L, H·d] → [B, H, L, d]."""
    batch, length, width = x.shape
    if width % num_heads:
        raise ValueError(f"projection width {width} is not a multiple of {num_heads} heads")
    return x.view(batch, length, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, L, d] → [B, L, H·d] (heads concatenated, as a projection returns them)."""
    batch, heads, length, head = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x₁, x₂) → (−x₂, x₁) on the two halves of the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x' = x·cos + rotate_half(x)·sin in float32, for x [B, H, L, d] and cos/sin [B or 1, L, d]."""
    return x.float() * cos[:, None].float() + rotate_half(x.float()) * sin[:, None].float()


class QKVReader(Protocol):
    """How one family's per-head Q, K, V are read from a block during a normal forward pass."""

    def modules(self, block: nn.Module) -> tuple[nn.Module, ...]:
        """The modules that carry hooks (so callers can check that none is left behind)."""
        ...

    def hook(self, block: nn.Module, record: Record) -> list[RemovableHandle]:
        """Register hooks that fill `record` during the next forward pass; the caller removes them."""
        ...

    def heads(self, record: Record, num_heads: int) -> HeadQKV:
        """Per-head Q, K (after any position rotation) and V, each [B, H, L, d]."""
        ...

    def widths(self, block: nn.Module) -> tuple[int, int, int]:
        """The widths H·d of Q, K and V concatenated over heads."""
        ...


def _record_output(record: Record, name: str):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        record[name] = output

    return hook


@dataclass(frozen=True)
class SeparateProjections:
    """Q, K and V from three `nn.Linear` modules (paths relative to one transformer block)."""

    paths: tuple[str, str, str] = ("attention.self.query", "attention.self.key", "attention.self.value")

    def modules(self, block: nn.Module) -> tuple[nn.Module, ...]:
        return tuple(submodule(block, path) for path in self.paths)

    def hook(self, block: nn.Module, record: Record) -> list[RemovableHandle]:
        return [module.register_forward_hook(_record_output(record, name))
                for name, module in zip("qkv", self.modules(block), strict=True)]

    def heads(self, record: Record, num_heads: int) -> HeadQKV:
        q, k, v = (split_heads(record[name], num_heads) for name in "qkv")
        return q, k, v

    def widths(self, block: nn.Module) -> tuple[int, int, int]:
        query, key, value = (int(module.out_features) for module in self.modules(block))
        return query, key, value


@dataclass(frozen=True)
class FusedRotaryProjection:
    """Q, K, V from one fused projection [Q | K | V], with the rotary embedding the attention module receives as
    its `position_embeddings=(cos, sin)` keyword (ModernBERT: `attn.Wqkv`, `attn`)."""

    attention: str = "attn"
    fused: str = "attn.Wqkv"

    def modules(self, block: nn.Module) -> tuple[nn.Module, ...]:
        return submodule(block, self.fused), submodule(block, self.attention)

    def hook(self, block: nn.Module, record: Record) -> list[RemovableHandle]:
        fused, attention = self.modules(block)

        def record_rotary(module: nn.Module, args: tuple, kwargs: dict) -> None:
            rotary = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)
            if rotary is None:
                raise BiodistilError(f"{type(module).__name__} was called without position_embeddings=(cos, sin); "
                                     "this transformers version passes ModernBERT's rotary embedding differently")
            record["cos"], record["sin"] = rotary

        return [fused.register_forward_hook(_record_output(record, "qkv")),
                attention.register_forward_pre_hook(record_rotary, with_kwargs=True)]

    def heads(self, record: Record, num_heads: int) -> HeadQKV:
        fused = record["qkv"]
        batch, length, width = fused.shape
        head = width // (3 * num_heads)
        query, key, value = fused.view(batch, length, 3, num_heads, head).unbind(dim=2)
        query, key, value = (x.transpose(1, 2) for x in (query, key, value))
        return apply_rotary(query, record["cos"], record["sin"]), apply_rotary(key, record["cos"], record["sin"]), value

    def widths(self, block: nn.Module) -> tuple[int, int, int]:
        width = int(submodule(block, self.fused).out_features) // 3
        return width, width, width
