"""Task-agnostic stages on a masked-LM objective: MLM pre-training and teacher -> student distillation.

Both train a `MaskedLMModule` (student + objective) on masked corpus blocks with the one engine; they
differ only in whether a teacher exists and which terms the objective holds.
"""

import functools
import time

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.config import MaskingConfig
from biodistil.data.masking import MaskingVocabulary, mask_tokens
from biodistil.methods.objective import Objective, TermInputs, position_masks
from biodistil.models.features import extract_features
from biodistil.teachers.loading import freeze
from biodistil.teachers.signal import OnlineTeacher, TeacherSignal
from biodistil.training.provenance import cpu_info


class MaskedLMModule(nn.Module):
    """What the engine trains: the student and the objective's own parameters (projections).

    The teacher's outputs come from a teacher signal (`biodistil.teachers.signal`): a teacher model (held by
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
            teacher_features = self.signal.get_signal(
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


BF16_FAST = 1.3  # a bf16 matmul at least this much faster than float32: the CPU computes bf16 natively
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of native bf16 matrix instructions (Linux /proc/cpuinfo)


def teacher_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The teacher's dtype for `teacher.dtype`: "auto" is bfloat16 where the hardware computes it fast — a GPU with
    bf16, a CPU with native bf16 instructions (AMX or AVX-512 BF16 among its flags; where the flags cannot be read,
    a bf16 matmul measuring at least `BF16_FAST`× its float32 one) — else float32. `dtype_note` says which and why.
    Deciding from the flags gives every process of a run the same answer."""
    if setting == "auto":
        fast = torch.cuda.is_bf16_supported() if device.type == "cuda" else (
            device.type == "cpu" and cpu_bf16_fast()[0])
        setting = "bfloat16" if fast else "float32"
    return torch.bfloat16 if setting == "bfloat16" else torch.float32


def dtype_note(setting: str, dtype: torch.dtype, device: torch.device) -> str:
    """A line for the run's report: the teacher's dtype and, for `auto`, what decided it."""
    name = str(dtype).removeprefix("torch.")
    if setting != "auto":
        return f"Teacher dtype: {name} (teacher.dtype)."
    if device.type != "cpu":
        return f"Teacher dtype: {name} (auto: {device.type} {'with' if name == 'bfloat16' else 'without'} fast bf16)."
    return f"Teacher dtype: {name} (auto: {cpu_bf16_fast()[1]})."


@functools.cache
def cpu_bf16_fast() -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively, and why: its flags, or (flags unreadable) a short measurement."""
    flags = cpu_info()[1]
    if flags is not None:
        found = [flag for flag in BF16_FLAGS if flag in flags]
        return bool(found), f"CPU flags {' '.join(found)}" if found else f"CPU flags without {' or '.join(BF16_FLAGS)}"
    speedup = cpu_bf16_speedup()
    return speedup >= BF16_FAST, f"a bf16 matmul ran {speedup:.2f}× as fast as float32 (bf16 from {BF16_FAST}×)"


@functools.cache
def cpu_bf16_speedup(size: int = 1024, repeats: int = 3) -> float:
    """How many times faster a [size × size] bf16 matmul runs than a float32 one on this CPU, with this process's
    threads (measured once per process, about 0.1 s): above 1 where the CPU has bf16 instructions, below where
    bf16 is emulated."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)

    def fastest(x: torch.Tensor, y: torch.Tensor) -> float:
        x @ y  # warm-up: kernels chosen, memory touched
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - began)
        return min(times)

    return fastest(a, b) / fastest(a.bfloat16(), b.bfloat16())


class MaskBatch:
    """The engine's per-batch hook: dynamic MLM masking with the engine's seeded generator."""

    def __init__(self, vocab: MaskingVocabulary, cfg: MaskingConfig):
        self.vocab, self.cfg = vocab, cfg

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        corrupted, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], self.vocab, self.cfg, generator)
        return {**batch, "input_ids": corrupted, "labels": labels}
