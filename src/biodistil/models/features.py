"""Asking a masked-LM model for exactly the tensors the active losses need.

Vocabulary logits are computed only at the requested positions: over a 30k vocabulary the MLM head at
every position is most of a small student's cost, and the MLM and soft-MLM losses only use some positions.
Attention probabilities, unnormalised attention scores and Q/K/V come from hooks on the layers that are
inspected only (see `biodistil.models.attention`), so the model keeps its fast attention kernel everywhere.
The probabilities are each layer's own: a local (sliding-window) layer's are zero outside its window.
"""

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from biodistil.losses.distillation import LinearRows
from biodistil.models.attention import attention_probabilities, attention_scores, capture_qkv, read_qkv
from biodistil.models.families import attention_window, encoder_of, mlm_head, num_layers, takes_token_type_ids
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
        return FeatureRequest(
            self.hidden | other.hidden, self.logits or other.logits,
            self.attentions | other.attentions, self.qkv | other.qkv,
            self.attention_scores | other.attention_scores,
        )


@dataclass
class TopKLogits:
    """A teacher's vocabulary distribution at N positions, as a teacher cache keeps it: the logits of its k most
    probable tokens minus the row's largest logit, their ids, the log-normaliser log Σ_j exp((z_j − max z) / T)
    over the whole vocabulary at the cache's temperature T, and optionally m tokens drawn from the rest of its
    tempered distribution with their logits (see `biodistil.losses.distillation.topk_kl_loss`)."""

    values: torch.Tensor  # [N, k]
    ids: torch.Tensor  # [N, k]
    log_norm: torch.Tensor  # [N]
    temperature: float
    tail_values: torch.Tensor | None = None  # [N, m] logits (same shift) of m draws from the teacher's tail
    tail_ids: torch.Tensor | None = None  # [N, m]

    def __getitem__(self, rows: torch.Tensor) -> "TopKLogits":
        tail = (None, None) if self.tail_ids is None else (self.tail_values[rows], self.tail_ids[rows])
        return TopKLogits(self.values[rows], self.ids[rows], self.log_norm[rows], self.temperature, *tail)


@dataclass
class Features:
    """What a forward pass returned, keyed by non-negative layer index.

    `logits` has one row per True entry of `positions` ([B, L] bool, row-major order): vocabulary logits, a cached
    teacher's top-k (`TopKLogits`), or a masked LM's head up to its decoder (`LinearRows`), whose logits are formed
    when a term asks for them (`logits_at`, once per set of rows) or, by the losses that take `LinearRows`
    (`head_at`), a chunk of rows at a time.
    """

    hidden: dict[int, torch.Tensor]
    logits: torch.Tensor | TopKLogits | LinearRows | None
    num_layers: int
    attentions: dict[int, torch.Tensor] = field(default_factory=dict)  # [B, H, L, L] probabilities
    # {"q", "k", "v"} -> [B, L, H·d], heads concatenated; Q and K after the rotary embedding in rotary families
    qkv: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    positions: torch.Tensor | None = None
    attention_scores: dict[int, torch.Tensor] = field(default_factory=dict)  # [B, H, L, L] Q·Kᵀ/√d, unmasked
    # (mask, logits) formed from the head; a copy of the features (dataclasses.replace) needs a new list
    _formed: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list, repr=False)

    def hidden_at(self, index: int) -> torch.Tensor:
        return self.hidden[normalise_layer(index, self.num_layers)]

    def attention_at(self, index: int) -> torch.Tensor:
        return self.attentions[normalise_block(index, self.num_layers)]

    def attention_scores_at(self, index: int) -> torch.Tensor:
        return self.attention_scores[normalise_block(index, self.num_layers)]

    def qkv_at(self, index: int) -> dict[str, torch.Tensor]:
        return self.qkv[normalise_block(index, self.num_layers)]

    def logits_at(self, mask: torch.Tensor) -> torch.Tensor | TopKLogits:
        """Logit rows at the True entries of `mask` [B, L], which must lie within `positions`."""
        if self.logits is None or self.positions is None:
            raise ValueError("no logits were computed")
        if isinstance(self.logits, LinearRows):
            return self._formed_logits(mask)
        if mask is self.positions:  # every computed row: no copy (a copy of [N, V] logits and of its gradient)
            return self.logits
        return self.logits[mask[self.positions]]

    def head_at(self, mask: torch.Tensor) -> LinearRows | None:
        """The head's decoder input at the True entries of `mask`, for a loss that forms the logits itself (None when
        the features hold logits, not a head)."""
        if not isinstance(self.logits, LinearRows):
            return None
        return self.logits if mask is self.positions else self.logits.select(mask[self.positions])

    def formed_at(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows, logits): the entries of `mask` whose logits another term has formed from the head already, and
        those logits; None when there are none."""
        if not self._formed:
            return None
        known, logits = self._formed[0]
        rows = mask & known
        if mask is known or torch.equal(rows, known):  # every formed row: no copy
            return known, logits
        return rows, logits[rows[known]]

    def _formed_for(self, mask: torch.Tensor) -> torch.Tensor | None:
        return next((logits for known, logits in self._formed if known is mask), None)

    def _formed_logits(self, mask: torch.Tensor) -> torch.Tensor:
        """Logits from the head at `mask`'s rows, formed once per mask (terms reading the same rows share them)."""
        logits = self._formed_for(mask)
        if logits is None:
            every = self._formed_for(self.positions)
            if every is not None:
                return every[mask[self.positions]]
            logits = self.head_at(mask).logits()
            self._formed.append((mask, logits))
        return logits


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
    model: PreTrainedModel, batch: dict[str, torch.Tensor], request: FeatureRequest, positions: torch.Tensor | None
) -> Features:
    """Run `model` once; return the requested hidden states, attention, Q/K/V and logits at `positions`."""
    layers = num_layers(model.config)
    wanted = {normalise_layer(i, layers) for i in request.hidden}
    attention_layers = {normalise_block(i, layers) for i in request.attentions}
    qkv_layers = {normalise_block(i, layers) for i in request.qkv}
    score_layers = {normalise_block(i, layers) for i in request.attention_scores}
    need_all = bool(wanted - {layers})
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if "token_type_ids" in batch and takes_token_type_ids(model.config):
        inputs["token_type_ids"] = batch["token_type_ids"]
    with capture_qkv(model, attention_layers | qkv_layers | score_layers) as captured:
        output = encoder_of(model)(**inputs, output_hidden_states=need_all, return_dict=True)
    heads = {i: read_qkv(model, slot) for i, slot in captured.items()}
    last = output.last_hidden_state
    hidden = {i: output.hidden_states[i] for i in wanted} if need_all else {}
    if layers in wanted:
        hidden[layers] = last
    mask = batch["attention_mask"].bool()
    attentions = {
        i: attention_probabilities(heads[i][0], heads[i][1], mask, attention_window(model.config, i))
        for i in attention_layers
    }
    scores = {i: attention_scores(heads[i][0], heads[i][1]) for i in score_layers}
    logits = None
    if request.logits:
        if positions is None:
            raise ValueError("logits requested without positions")
        logits = mlm_head(model, last[positions])
    return Features(
        hidden=hidden, logits=logits, num_layers=layers, attentions=attentions,
        qkv={i: dict(zip("qkv", map(merge_heads, heads[i]), strict=True)) for i in qkv_layers},
        positions=positions if request.logits else None, attention_scores=scores,
    )
