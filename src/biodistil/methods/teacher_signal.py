"""Teacher signals of task-agnostic distillation: where the teacher's outputs for a batch come from, behind one
interface (the task-specific side has the same shape in `biodistil.kd.signal`).

`MaskedLMModule` asks its signal for the teacher's features of a batch (`outputs`) and never which source gave them:

- `OnlineTeacher`: the teacher runs on every batch, under `torch.inference_mode`, returning only the tensors the
  objective's terms read (vocabulary logits at the positions they use);
- `CachedTeacher`: the teacher ran once per (block, mask pattern) (`biodistil.methods.teacher_cache`); each batch
  carries the hidden states of the mapped layers and what stands for the logits at the masked positions, and the
  teacher's layers never run while the student trains. Logits: the teacher's MLM head (the only part of the teacher
  kept in memory, `head_only`) forms them exactly from its stored input, or the terms read `TopKLogits` (`logit_kl`
  becomes the top-k KL).

Each signal also prepares the data the engine reads (`data`): the online one leaves it as it is; the cached one
attaches the stored outputs to every block, in the data-loading stage.
"""

from dataclasses import replace
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import PreTrainedModel

from biodistil.methods.teacher_cache import CachedBlocks, CachedCollate, CacheReader, topk_rows
from biodistil.models.families import mlm_head
from biodistil.models.features import FeatureRequest, Features, extract_features
from biodistil.training.engine import Batch, Collate


class TeacherSignal(Protocol):
    """The teacher's outputs for the masked-LM module, whatever their source."""

    model: PreTrainedModel | None  # the teacher model when it runs during training, else None

    def data(self, dataset: Dataset, collate: Collate, held_out: bool = False) -> tuple[Dataset, Collate]:
        """The dataset and collate function with whatever this signal needs in each batch."""
        ...

    def outputs(self, batch: Batch, request: FeatureRequest, positions: torch.Tensor | None) -> Features:
        """The teacher's requested features for one batch, logits at `positions` ([B, L] bool)."""
        ...


class OnlineTeacher:
    """The teacher model, run on each batch (on `teacher_input_ids` when the batch has them: VE-KD)."""

    def __init__(self, model: PreTrainedModel):
        self.model = model

    def data(self, dataset: Dataset, collate: Collate, held_out: bool = False) -> tuple[Dataset, Collate]:
        return dataset, collate

    def outputs(self, batch: Batch, request: FeatureRequest, positions: torch.Tensor | None) -> Features:
        inputs = {**batch, "input_ids": batch.get("teacher_input_ids", batch["input_ids"])}
        with torch.inference_mode():
            features = extract_features(self.model, inputs, request, positions)
        return outside_inference_mode(features)


class CachedTeacher:
    """Outputs read from a teacher cache and carried by each batch (`teacher_hidden_<layer>`, and `teacher_head_input`
    or `teacher_topk_*`); `head`: the teacher reduced to its MLM head (`head_only`), for a head-input cache."""

    model = None

    def __init__(self, train: CacheReader, held_out: CacheReader | None = None, head: PreTrainedModel | None = None):
        self.readers = {False: train, True: held_out}
        spec = train.cache.spec
        if spec.logits == "head" and head is None:
            raise ValueError("a cache of the teacher's head input needs the teacher's head to form its logits")
        if head is not None:
            freeze(head)
        self.head = head
        self.layers, self.teacher_layers, self.temperature = spec.hidden_layers, spec.teacher_layers, spec.temperature

    def data(self, dataset: Dataset, collate: Collate, held_out: bool = False) -> tuple[Dataset, Collate]:
        return CachedBlocks(dataset, self.readers[held_out]), CachedCollate(collate, self.layers)

    def outputs(self, batch: Batch, request: FeatureRequest, positions: torch.Tensor | None) -> Features:
        hidden = {layer: batch[f"teacher_hidden_{layer}"].float() for layer in self.layers}
        logits = None
        if request.logits and self.head is not None:
            with torch.inference_mode():
                logits = mlm_head(self.head, batch["teacher_head_input"].to(self.head.dtype))
        elif request.logits:
            logits = topk_rows(batch, self.temperature)
        return Features(hidden=hidden, logits=logits, num_layers=self.teacher_layers,
                        positions=positions if request.logits else None)


def freeze(model: nn.Module) -> None:
    """Eval mode and no gradients, for a teacher."""
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)


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
