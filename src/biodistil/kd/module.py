"""What the engine trains in `biodistil kd`: the student and, for MetaAdaptiveKD, the raw α and β; with the
collator and the features of the transfer examples.

The module reads the teacher through its signal (`biodistil.kd.signal`): cached outputs from the batch, or one
teacher pass per batch. A frozen teacher is held by reference only (never trained, checkpointed or wrapped for
data-parallel training); under meta-learning it is registered, so that the pre-step's optimizer trains it and
the checkpoint holds it, and it stays in eval mode (no dropout).
"""

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.data.formats import Example
from biodistil.kd.objective import KDObjective, classifier_features
from biodistil.kd.recipe import KDOptions
from biodistil.kd.signal import TeacherSignal, marked_features
from biodistil.kd.teacher_cache import with_placeholder_labels
from biodistil.kd.transfer import is_labelled
from biodistil.methods.objective import Weight
from biodistil.methods.teacher_signal import freeze
from biodistil.models.features import Features
from biodistil.tasks.encoding import FeatureCollator, encode_split, model_inputs
from biodistil.tasks.registry import TaskSpec
from biodistil.training.engine import Batch

TEACHER_KEYS = ("teacher_logits", "kd_mask", "teacher_cls", "pkd_mask")


def inverse_softplus(value: float) -> float:
    """x with softplus(x) = value, i.e. log(exp(value) − 1)."""
    return value + math.log(-math.expm1(-value))


class KDModule(nn.Module):
    """The student, its KD objective and the teacher signal; `forward(batch) -> (loss, logs)` for the engine."""

    def __init__(self, student: PreTrainedModel, task: TaskSpec, cfg: KDOptions, signal: TeacherSignal | None = None,
                 pairs: list[tuple[int, int]] = (), trainable_teacher: bool = False, adaptive: bool = False):
        super().__init__()
        self.student = student
        self.cfg = cfg
        self.objective = KDObjective(cfg, task, pairs)
        self.student_layers = sorted({s for s, _ in pairs})
        self.signal = signal
        teacher = self.teacher
        if trainable_teacher:
            self.teacher_model = teacher
            teacher.eval()
        elif teacher is not None:
            freeze(teacher)
        self.adaptive = adaptive
        if adaptive:  # α = softplus(a), β = softplus(b): always positive
            self.raw_alpha = nn.Parameter(torch.tensor(inverse_softplus(cfg.alpha)))
            self.raw_beta = nn.Parameter(torch.tensor(inverse_softplus(cfg.beta)))

    @property
    def teacher(self) -> PreTrainedModel | None:
        """The teacher model when it runs during training (online signal), else None."""
        return self.signal.model if self.signal is not None else None

    def train(self, mode: bool = True) -> "KDModule":
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def weights(self, detach: bool = False) -> tuple[Weight, Weight]:
        """(α, β): the recipe's values, or softplus of the learned raw values (MetaAdaptiveKD)."""
        if not self.adaptive:
            return self.cfg.alpha, self.cfg.beta
        alpha, beta = F.softplus(self.raw_alpha), F.softplus(self.raw_beta)
        return (alpha.detach(), beta.detach()) if detach else (alpha, beta)

    def student_outputs(self, batch: Batch, params: dict[str, torch.Tensor] | None = None) -> Features:
        """The student's logits (and the hidden states PatientKD reads); with `params`, a functional pass."""
        inputs = {**model_inputs(self.student, batch), "output_hidden_states": bool(self.student_layers)}
        if params is None:
            out = self.student(**inputs)
        else:
            out = functional_call(self.student, params, args=(), kwargs=inputs)
        states = out.hidden_states if self.student_layers else None
        hidden = {layer: states[layer] for layer in self.student_layers} if states else {}
        return classifier_features(out.logits, hidden, len(states) - 1 if states else 0)

    def teacher_outputs(self, batch: Batch, grad: bool = False) -> Features | None:
        """The teacher's features of the batch from the signal (with gradients only when `grad`); None without one."""
        return self.signal.outputs(batch, grad) if self.signal is not None else None

    def distill_loss(self, student: Features, teacher: Features | None, batch: Batch, alpha: Weight,
                     beta: Weight) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = α·soft + β·CE + γ·PatientKD (soft_loss none: β·CE only), with the terms' values and α, β for the logs."""
        loss, logs = self.objective(student, teacher, batch, {"soft": alpha, "ce": beta})
        logs.update(alpha=torch.as_tensor(alpha).detach().float(), beta=torch.as_tensor(beta).detach().float())
        return loss, logs

    def forward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        alpha, beta = self.weights(detach=True)
        return self.distill_loss(self.student_outputs(batch), self.teacher_outputs(batch), batch, alpha, beta)


@dataclass(frozen=True)
class KDCollator:
    """Pads model inputs and labels like fine-tuning, plus the columns a teacher signal attached (cached logits
    per example or per position, `kd_mask`, [CLS] states and `pkd_mask`)."""

    base: FeatureCollator

    def __call__(self, features: list[dict[str, Any]]) -> Batch:
        batch = self.base([{k: v for k, v in f.items() if k not in TEACHER_KEYS} for f in features])
        length = batch["input_ids"].shape[1]
        first = features[0]
        if "teacher_logits" in first:
            batch["teacher_logits"] = torch.tensor(
                [_pad_rows(f["teacher_logits"], length) for f in features] if self.base.token_labels
                else [f["teacher_logits"] for f in features], dtype=torch.float32)
        if "kd_mask" in first:
            batch["kd_mask"] = torch.tensor([f["kd_mask"] + [0] * (length - len(f["kd_mask"])) for f in features])
        if "teacher_cls" in first:
            batch["teacher_cls"] = torch.tensor([f["teacher_cls"] for f in features], dtype=torch.float32)
            batch["pkd_mask"] = torch.tensor([f["pkd_mask"] for f in features])
        return batch


def _pad_rows(rows: list[list[float]], length: int) -> list[list[float]]:
    return rows + [[0.0] * len(rows[0])] * (length - len(rows))


def kd_features(task: TaskSpec, examples: list[Example], tokenizer: PreTrainedTokenizerBase,
                signal: TeacherSignal | None = None) -> list[dict[str, Any]]:
    """The student's features of the transfer examples, prepared by the teacher signal: labels when some example
    has one (-100, no target, for the others: a labelled budget within unlabelled text); token tasks get `kd_mask`
    (the sub-word positions a word's label would sit at)."""
    encoded = encode_split(task, with_placeholder_labels(examples, task), tokenizer)
    token_task = task.kind == "token_classification"
    positions = [[int(label != -100) for label in f["labels"]] for f in encoded.features] if token_task else None
    features = signal.features(encoded, task, positions) if signal is not None else marked_features(encoded,
                                                                                                     positions)
    labelled = [is_labelled(example) for example in examples]
    for feature, (index, _) in zip(features, encoded.origins, strict=True):
        if not any(labelled):
            feature.pop("labels")
        elif not labelled[index]:
            feature["labels"] = [-100] * len(feature["labels"]) if token_task else -100
    return features
