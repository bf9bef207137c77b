"""Task-agnostic stages on a masked-LM objective: MLM pre-training and teacher -> student distillation.

Both train a `MaskedLMModule` (student + objective) on masked corpus blocks with the one engine; they
differ only in whether a teacher exists and which terms the objective holds.
"""

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.config import MaskingConfig
from biodistil.data.masking import MaskingVocabulary, mask_tokens
from biodistil.methods.objective import Objective, TermInputs, position_masks
from biodistil.models.features import extract_features


class MaskedLMModule(nn.Module):
    """What the engine trains: the student and the objective's own parameters (projections).

    The teacher is held by reference only, so it is never trained, checkpointed, or wrapped for
    data-parallel training; it runs under `torch.no_grad` in eval mode.
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
            with torch.no_grad():
                teacher_features = extract_features(
                    self.teacher, teacher_batch, self.objective.teacher_request(),
                    self.objective.logit_positions(masks, teacher=True),
                )
        student_features = extract_features(
            self.student, batch, self.objective.student_request(), self.objective.logit_positions(masks)
        )
        inputs = TermInputs(
            student=student_features, teacher=teacher_features, labels=labels, attention_mask=attention,
            masks=masks, temperature=self.objective.cfg.temperature, shared_vocab=self.shared_vocab,
        )
        return self.objective(inputs)


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
