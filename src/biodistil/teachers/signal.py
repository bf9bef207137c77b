"""Teacher signals: where the teacher's outputs for a batch come from, behind one interface for task-agnostic
(masked-LM) and task-specific distillation alike.

A module asks its signal for the teacher's features of a batch (`get_signal`) and never which source gave them:

- `OnlineTeacher`: the teacher model runs on each batch through a forward function that returns only what the
  request names: `masked_lm_forward` (hidden states, attention, Q/K/V, vocabulary logits at the requested positions;
  in inference mode) or `classifier_forward` (a fine-tuned teacher's logits and [CLS] states; with gradients when
  meta-learning asks for them);
- `CachedTeacher`: the teacher ran once and its outputs wait in the teacher store (`biodistil.teachers.store`): a
  masked-LM entry per (block, mask pattern) (`biodistil.teachers.masked_lm_cache`) or a task entry per transfer
  example (`biodistil.teachers.task_cache`); each batch carries them, and no teacher layer runs while the student
  trains.

Each signal also prepares the data the engine reads (`data`): the online one leaves it as it is; the cached one
attaches the stored outputs (or the rows to read them from) to every item, in the data-loading stage.
"""

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset
from transformers import PreTrainedModel

from biodistil.data.batch import Batch
from biodistil.models.features import FeatureRequest, Features, classifier_features, extract_features
from biodistil.tasks.encoding import model_inputs
from biodistil.training.engine import Collate

Positions = torch.Tensor | None  # [B, L] bool: where vocabulary logits are wanted (masked-LM terms)
TeacherForward = Callable[[PreTrainedModel, Batch, FeatureRequest, Positions, bool, int], Features]


class TeacherSignal(Protocol):
    """The teacher's outputs for a distillation module, whatever their source."""

    model: PreTrainedModel | None  # the teacher model when it runs during training, else None
    slot: int  # which of the batch's teacher payloads is this signal's (`Batch.payload`)

    def data(self, dataset: Dataset, collate: Collate, held_out: bool = False) -> tuple[Dataset, Collate]:
        """The dataset and collate function with whatever this signal needs in each batch."""
        ...

    def get_signal(self, batch: Batch, request: FeatureRequest, positions: Positions = None,
                   grad: bool = False) -> Features:
        """The teacher's requested features of one batch (logits at `positions` for masked-LM terms); with `grad`,
        a graph through the teacher (meta-learning)."""
        ...


class StoredOutputs(Protocol):
    """One entry of the teacher store, as a `CachedTeacher` reads it; `payload_index`: the batch payload it fills and
    reads."""

    def data(self, dataset: Dataset, collate: Collate, payload_index: int = 0) -> tuple[Dataset, Collate]:
        ...

    def features(self, batch: Batch, request: FeatureRequest, positions: Positions,
                 payload_index: int = 0) -> Features:
        ...


def masked_lm_forward(model: PreTrainedModel, batch: Batch, request: FeatureRequest, positions: Positions,
                      grad: bool = False, slot: int = 0) -> Features:
    """A masked-LM teacher's requested features (on its own inputs when the batch's teacher payload has them: VE-KD's
    `input_ids`, and across tokenizers its own tokens and `attention_mask`), in inference mode unless `grad`."""
    inputs = batch.teacher_inputs(slot)
    if grad:
        return extract_features(model, inputs, request, positions)
    with torch.inference_mode():
        features = extract_features(model, inputs, request, positions)
    return outside_inference_mode(features)


def classifier_forward(model: PreTrainedModel, batch: Batch, request: FeatureRequest, positions: Positions = None,
                       grad: bool = False, slot: int = 0) -> Features:
    """A fine-tuned teacher's logits and the [CLS] states of the requested layers (`request.hidden`). The teacher
    reads the student's tokens, or its own tokens of the same text when the batch's teacher payload has them (across
    tokenizers); a token task's logits are then read at each word's first teacher token and placed at the student's
    tokens of that word (the payload's `word_index`), so they pair with the student's position by position."""
    from biodistil.teachers.task_cache import forward_teacher  # tests count the teacher's passes there

    with torch.set_grad_enabled(grad):
        logits, states = forward_teacher(model, model_inputs(model, batch.teacher_inputs(slot)), bool(request.hidden))
        if "word_index" in batch.payload(slot):
            logits = at_student_tokens(logits, batch.payload(slot)["word_index"])
    logits = logits.float()  # a teacher run in bf16 (`teachers[].dtype`) gives its outputs to float32 losses
    hidden = {layer: states[layer].float() for layer in sorted(request.hidden)} if states else {}
    return classifier_features(logits, hidden, len(states) - 1 if states else 0)


def at_student_tokens(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Teacher token logits [B, L_T, C] → [B, L_S, C]: row (b, p) is the teacher's logits at position index[b, p]
    (the first teacher token of the word of student token p), zeros where index is −1."""
    known = index >= 0
    gathered = logits.gather(1, index.clamp_min(0)[..., None].expand(-1, -1, logits.size(-1)))
    return gathered * known[..., None].to(gathered.dtype)


class OnlineTeacher:
    """The teacher model, run on each batch by `forward`."""

    def __init__(self, model: PreTrainedModel, forward: TeacherForward = masked_lm_forward, slot: int = 0):
        self.model, self.forward, self.slot = model, forward, slot

    def data(self, dataset: Dataset, collate: Collate, held_out: bool = False) -> tuple[Dataset, Collate]:
        return dataset, collate

    def get_signal(self, batch: Batch, request: FeatureRequest, positions: Positions = None,
                   grad: bool = False) -> Features:
        return self.forward(self.model, batch, request, positions, grad, self.slot)


class CachedTeacher:
    """Outputs read from the teacher store: `train`'s for the training data, `held_out`'s (when given) for the
    held-out data."""

    model = None

    def __init__(self, train: StoredOutputs, held_out: StoredOutputs | None = None, slot: int = 0):
        self.sources = {False: train, True: held_out}
        self.slot = slot

    def data(self, dataset: Dataset, collate: Collate, held_out: bool = False) -> tuple[Dataset, Collate]:
        return self.sources[held_out].data(dataset, collate, self.slot)

    def get_signal(self, batch: Batch, request: FeatureRequest, positions: Positions = None,
                   grad: bool = False) -> Features:
        return self.sources[False].features(batch, request, positions, self.slot)


def outside_inference_mode(features: Features) -> Features:
    """Teacher features computed under `torch.inference_mode`, made usable by terms that save them for the backward
    pass (hidden states, attention, Q/K/V: small copies). The logits, the one large tensor, stay as they are: the
    logit terms only read them (`soft_kl_loss` keeps its own gradient, the others save tensors derived from them)."""

    def copy(tensors: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        return {key: value.clone() for key, value in tensors.items()}

    return replace(
        features, hidden=copy(features.hidden), attentions=copy(features.attentions),
        attention_scores=copy(features.attention_scores), qkv={key: copy(value) for key, value in features.qkv.items()},
    )
