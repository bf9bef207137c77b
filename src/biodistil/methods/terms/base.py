"""What every term form reads: the resolved recipe term (`Term`), one batch's features (`TermInputs`) and the objective
that owns the learned projections (`TermOwner`)."""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from biodistil.config import TermConfig
from biodistil.data.masking import IGNORE_INDEX
from biodistil.data.shared_vocabulary import SharedVocabulary
from biodistil.losses.distillation import KLRows
from biodistil.methods.word_units import WordUnits
from biodistil.models.features import Features
from biodistil.term_specs import TERM_SPECS, TermSpec

Pairs = tuple[tuple[int, int], ...]
Weight = float | torch.Tensor


@dataclass(frozen=True)
class Term:
    """A recipe term resolved against the models: its (student, teacher) layer pairs and its log name."""

    cfg: TermConfig
    pairs: Pairs
    name: str
    relation_heads: int | None = None
    windows: tuple[int | None, ...] = ()  # attention terms: per pair, the narrower window of the two layers
    teacher: int | str = 0  # the key of the teacher features it reads (`TermInputs.for_term`)
    share: float = 1.0  # its share of the recipe term: its weight is w·share (`methods.several_teachers.expand`)

    @property
    def family(self) -> str:
        """The recipe term's log name: `name` without a teacher's `@k`."""
        return self.name.partition("@")[0]

    @property
    def spec(self) -> TermSpec:
        return TERM_SPECS[self.cfg.loss]

    @property
    def positions(self) -> str:
        """The position set the term reads: its kind's fixed one (MLM targets, labelled positions) or the recipe's."""
        return self.spec.positions or self.cfg.positions


@dataclass
class TermInputs:
    """Everything a term may read for one batch."""

    student: Features
    teacher: Features | None
    labels: torch.Tensor | None  # [B, L] (a classifier of sequences: [B, 1]), IGNORE_INDEX where no target;
    #                              multi-label classifiers: [B, C] 0/1; None: no gold labels in this batch
    attention_mask: torch.Tensor  # [B, L] bool
    masks: dict[str, torch.Tensor]  # bool positions by name, shaped like the logit positions: "all", "masked",
    #                                 "known" (masked LMs); "all", "masked", "cls" (classifiers, kd.objective)
    temperature: float
    shared_vocab: int | None = None  # KD logits compare only the first `shared_vocab` columns (VE-KD)
    multi_label: bool = False  # classes are independent (sigmoid per class): multi-label classification
    units: WordUnits | None = None  # across tokenizers: the words both sides share; terms compare them, not tokens
    by_teacher: dict[int | str, tuple[Features, WordUnits | None]] = field(default_factory=dict)  # the teacher (and
    #   its words) a term reads by its key `Term.teacher`, where not `teacher` (`methods.several_teachers.mix`)

    def for_term(self, term: Term) -> "TermInputs":
        """These inputs with the teacher features `term` reads (and the words they share with the student)."""
        if term.teacher not in self.by_teacher:
            return self
        teacher, units = self.by_teacher[term.teacher]
        return replace(self, teacher=teacher, units=self.units if units is None else units)

    def reads_formed(self, term: Term) -> bool:
        """Whether `term` reads the student's logits formed (materialised) at its positions: declared before the terms
        run (`LogitRows.planned`). The KL forms them inside the loss where it can; across tokenizers it reads them at
        the masked words' first tokens."""
        formed = term.spec.formed
        if formed == "unless_fused":
            return self.units is not None or not self.student.logits.fuses_kl(self.teacher.logits, self.shared_vocab)
        return formed == "always"


class TermOwner(Protocol):
    """The objective a term belongs to: it owns the learned projections, across tokenizers the shared strings, and the
    vocabulary KL's row kernel (`kl_rows`: compiled by `train.compile`, or None for eager rows)."""

    vocabulary: SharedVocabulary | None
    kl_rows: KLRows | None

    def project(self, term: Term, student_layer: int, teacher_layer: int, hidden: torch.Tensor) -> torch.Tensor: ...


Compute = Callable[[TermOwner, Term, TermInputs], torch.Tensor]


@dataclass(frozen=True)
class TermForms:
    """How one term kind computes: token by token, and across tokenizers (None: it has no word form)."""

    tokens: Compute
    words: Compute | None = None


def position_masks(
    attention_mask: torch.Tensor, labels: torch.Tensor, new_tokens: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The named position sets terms choose from: all non-padding, MLM targets, and non-padding tokens the
    teacher knows (all non-padding unless VE-KD marked new tokens)."""
    real = attention_mask.bool()
    known = real & ~new_tokens.bool() if new_tokens is not None else real
    return {"all": real, "masked": labels != IGNORE_INDEX, "known": known}


def reduce_layers(values: list[torch.Tensor], how: str) -> torch.Tensor:
    """Σ_l L(l), or (1/M)·Σ_l L(l) with how="mean", over the term's layer pairs."""
    total = torch.stack(values).sum()
    return total / len(values) if how == "mean" else total


def zero_like_logits(x: TermInputs) -> torch.Tensor:
    """A zero that keeps the student's logits in the graph (a batch with nothing to compare)."""
    return x.student.logits.logits().float().sum() * 0.0
