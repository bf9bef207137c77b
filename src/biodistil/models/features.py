"""Asking a masked-LM model for exactly the tensors the active losses need.

Vocabulary logits are computed only at the requested positions: over a 30k vocabulary the MLM head at
every position is most of a small student's cost, and the MLM and soft-MLM losses only use some positions.
"""

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from biodistil.models.families import encoder_of, mlm_logits, num_layers


@dataclass
class FeatureRequest:
    """Which tensors a loss needs from one model."""

    hidden: set[int] = field(default_factory=set)  # hidden-state indices: 0 = embeddings, L or -1 = last layer
    logits: bool = False

    def merge(self, other: "FeatureRequest") -> "FeatureRequest":
        return FeatureRequest(self.hidden | other.hidden, self.logits or other.logits)


@dataclass
class Features:
    """What a forward pass returned: hidden states by (non-negative) index, logits at the chosen positions."""

    hidden: dict[int, torch.Tensor]
    logits: torch.Tensor | None  # [N, V], one row per True entry of the positions mask (row-major order)
    num_layers: int

    def hidden_at(self, index: int) -> torch.Tensor:
        return self.hidden[normalise_layer(index, self.num_layers)]


def normalise_layer(index: int, layers: int) -> int:
    """Hidden-state index in 0..layers (negative counts from the last layer, -1 = last)."""
    resolved = index + layers + 1 if index < 0 else index
    if not 0 <= resolved <= layers:
        raise IndexError(f"hidden-state index {index} is outside 0..{layers} (or -{layers + 1}..-1)")
    return resolved


def extract_features(
    model: PreTrainedModel, batch: dict[str, torch.Tensor], request: FeatureRequest, positions: torch.Tensor | None
) -> Features:
    """Run `model` once and return the requested hidden states and logits at `positions` ([B, L] bool)."""
    layers = num_layers(model.config)
    wanted = {normalise_layer(i, layers) for i in request.hidden}
    need_all = bool(wanted - {layers})
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if "token_type_ids" in batch:
        inputs["token_type_ids"] = batch["token_type_ids"]
    output = encoder_of(model)(**inputs, output_hidden_states=need_all, return_dict=True)
    last = output.last_hidden_state
    hidden = {i: output.hidden_states[i] for i in wanted} if need_all else {}
    if layers in wanted:
        hidden[layers] = last
    logits = None
    if request.logits:
        if positions is None:
            raise ValueError("logits requested without positions")
        logits = mlm_logits(model, last[positions])
    return Features(hidden=hidden, logits=logits, num_layers=layers)
