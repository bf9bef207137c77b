"""Task-agnostic stages on a masked-LM objective: MLM pre-training and teacher -> student distillation.

Both train a `MaskedLMModule` (student + objective) on masked corpus blocks with the one engine; they
differ only in whether a teacher exists and which terms the objective holds.
"""

from dataclasses import replace

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.config import MaskingConfig
from biodistil.data.masking import MaskingVocabulary, mask_tokens
from biodistil.methods.objective import Objective, TermInputs, position_masks
from biodistil.models.features import Features, extract_features


class MaskedLMModule(nn.Module):
    """What the engine trains: the student and the objective's own parameters (projections).

    The teacher is held by reference only, so it is never trained, checkpointed, or wrapped for
    data-parallel training; it runs under `torch.inference_mode` in eval mode.
    """

    def __init__(
        self, student: PreTrainedModel, objective: Objective, teacher: PreTrainedModel | None = None,
        shared_vocab: int | None = None,
    ):
        super().__init__()
        self.student = student
        self.objective = objective
        self.shared_vocab = shared_vocab  # VE-KD: the teacher's vocabulary size, a prefix of the student's
        self._teacher = (teacher,)  # a tuple hides it from nn.Module registration
        if teacher is not None:
            freeze(teacher)

    @property
    def teacher(self) -> PreTrainedModel | None:
        return self._teacher[0]

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One student pass and (without gradients) one teacher pass; the teacher reads `teacher_input_ids`
        when the batch has them (VE-KD), else the student's ids."""
        labels, attention = batch["labels"], batch["attention_mask"].bool()
        masks = position_masks(attention, labels, batch.get("new_tokens"))
        teacher_features = None
        if self.objective.needs_teacher:
            teacher_batch = {**batch, "input_ids": batch.get("teacher_input_ids", batch["input_ids"])}
            with torch.inference_mode():
                teacher_features = extract_features(
                    self.teacher, teacher_batch, self.objective.teacher_request(),
                    self.objective.logit_positions(masks, teacher=True),
                )
            teacher_features = outside_inference_mode(teacher_features)
        student_features = extract_features(
            self.student, batch, self.objective.student_request(), self.objective.logit_positions(masks)
        )
        inputs = TermInputs(
            student=student_features, teacher=teacher_features, labels=labels, attention_mask=attention,
            masks=masks, temperature=self.objective.cfg.temperature, shared_vocab=self.shared_vocab,
        )
        return self.objective(inputs)


def outside_inference_mode(features: Features) -> Features:
    """Teacher features computed under `torch.inference_mode`, made usable by terms that save them for the backward
    pass (hidden states, attention, Q/K/V: small copies). The logits, the one large tensor, stay as they are: the
    logit terms only read them (`soft_kl_loss` keeps its own gradient, the others save tensors derived from them)."""
    copy = lambda tensors: {key: value.clone() for key, value in tensors.items()}  # noqa: E731
    return replace(
        features, hidden=copy(features.hidden), attentions=copy(features.attentions),
        attention_scores=copy(features.attention_scores), qkv={key: copy(value) for key, value in features.qkv.items()},
    )


def teacher_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The teacher's dtype for `teacher.dtype`: "auto" is bfloat16 where the hardware computes it fast (a GPU with
    bf16, a CPU with AMX tiles), else float32."""
    if setting == "auto":
        if device.type == "cuda":
            fast = torch.cuda.is_bf16_supported()
        else:
            fast = device.type == "cpu" and getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        setting = "bfloat16" if fast else "float32"
    return torch.bfloat16 if setting == "bfloat16" else torch.float32


def freeze(model: nn.Module) -> None:
    """Eval mode and no gradients, for a teacher."""
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)


class MaskBatch:
    """The engine's per-batch hook: dynamic MLM masking with the engine's seeded generator."""

    def __init__(self, vocab: MaskingVocabulary, cfg: MaskingConfig):
        self.vocab, self.cfg = vocab, cfg

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        corrupted, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], self.vocab, self.cfg, generator)
        return {**batch, "input_ids": corrupted, "labels": labels}
