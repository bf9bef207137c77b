"""Task-agnostic stages on a masked-LM objective: MLM pre-training and teacher -> student distillation.

Both train a `MaskedLMModule` (student + objective) on masked corpus blocks with the one engine; they
differ only in whether a teacher exists and which terms the objective holds. Across tokenizers a batch holds both
tokenizations of the same texts and their shared words (`biodistil.data.text_blocks`), masked on both sides by
`MaskSameWords`, and the terms compare words (`biodistil.methods.word_units`).
"""

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.config import MaskingConfig
from biodistil.data.batch import Batch, UnitIds
from biodistil.data.masking import MaskingVocabulary, mask_tokens
from biodistil.data.token_alignment import AlignedBatch, corrupt_side, draw_words
from biodistil.methods.objective import Objective, TermInputs, position_masks
from biodistil.methods.several_teachers import each_teacher
from biodistil.methods.word_units import WordUnits
from biodistil.models.features import extract_features
from biodistil.teachers.loading import freeze
from biodistil.teachers.signal import OnlineTeacher, TeacherSignal


class MaskedLMModule(nn.Module):
    """What the engine trains: the student and the objective's own parameters (projections).

    The teacher's outputs come from a teacher signal (`biodistil.teachers.signal`): a teacher model (held by
    reference only, so it is never trained, checkpointed, or wrapped for data-parallel training; it runs under
    `torch.inference_mode` in eval mode) or a teacher cache. The module never asks which.
    """

    def __init__(self, student: PreTrainedModel, objective: Objective,
                 teacher: PreTrainedModel | TeacherSignal | Sequence[TeacherSignal] | None = None,
                 shared_vocab: int | None = None):
        super().__init__()
        self.student = student
        self.objective = objective
        self.shared_vocab = shared_vocab  # VE-KD: the teacher's vocabulary size, a prefix of the student's
        signals = list(teacher) if isinstance(teacher, Sequence) else [
            OnlineTeacher(teacher) if isinstance(teacher, nn.Module) else teacher]
        self._signals = tuple(signals)  # a tuple hides the teachers from nn.Module registration
        for signal in signals:
            if signal is not None and signal.model is not None:
                freeze(signal.model)

    @property
    def signal(self) -> TeacherSignal | None:
        """The first teacher's signal (the only one, but for several teachers)."""
        return self._signals[0]

    @property
    def signals(self) -> tuple[TeacherSignal, ...]:
        """Every teacher's signal, in slot order."""
        return self._signals

    @property
    def teacher(self) -> PreTrainedModel | None:
        return self.signal.model if self.signal is not None else None

    @property
    def uses_kl_rows(self) -> bool:
        """Whether a term computes a KL over logit rows (`train.compile` compiles that kernel only then)."""
        return any(term.loss == "logit_kl" for term in self.objective.cfg.terms)

    @property
    def kl_columns(self) -> int:
        """The width of the vocabulary KL's rows: the teacher's vocabulary under VE-KD (a prefix of the student's),
        else the student's (across tokenizers, the shared strings are fewer) — `train.compile: auto` leaves rows
        narrower than a real vocabulary eager."""
        return int(self.shared_vocab or self.student.config.vocab_size)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One student pass and the teacher's outputs from its signal (no gradients). A batch aligned across
        tokenizers (its `alignment`) gives the terms its shared words, and the teacher its own positions."""
        labels, attention = batch.labels, batch.attention_mask.bool()
        masks = position_masks(attention, labels, batch.masks.get("new_tokens"))
        units = [] if batch.alignment is None else [  # across tokenizers: the words each teacher shares
            WordUnits.of(teacher_alignment(batch, slot), self.objective.vocabularies[slot])
            for slot in range(len(self.signals))]
        teachers = []
        if self.objective.needs_teacher:  # several teachers: one after another, each only for its own terms
            for slot, signal in enumerate(self.signals):
                teacher_masks = teacher_position_masks(batch, units[slot], slot) if units else masks
                teachers.append(signal.get_signal(batch, self.objective.teacher_request(slot),
                                                  self.objective.logit_positions(teacher_masks, teacher=True)))
        student_features = extract_features(
            self.student, batch.inputs, self.objective.student_request(), self.objective.logit_positions(masks)
        )
        inputs = TermInputs(student=student_features, teacher=teachers[0] if teachers else None, labels=labels,
                            attention_mask=attention, masks=masks, temperature=self.objective.cfg.temperature,
                            shared_vocab=self.shared_vocab, units=units[0] if units else None,
                            by_teacher=each_teacher(teachers, units))
        return self.objective(inputs)


def teacher_alignment(batch: Batch, slot: int) -> UnitIds:
    """The batch's alignment as teacher `slot` reads it: its own tokens' unit ids (a further teacher's payload holds
    them), the units every side shares."""
    if slot == 0:
        return batch.alignment
    return replace(batch.alignment, teacher_units=batch.payload(slot)["unit_ids"])


def teacher_position_masks(batch: Batch, units: WordUnits, slot: int = 0) -> dict[str, torch.Tensor]:
    """Teacher `slot`'s named position sets across tokenizers ([B, L_T]): "all" and "known" its real tokens, "masked"
    the first token of each masked word — where its logits are compared with the student's."""
    real = batch.payload(slot)["attention_mask"].bool()
    return {"all": real, "known": real, "masked": units.first_masked("teacher")}


class MaskBatch:
    """The engine's per-batch hook: dynamic MLM masking with the engine's seeded generator."""

    def __init__(self, vocab: MaskingVocabulary, cfg: MaskingConfig):
        self.vocab, self.cfg = vocab, cfg

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        corrupted, labels = mask_tokens(batch.input_ids, batch.attention_mask, self.vocab, self.cfg, generator)
        return batch.replace(inputs={**batch.inputs, "input_ids": corrupted}, labels=labels)


class MaskSameWords:
    """The engine's per-batch hook across tokenizers: whole-word masking of the same words on both sides
    (`mask_same_words`: each shared word chosen with `masking.probability`, one 80/10/10 draw per word for both
    sides) with the engine's seeded generator. Sets the student's `labels` (every token of a chosen word), the
    teacher's corrupted `input_ids` and the alignment's `chosen` words [B, W]."""

    def __init__(self, student_vocab: MaskingVocabulary, teacher_vocab: MaskingVocabulary, cfg: MaskingConfig,
                 more_vocabs: Sequence[MaskingVocabulary] = ()):
        self.student_vocab, self.teacher_vocab, self.cfg = student_vocab, teacher_vocab, cfg
        self.more_vocabs = tuple(more_vocabs)  # several teachers: each further teacher's vocabulary

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        aligned = AlignedBatch.from_batch(batch)
        words = draw_words(aligned.word_mask, self.cfg, generator)
        student = corrupt_side(aligned.student_inputs["input_ids"], aligned.student_units, words, self.student_vocab,
                               generator)
        teachers = [{**batch.teacher, "input_ids": corrupt_side(aligned.teacher_inputs["input_ids"],
                                                                aligned.teacher_units, words, self.teacher_vocab,
                                                                generator).input_ids}]
        for slot, vocab in enumerate(self.more_vocabs, start=1):
            payload = batch.payload(slot)
            side = corrupt_side(payload["input_ids"], payload["unit_ids"], words, vocab, generator)
            teachers.append({**payload, "input_ids": side.input_ids})
        return batch.replace(inputs={**batch.inputs, "input_ids": student.input_ids}, labels=student.labels,
                             teachers=teachers, alignment=replace(batch.alignment, chosen=words[0]))
