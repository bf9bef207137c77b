"""What the engine trains in `biodistil kd`: the student and, for MetaAdaptiveKD, the raw α and β; with the
collator and the features of the transfer examples.

The module reads the teacher through its signal (`biodistil.teachers.signal`): cached outputs from the batch, or
one teacher pass per batch. A frozen teacher is held by reference only (never trained, checkpointed or wrapped for
data-parallel training); under meta-learning it is registered, so that the pre-step's optimizer trains it and
the checkpoint holds it, and it stays in eval mode (no dropout).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.data.batch import Batch
from biodistil.data.formats import Example
from biodistil.kd.objective import KDObjective
from biodistil.kd.recipe import KDOptions
from biodistil.kd.transfer import is_labelled
from biodistil.methods.objective import Weight
from biodistil.models.features import FeatureRequest, Features, classifier_features
from biodistil.tasks.encoding import (
    NO_POSITION,
    FeatureCollator,
    collator_for,
    encode_split,
    model_inputs,
    teacher_encoding,
)
from biodistil.tasks.registry import TaskSpec
from biodistil.teachers.loading import freeze
from biodistil.teachers.signal import TeacherSignal
from biodistil.teachers.task_cache import with_placeholder_labels
from biodistil.training.engine import Collate


def inverse_softplus(value: float) -> float:
    """x with softplus(x) = value, i.e. log(exp(value) − 1)."""
    return value + math.log(-math.expm1(-value))


class KDModule(nn.Module):
    """The student, its KD objective and the teacher signal; `forward(batch) -> (loss, logs)` for the engine."""

    def __init__(self, student: PreTrainedModel, task: TaskSpec, cfg: KDOptions,
                 signal: TeacherSignal | Sequence[TeacherSignal] | None = None, pairs: list[tuple[int, int]] = (),
                 trainable_teacher: bool = False, adaptive: bool = False, teacher_weights: Sequence[float] = (1.0,)):
        super().__init__()
        self.student = student
        self.cfg = cfg
        self.signals = () if signal is None else (signal,) if not isinstance(signal, Sequence) else tuple(signal)
        self.objective = KDObjective(cfg, task, pairs, teacher_weights)
        self.student_layers = sorted({s for s, _ in pairs})
        self.teacher_request = FeatureRequest(hidden={t for _, t in pairs})
        if trainable_teacher:
            self.teacher_model = self.teacher
            self.teacher.eval()
        for model in self._online_models():
            if not trainable_teacher:
                freeze(model)
        self.adaptive = adaptive
        if adaptive:  # α = softplus(a), β = softplus(b): always positive
            self.raw_alpha = nn.Parameter(torch.tensor(inverse_softplus(cfg.alpha)))
            self.raw_beta = nn.Parameter(torch.tensor(inverse_softplus(cfg.beta)))

    @property
    def uses_kl_rows(self) -> bool:
        """Hinton KD's soft targets are a KL over logit rows (`train.compile` compiles that kernel only then)."""
        return self.cfg.soft_loss == "hinton"

    @property
    def kl_columns(self) -> int:
        """The width of the KL's rows: the task's classes (`train.compile: auto` leaves such narrow rows eager)."""
        return int(self.student.config.num_labels)

    @property
    def signal(self) -> TeacherSignal | None:
        """The (first) teacher's signal."""
        return self.signals[0] if self.signals else None

    @property
    def teacher(self) -> PreTrainedModel | None:
        """The (first) teacher model when it runs during training (online signal), else None."""
        return self.signal.model if self.signal is not None else None

    def _online_models(self) -> list[PreTrainedModel]:
        return [signal.model for signal in self.signals if signal.model is not None]

    def train(self, mode: bool = True) -> "KDModule":
        super().train(mode)
        for model in self._online_models():
            model.eval()
        return self

    def weights(self, detach: bool = False) -> tuple[Weight, Weight]:
        """(α, β): the recipe's values, or softplus of the learned raw values (MetaAdaptiveKD)."""
        if not self.adaptive:
            return self.cfg.alpha, self.cfg.beta
        alpha, beta = F.softplus(self.raw_alpha), F.softplus(self.raw_beta)
        return (alpha.detach(), beta.detach()) if detach else (alpha, beta)

    def student_outputs(self, batch: Batch, params: dict[str, torch.Tensor] | None = None) -> Features:
        """The student's logits (and the hidden states PatientKD reads); with `params`, a functional pass."""
        inputs = {**model_inputs(self.student, batch.inputs), "output_hidden_states": bool(self.student_layers)}
        if params is None:
            out = self.student(**inputs)
        else:
            out = functional_call(self.student, params, args=(), kwargs=inputs)
        states = out.hidden_states if self.student_layers else None
        hidden = {layer: states[layer] for layer in self.student_layers} if states else {}
        return classifier_features(out.logits, hidden, len(states) - 1 if states else 0)

    def teacher_outputs(self, batch: Batch, grad: bool = False) -> Features | list[Features] | None:
        """The teacher's features of the batch from its signal (with gradients only when `grad`), a list with several
        teachers (one after the other, each under no_grad unless `grad`); None without one."""
        if not self.signals:
            return None
        outputs = [signal.get_signal(batch, self.teacher_request, grad=grad) for signal in self.signals]
        return outputs[0] if len(outputs) == 1 else outputs

    def distill_loss(self, student: Features, teacher: Features | list[Features] | None, batch: Batch, alpha: Weight,
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
    """Pads model inputs and labels like fine-tuning, and the `kd` mask (token tasks); across tokenizers the teacher's
    own inputs (its payload's `input_ids` ..., padded with `teacher_pad_id`) and `word_index` (−1 on padding); a
    cached teacher signal's collate adds its outputs around it."""

    base: FeatureCollator
    teacher_pad_id: int = 0

    def __call__(self, features: list[dict[str, Any]]) -> Batch:
        batch = Batch.of(self.base(features))
        length = batch.input_ids.shape[1]
        if "kd_mask" in features[0]:
            batch.masks["kd"] = _padded([f["kd_mask"] for f in features], length, 0)
        if "teacher" in features[0]:
            own = [f["teacher"] for f in features]
            teacher_length = max(len(t["input_ids"]) for t in own)
            for key, fill in (("input_ids", self.teacher_pad_id), ("attention_mask", 0), ("token_type_ids", 0)):
                if key in own[0]:
                    batch.teacher[key] = _padded([t[key] for t in own], teacher_length, fill)
            if "word_index" in own[0]:
                batch.teacher["word_index"] = _padded([t["word_index"] for t in own], length, NO_POSITION)
        return batch


def _padded(rows: list[list[int]], length: int, fill: int) -> torch.Tensor:
    return torch.tensor([row + [fill] * (length - len(row)) for row in rows])


def kd_features(task: TaskSpec, examples: list[Example], tokenizer: PreTrainedTokenizerBase,
                teacher_tokenizer: PreTrainedTokenizerBase | None = None) -> list[dict[str, Any]]:
    """The student's features of the transfer examples: labels when some example has one (-100, no target, for the
    others: a labelled budget within unlabelled text); token tasks get `kd_mask` (the sub-word positions a word's
    label would sit at, 1 at each word's first sub-word); every feature its `origin` (example, first word) and
    `word_ids` (-1 off words), which a cached teacher matches its outputs by (word by word: the student's windows
    need not be the teacher's, and a long labelled sentence's windows end before an entity, never inside it). With
    `teacher_tokenizer` (an online teacher across tokenizers) each feature also carries the teacher's own tokens of
    the same text under `teacher` (`teacher_encoding`) and, token tasks, `kd_mask` keeps only the words the teacher's
    side holds."""
    placeheld = with_placeholder_labels(examples, task)
    encoded = encode_split(task, placeheld, tokenizer, whole_entities=True)  # a labelled window never cuts an entity
    teacher = teacher_encoding(task, placeheld, encoded, teacher_tokenizer) if teacher_tokenizer is not None \
        else [{}] * len(encoded)
    token_task = task.kind == "token_classification"
    labelled = [is_labelled(example) for example in examples]
    features = []
    for i, (feature, origin) in enumerate(zip(encoded.features, encoded.origins, strict=True)):
        feature = {**feature, "origin": list(origin), **({"teacher": teacher[i]} if teacher[i] else {})}
        if token_task:
            index = teacher[i].get("word_index")
            feature["kd_mask"] = [int(label != -100 and (index is None or index[p] != NO_POSITION))
                                  for p, label in enumerate(feature["labels"])]
            feature["word_ids"] = [-1 if word is None else word for word in encoded.word_ids[i]]
        if not any(labelled):
            feature.pop("labels")
        elif not labelled[origin[0]]:
            feature["labels"] = [-100] * len(feature["labels"]) if token_task else -100
        features.append(feature)
    return features


def kd_data(task: TaskSpec, examples: list[Example], tokenizer: PreTrainedTokenizerBase,
            signal: TeacherSignal | Sequence[TeacherSignal] | None = None,
            teacher_tokenizer: PreTrainedTokenizerBase | None = None) -> tuple[list[dict[str, Any]], Collate]:
    """The transfer examples' features and their collate, prepared by each teacher signal in turn (a cached teacher
    attaches the rows of its outputs and gathers them into each batch, in its payload slot); with
    `teacher_tokenizer`, the online teacher's own tokens of every feature (`kd_features`)."""
    features = kd_features(task, examples, tokenizer, teacher_tokenizer)
    pad = teacher_tokenizer.pad_token_id if teacher_tokenizer is not None else 0
    data: tuple[Any, Collate] = (features, KDCollator(collator_for(task, tokenizer), pad))
    for each in () if signal is None else (signal,) if not isinstance(signal, Sequence) else signal:
        data = each.data(*data)
    return data
