"""Dropout for training on a CPU: the same inverted dropout, its mask drawn from a cheaper random source.

PyTorch's CPU dropout draws one Bernoulli sample per element (8 ns each on the machines here): in the demo's 3 × 384
student its eleven dropouts were a quarter of a training step. `fast_dropout` takes 63 random bits per 64-bit word of
the default generator (`Tensor.random_`) and reads four 15-bit uniform fields from each word: an element is dropped
where its field is below t = round(p · 2^15), and kept elements are scaled by 2^15 / (2^15 − t), so the expected output
equals the input. The drop rate is p' = t / 2^15 (0.100006 for p = 0.1). The default generator is the source, so a
seeded run repeats itself and a resumed run (whose checkpoint holds the generator's state) replays its masks.

`train.dropout: fast` swaps every `nn.Dropout` module of a model trained on the CPU for `FastDropout` (a subclass: same
`p`, nothing in the state dict changes); the attention-probability dropout that a model hands to
`scaled_dot_product_attention` as a number stays PyTorch's. `train.dropout: torch`, the default, keeps PyTorch's
everywhere: other masks give other seeded results (docs/methods.md, Throughput, has the speed and an A/B).
"""

from __future__ import annotations

import torch
from torch import nn

FIELD_BITS = 15
FIELDS_PER_WORD = 4  # a 64-bit word seen as four 16-bit fields; the top bit of each is masked off


def drop_threshold(p: float) -> int:
    """t: a field below it drops its element (drop rate t / 2^15)."""
    return round(p * 2**FIELD_BITS)


def keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """A boolean mask of `shape`, True (keep) with probability 1 − t / 2^15, from the default generator."""
    numel = shape.numel()
    words = torch.empty(-(-numel // FIELDS_PER_WORD), dtype=torch.int64).random_()  # uniform on [0, 2^63)
    fields = words.view(torch.int16)[:numel].view(shape) & (2**FIELD_BITS - 1)
    return fields >= drop_threshold(p)


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout of `x` at rate p' = round(p · 2^15) / 2^15: y = x · m · 2^15 / (2^15 − t), m ~ keep_mask."""
    threshold = drop_threshold(p)
    if threshold >= 2**FIELD_BITS:
        return x * 0.0
    # x · m · scale in one kernel, the scale kept in double: the op PyTorch's own dropout uses for its backward, whose
    # backward is the same op (a product with the mask scaled in bf16 would round the scale: a 0.16% bias)
    return torch.ops.aten.native_dropout_backward(x, keep_mask(x.shape, p),
                                                  2**FIELD_BITS / (2**FIELD_BITS - threshold))


class FastDropout(nn.Dropout):
    """`nn.Dropout` whose CPU training mask comes from `keep_mask`; on other devices, in evaluation, at p = 0 and
    in place it is `nn.Dropout` itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or self.inplace or x.device.type != "cpu":
            return super().forward(x)
        return fast_dropout(x, self.p)


def use_fast_dropout(model: nn.Module) -> int:
    """Swap every `nn.Dropout` module of `model` for `FastDropout`, in place; returns how many were swapped."""
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = FastDropout
            swapped += 1
    return swapped
