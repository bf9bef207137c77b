"""The units (words) a batch's two tokenizations share, as the objective's terms read them across tokenizers.

A batch aligned by `biodistil.data.token_alignment` carries, as its `alignment` (`UnitIds`), each side's unit id per
token (`student_units` [B, L_S], `teacher_units` [B, L_T], −1 for none), `unit_mask` [B, W] (the units each text has,
words and the [CLS]/[SEP] sequence units) and, once masked (`mask_same_words`), `chosen` [B, W] (the words masked on
both sides).
`WordUnits` is that record for one batch: the term kinds of `biodistil.methods.objective` read it to pool states,
attention and Q/K/V to units (`biodistil.losses.cross_tokenizer`), and to pair the two models' logit rows at the first
token of each masked word. Pooled states are P·h with each side's mean pooling matrix P [B, W, L] (`pool_to_words`:
one batched product); attention maps use the membership matrices. Both are built once per batch.
"""

from dataclasses import dataclass, field

import torch

from biodistil.data.batch import UnitIds
from biodistil.data.shared_vocabulary import SharedVocabulary
from biodistil.data.token_alignment import first_tokens, membership, pooling_matrix
from biodistil.losses.cross_tokenizer import pool_to_words


@dataclass
class WordUnits:
    """One batch's shared units (module docstring); `vocabulary`: the strings both vocabularies name (logit terms)."""

    student_units: torch.Tensor  # [B, L_S]
    teacher_units: torch.Tensor  # [B, L_T]
    unit_mask: torch.Tensor  # [B, W] bool
    chosen: torch.Tensor | None = None  # [B, W] bool: the words masked on both sides
    vocabulary: SharedVocabulary | None = None
    _memo: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, units: UnitIds, vocabulary: SharedVocabulary | None = None) -> "WordUnits":
        """The terms' view of a batch's alignment."""
        return cls(units.student_units, units.teacher_units, units.unit_mask.bool(),
                   None if units.chosen is None else units.chosen.bool(), vocabulary)

    @property
    def num_units(self) -> int:
        return self.unit_mask.size(1)

    def units(self, positions: str) -> torch.Tensor:
        """The units a term compares: "masked" → the masked words, else ("all", "known") every shared unit."""
        if positions == "masked":
            return self.masked_words
        return self.unit_mask

    @property
    def masked_words(self) -> torch.Tensor:
        if self.chosen is None:
            raise ValueError("this batch has no masked words (alignment.chosen): mask it with mask_same_words first")
        return self.chosen

    def pool_student(self, states: torch.Tensor) -> torch.Tensor:
        """[B, L_S, D] student states → [B, W, D] unit means P_S·h."""
        return pool_to_words(states, self.pooling("student"))

    def pool_teacher(self, states: torch.Tensor) -> torch.Tensor:
        """[B, L_T, D] teacher states → [B, W, D] unit means P_T·h."""
        return pool_to_words(states, self.pooling("teacher"))

    def pooling(self, side: str) -> torch.Tensor:
        """The mean pooling matrix P [B, W, L_side] of "student" or "teacher", built once per batch."""
        key = f"pooling_{side}"
        if key not in self._memo:
            units = self.student_units if side == "student" else self.teacher_units
            self._memo[key] = pooling_matrix(units, self.num_units)
        return self._memo[key]

    def membership(self, side: str) -> torch.Tensor:
        """M [B, W, L_side] (bool) of "student" or "teacher", built once per batch."""
        if side not in self._memo:
            units = self.student_units if side == "student" else self.teacher_units
            self._memo[side] = membership(units, self.num_units)
        return self._memo[side]

    def first_masked(self, side: str) -> torch.Tensor:
        """[B, L_side] bool: the first token of each masked word on that side; its rows in row-major order pair with
        the other side's (`first_tokens`)."""
        key = f"first_{side}"
        if key not in self._memo:
            units = self.student_units if side == "student" else self.teacher_units
            self._memo[key] = first_tokens(units, self.masked_words)
        return self._memo[key]
