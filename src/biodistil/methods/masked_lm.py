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
from biodistil.methods.teacher_signal import OnlineTeacher, TeacherSignal, freeze
from biodistil.models.features import extract_features


class MaskedLMModule(nn.Module):
    """What the engine trains: the student and the objective's own parameters (projections).

    The teacher's outputs come from a teacher signal (`biodistil.methods.teacher_signal`): a teacher model (held by
    reference only, so it is never trained, checkpointed, or wrapped for data-parallel training; it runs under
    `torch.inference_mode` in eval mode) or a teacher cache. The module never asks which.
    """

    def __init__(
        self, student: PreTrainedModel, objective: Objective, teacher: PreTrainedModel | TeacherSignal | None = None,
        shared_vocab: int | None = None,
    ):
        super().__init__()
        self.student = student
        self.objective = objective
        self.shared_vocab = shared_vocab  # VE-KD: the teacher's vocabulary size, a prefix of the student's
        signal = OnlineTeacher(teacher) if isinstance(teacher, nn.Module) else teacher
        self._signal = (signal,)  # a tuple hides the teacher from nn.Module registration
        if signal is not None and signal.model is not None:
            freeze(signal.model)

    @property
    def signal(self) -> TeacherSignal | None:
        return self._signal[0]

    @property
    def teacher(self) -> PreTrainedModel | None:
        return self.signal.model if self.signal is not None else None

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One student pass and the teacher's outputs from its signal (no gradients)."""
        labels, attention = batch["labels"], batch["attention_mask"].bool()
        masks = position_masks(attention, labels, batch.get("new_tokens"))
        teacher_features = None
        if self.objective.needs_teacher:
            teacher_features = self.signal.outputs(
                batch, self.objective.teacher_request(), self.objective.logit_positions(masks, teacher=True)
            )
        student_features = extract_features(
            self.student, batch, self.objective.student_request(), self.objective.logit_positions(masks)
        )
        inputs = TermInputs(
            student=student_features, teacher=teacher_features, labels=labels, attention_mask=attention,
            masks=masks, temperature=self.objective.cfg.temperature, shared_vocab=self.shared_vocab,
        )
        return self.objective(inputs)


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


class MaskBatch:
    """The engine's per-batch hook: dynamic MLM masking with the engine's seeded generator."""

    def __init__(self, vocab: MaskingVocabulary, cfg: MaskingConfig):
        self.vocab, self.cfg = vocab, cfg

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        corrupted, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], self.vocab, self.cfg, generator)
        return {**batch, "input_ids": corrupted, "labels": labels}
