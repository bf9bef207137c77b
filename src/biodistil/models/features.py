"""Asking a masked-LM model for exactly the tensors the active losses need.

Vocabulary logits are computed only at the requested positions: over a 30k vocabulary the MLM head at
every position is most of a small student's cost, and the MLM and soft-MLM losses only use some positions. They come
back as the MLM head up to its decoder, in a `LogitRows` (`biodistil.models.logits`), which forms them where a loss
asks for them.
Attention probabilities, unnormalised attention scores and Q/K/V come from hooks on the layers that are
inspected only (see `biodistil.models.attention`), so the model keeps its fast attention kernel everywhere.
The probabilities are each layer's own: a local (sliding-window) layer's are zero outside its window.
"""

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from biodistil.models.attention import attention_probabilities, attention_scores, capture_qkv, read_qkv, score_bias
from biodistil.models.families import attention_window, encoder_of, mlm_head, num_layers, takes_token_type_ids
from biodistil.models.logits import LogitRows
from biodistil.models.qkv import merge_heads


@dataclass
class FeatureRequest:
    """Which tensors a loss needs from one model.

    `hidden` uses hidden-state indices (0 = embeddings, L or -1 = last layer); `attentions` (probabilities),
    `attention_scores` (Q·Kᵀ/√d before the softmax) and `qkv` use transformer-layer indices 1..L (-1 = last):
    layer l is the block whose output is hidden state l.
    """

    hidden: set[int] = field(default_factory=set)
    logits: bool = False
    attentions: set[int] = field(default_factory=set)
    qkv: set[int] = field(default_factory=set)
    attention_scores: set[int] = field(default_factory=set)

    def merge(self, other: "FeatureRequest") -> "FeatureRequest":
        return FeatureRequest(self.hidden | other.hidden, self.logits or other.logits,
                              self.attentions | other.attentions, self.qkv | other.qkv,
                              self.attention_scores | other.attention_scores)


@dataclass
class Features:
    """What a forward pass returned, keyed by non-negative layer index: a plain record. `logits` are the model's
    logit rows at their positions (`LogitRows`, which owns them: restricting, forming, the KL)."""

    hidden: dict[int, torch.Tensor]
    logits: LogitRows | None
    num_layers: int
    attentions: dict[int, torch.Tensor] = field(default_factory=dict)  # [B, H, L, L] probabilities
    # {"q", "k", "v"} -> [B, L, H·d], heads concatenated; Q and K after the rotary embedding in rotary families
    qkv: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    attention_scores: dict[int, torch.Tensor] = field(default_factory=dict)  # [B, H, L, L] Q·Kᵀ/√d, unmasked

    def hidden_at(self, index: int) -> torch.Tensor:
        return self.hidden[normalise_layer(index, self.num_layers)]

    def attention_at(self, index: int) -> torch.Tensor:
        return self.attentions[normalise_block(index, self.num_layers)]

    def attention_scores_at(self, index: int) -> torch.Tensor:
        return self.attention_scores[normalise_block(index, self.num_layers)]

    def qkv_at(self, index: int) -> dict[str, torch.Tensor]:
        return self.qkv[normalise_block(index, self.num_layers)]


def normalise_layer(index: int, layers: int) -> int:
    """Hidden-state index in 0..layers (negative counts from the last layer, -1 = last)."""
    resolved = index + layers + 1 if index < 0 else index
    if not 0 <= resolved <= layers:
        raise IndexError(f"hidden-state index {index} is outside 0..{layers} (or -{layers + 1}..-1)")
    return resolved


def normalise_block(index: int, layers: int) -> int:
    """Transformer-layer index in 1..layers (-1 = last); the embeddings (0) have no attention."""
    resolved = index + layers + 1 if index < 0 else index
    if not 1 <= resolved <= layers:
        raise IndexError(f"transformer layer {index} is outside 1..{layers} (or -{layers}..-1)")
    return resolved


def extract_features(
    model: PreTrainedModel, inputs: dict[str, torch.Tensor], request: FeatureRequest, positions: torch.Tensor | None
) -> Features:
    """Run `model` once on its `inputs` (`input_ids`, `attention_mask`, `token_type_ids` where it takes them); return
    the requested hidden states, attention, Q/K/V and logits at `positions`."""
    layers = num_layers(model.config)
    wanted = {normalise_layer(i, layers) for i in request.hidden}
    attention_layers = {normalise_block(i, layers) for i in request.attentions}
    qkv_layers = {normalise_block(i, layers) for i in request.qkv}
    score_layers = {normalise_block(i, layers) for i in request.attention_scores}
    need_all = bool(wanted - {layers})
    encoder_inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    if "token_type_ids" in inputs and takes_token_type_ids(model.config):
        encoder_inputs["token_type_ids"] = inputs["token_type_ids"]
    with capture_qkv(model, attention_layers | qkv_layers | score_layers) as captured:
        output = encoder_of(model)(**encoder_inputs, output_hidden_states=need_all, return_dict=True)
    heads = {i: read_qkv(model, record) for i, record in captured.items()}
    biases = {i: score_bias(record) for i, record in captured.items()}
    last = output.last_hidden_state
    hidden = {i: output.hidden_states[i] for i in wanted} if need_all else {}
    if layers in wanted:
        hidden[layers] = last
    mask = inputs["attention_mask"].bool()
    attentions = {
        i: attention_probabilities(heads[i][0], heads[i][1], mask, attention_window(model.config, i), biases[i])
        for i in attention_layers
    }
    scores = {i: attention_scores(heads[i][0], heads[i][1], biases[i]) for i in score_layers}
    logits = None
    if request.logits:
        if positions is None:
            raise ValueError("logits requested without positions")
        logits = LogitRows(positions, mlm_head(model, last[positions]))
    return Features(hidden=hidden, logits=logits, num_layers=layers, attentions=attentions,
                    qkv={i: dict(zip("qkv", map(merge_heads, heads[i]), strict=True)) for i in qkv_layers},
                    attention_scores=scores)


def classifier_features(logits: torch.Tensor, hidden: dict[int, torch.Tensor], num_layers: int) -> Features:
    """A classifier's outputs as the objective's features: one logit row per token position of [B, L, C] logits,
    or per example of [B, C] logits (its position 0), and the hidden states (or [CLS] states, [B, 1, D]) of the
    layers the terms read."""
    shape = logits.shape[:-1] if logits.dim() == 3 else (logits.shape[0], 1)
    positions = torch.ones(shape, dtype=torch.bool, device=logits.device)
    return Features(hidden=hidden, logits=LogitRows(positions, logits.reshape(-1, logits.size(-1))),
                    num_layers=num_layers)
