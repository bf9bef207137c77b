"""Teacher signals: where the teacher's outputs for a batch come from, behind one interface.

The KD module asks its signal for the teacher's features of a batch (`outputs`) and never which source gave them:

- `CachedTeacher`: the teacher ran once over the transfer set (`biodistil.kd.teacher_cache`); its logits (and the
  [CLS] states PatientKD needs) are attached to the student's features, so batches carry them and no teacher is
  held in memory while the student trains;
- `OnlineTeacher`: the teacher runs on every batch, with gradients when asked (meta-learning changes it).

Each signal also prepares the student's features of the transfer examples (`features`): the cached one aligns
its stored outputs with the student's encoding; both mark `kd_mask`, the positions the soft term covers in token
tasks (the labelled first sub-word of each word).
"""

from collections.abc import Sequence
from typing import Any, Protocol

import datasets
import torch
from transformers import PreTrainedModel

from biodistil.kd.objective import classifier_features
from biodistil.kd.teacher_cache import attach_teacher_outputs, forward_teacher
from biodistil.models.features import Features
from biodistil.tasks.encoding import EncodedSplit, model_inputs
from biodistil.tasks.registry import TaskSpec
from biodistil.training.engine import Batch

Positions = list[list[int]] | None  # per feature, 1 where the soft term counts (token tasks); None otherwise


class TeacherSignal(Protocol):
    """The teacher's outputs for the KD module, whatever their source."""

    model: PreTrainedModel | None  # the teacher model when it runs during training, else None

    def features(self, encoded: EncodedSplit, task: TaskSpec, positions: Positions) -> list[dict[str, Any]]:
        """The student's features with whatever this signal needs in each batch."""
        ...

    def outputs(self, batch: Batch, grad: bool = False) -> Features:
        """The teacher's logits (and [CLS] states of the requested layers) for one batch."""
        ...


def marked_features(encoded: EncodedSplit, positions: Positions) -> list[dict[str, Any]]:
    """The encoded features, with `kd_mask` (the soft term's positions) in token tasks."""
    features = [dict(f) for f in encoded.features]
    for feature, mask in zip(features, positions or [], strict=False):
        feature["kd_mask"] = mask
    return features


class CachedTeacher:
    """Outputs computed once over the transfer set and carried by each batch (`teacher_logits`, `teacher_cls`)."""

    model = None

    def __init__(self, table: datasets.Dataset, cls_layers: Sequence[int] = (), teacher_layers: int = 0):
        self.table = table
        self.cls_layers = tuple(cls_layers)
        self.teacher_layers = max(teacher_layers, *self.cls_layers, 0)

    def features(self, encoded: EncodedSplit, task: TaskSpec, positions: Positions) -> list[dict[str, Any]]:
        return attach_teacher_outputs(encoded, self.table, task, positions)

    def outputs(self, batch: Batch, grad: bool = False) -> Features:
        cls = batch.get("teacher_cls")  # [B, K, D]: one row per requested layer
        hidden = {layer: cls[:, k:k + 1] for k, layer in enumerate(self.cls_layers)} if cls is not None else {}
        return classifier_features(batch["teacher_logits"], hidden, self.teacher_layers)


class OnlineTeacher:
    """The teacher model, run on each batch (it must share the student's tokenizer)."""

    def __init__(self, model: PreTrainedModel, cls_layers: Sequence[int] = ()):
        self.model = model
        self.cls_layers = tuple(cls_layers)

    def features(self, encoded: EncodedSplit, task: TaskSpec, positions: Positions) -> list[dict[str, Any]]:
        return marked_features(encoded, positions)

    def outputs(self, batch: Batch, grad: bool = False) -> Features:
        with torch.set_grad_enabled(grad):
            logits, states = forward_teacher(self.model, model_inputs(self.model, batch), bool(self.cls_layers))
        hidden = {layer: states[layer] for layer in self.cls_layers}
        return classifier_features(logits, hidden, len(states) - 1 if states else 0)
