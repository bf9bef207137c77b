"""Objectives: a method is a weighted list of loss terms chosen in the recipe.

Each term declares the features it needs from the student and the teacher, and computes one scalar from
them with a pure loss function from `biodistil.losses`. Adding a method means adding terms (here) and a
recipe, not a new training loop. Learned projections (student width -> teacher width) belong to the
objective: they are trained and checkpointed with the student, but never exported.

Layer terms compare one (student layer, teacher layer) pair or, with `layer_map`, every student
transformer layer l = 1..M with teacher layer g(l) (uniform or explicit, `biodistil.methods.layer_map`).
Attention terms compare the two maps on the keys both layers can see: when one of them is a local
(sliding-window) layer, the other's attention is restricted to the same window and renormalised.
A term with `epsilon` passes through the VE-KD tolerance hinge max(W·L − ε, 0) before its weight.
Logit terms read each model's `LogitRows` (`biodistil.models.logits`), which forms, restricts and compares the
logits; before any term runs, `weighted_sum` declares at which rows terms read the student's formed logits, so the
order of the terms never changes what is computed.

Across tokenizers (a student vocabulary that is not the teacher's) a batch carries the words both tokenizations
hold whole (`TermInputs.units`, `biodistil.methods.word_units`) and each kind computes its word-level form with the
losses of `biodistil.losses.cross_tokenizer`: hidden states, attention maps and Q/K/V pooled to words, `logit_kl` as
the KL over the strings both vocabularies name and `uld` (universal logit distillation) at the first token of each
masked word on each side; `soft_ce` and `logit_mse` have none (`biodistil.methods.cross_tokenizer` refuses them first).

The registry `TERM_KINDS` is shared by both halves of the toolkit. Task-specific distillation
(`biodistil.kd.objective`) reads a classifier's outputs as features (logit rows at token positions, or one row
per example) and combines the same logit terms (`logit_kl` is Hinton's KD, `logit_mse`) with the terms that only
classifiers have: `ce` (gold labels), `sigmoid_kd` and `patient_kd` ([CLS] states). Every method sums its terms
with `weighted_sum`: one dispatch.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from biodistil.config import ObjectiveConfig, TermConfig
from biodistil.data.masking import IGNORE_INDEX
from biodistil.data.shared_vocabulary import SharedVocabulary
from biodistil.errors import BiodistilError
from biodistil.losses.cross_tokenizer import (
    shared_vocab_kl_loss,
    uld_loss,
    word_attention_kl_loss,
    word_attention_mse_loss,
)
from biodistil.losses.distillation import cosine_embedding_loss, masked_lm_loss
from biodistil.losses.layers import (
    attention_kl_loss,
    attention_mse_loss,
    hidden_mse_loss,
    minilm_relations_loss,
    tolerance_hinge,
)
from biodistil.losses.prediction import soft_cross_entropy_loss
from biodistil.losses.task import logit_mse_loss, patient_kd_loss, sigmoid_kd_loss
from biodistil.methods.layer_map import explicit_layer_map, uniform_layer_map
from biodistil.methods.word_units import WordUnits
from biodistil.models.attention import restrict_to_window
from biodistil.models.families import attention_window, hidden_size, num_heads, num_layers, qkv_widths
from biodistil.models.features import FeatureRequest, Features, normalise_block, normalise_layer
from biodistil.models.loading import untrained_head_weights

Pairs = tuple[tuple[int, int], ...]
FeatureKind = Literal["logits", "hidden", "attention", "qkv", "cls"]
Weight = float | torch.Tensor


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


def position_masks(
    attention_mask: torch.Tensor, labels: torch.Tensor, new_tokens: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The named position sets terms choose from: all non-padding, MLM targets, and non-padding tokens the
    teacher knows (all non-padding unless VE-KD marked new tokens)."""
    real = attention_mask.bool()
    known = real & ~new_tokens.bool() if new_tokens is not None else real
    return {"all": real, "masked": labels != IGNORE_INDEX, "known": known}


@dataclass(frozen=True)
class Term:
    """A recipe term resolved against the models: its (student, teacher) layer pairs and its log name."""

    cfg: TermConfig
    pairs: Pairs
    name: str
    relation_heads: int | None = None
    windows: tuple[int | None, ...] = ()  # attention terms: per pair, the narrower window of the two layers


@dataclass(frozen=True)
class TermKind:
    """A kind of loss term: which features it reads and how it is computed; `cached`: whether it can read a teacher
    cache instead of a running teacher (top-k logits at the masked positions, hidden states of mapped layers);
    `formed`: whether it reads the student's logits formed (materialised) at its positions (a function of the
    batch's inputs where that depends on them), declared before the terms run (`planned_inputs`)."""

    needs_teacher: bool
    features: FeatureKind
    compute: Callable[["Objective", Term, TermInputs], torch.Tensor]
    cached: bool = False
    formed: bool | Callable[[TermInputs], bool] = False

    def positions(self, cfg: TermConfig) -> str:
        return "masked" if cfg.loss in ("mlm", "ce") else cfg.positions

    def forms(self, inputs: TermInputs) -> bool:
        return self.formed(inputs) if callable(self.formed) else self.formed


# ------------------------------------------------------------------------------------------ logit terms
def _mlm(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """CE(labels, student) over the MLM targets (over the student's whole vocabulary)."""
    rows = x.masks["masked"]
    return masked_lm_loss(x.student.logits.at(rows).logits(), x.labels[rows])


def _logit_rows(term: Term, x: TermInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher logits at the term's positions, over the vocabulary both models share."""
    rows = x.masks[term.cfg.positions]
    student, teacher = x.student.logits.at(rows).logits(), x.teacher.logits.at(rows).logits()
    if x.shared_vocab is not None:
        student, teacher = student[:, : x.shared_vocab], teacher[:, : x.shared_vocab]
    return student, teacher


def _logit_kl(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """T²·KL(softmax(z_T/T) ‖ softmax(z_S/T)) at the term's positions over the shared vocabulary; from a teacher
    cache, the KL over the teacher's top-k tokens and the tail (`topk_kl_loss`). `LogitRows.soft_kl` chooses the
    loss: on a student head it forms the logits inside the loss (`linear_soft_kl_loss`) except at the rows other
    terms read formed (the MLM targets), whose formed logits it reads. Across tokenizers: the shared-string KL
    T²·(1/N)·Σ_rows Σ_k q_T(k)·log(q_T(k)/q_S(k)) at the first token of each masked word (`shared_vocab_kl_loss`)."""
    if x.units is not None:
        vocabulary = _shared_strings(objective, term)
        return shared_vocab_kl_loss(*_aligned_logits(x), vocabulary.student_index, vocabulary.teacher_index,
                                    vocabulary.size, x.temperature)
    rows = x.masks[term.cfg.positions]
    return x.student.logits.at(rows).soft_kl(x.teacher.logits.at(rows), x.temperature, x.shared_vocab)


def _kl_forms(x: TermInputs) -> bool:
    """Whether the KL reads the student's formed logits (it cannot form them inside the loss; across tokenizers it
    reads them at the masked words' first tokens)."""
    return x.units is not None or not x.student.logits.fuses_kl(x.teacher.logits, x.shared_vocab)


def _uld(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """Universal logit distillation (Boizard et al., 2024), (1/N)·Σ_rows Σ_i |p_S,(i) − p_T,(i)| on the sorted
    probabilities p = softmax(z/T) (`uld_loss`): at the term's positions, or across tokenizers at the first token of
    each masked word on each side. It needs no shared token: it covers what the shared strings miss."""
    if x.units is not None:
        return uld_loss(*_aligned_logits(x), x.temperature)
    rows = x.masks[term.cfg.positions]
    return uld_loss(x.student.logits.at(rows).logits(), x.teacher.logits.at(rows).logits(), x.temperature)


def _aligned_logits(x: TermInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Across tokenizers: the student's logits [N, V_S] at the first token of each masked word, read from its logits
    formed at the MLM targets (the words' tokens), and the teacher's [N, V_T], computed at those first tokens only;
    row n of both is the same word."""
    student = x.student.logits.at(x.masks["masked"]).logits_at(x.units.first_masked("student"))
    return student, x.teacher.logits.logits()


def _shared_strings(objective: "Objective", term: Term) -> SharedVocabulary:
    vocabulary = getattr(objective, "vocabulary", None)
    if vocabulary is None:
        raise BiodistilError(f"Objective term {term.cfg.loss} across tokenizers needs the strings both vocabularies "
                             "share (Objective(..., vocabulary=shared_vocabulary(...)))")
    return vocabulary


def _soft_ce(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """TinyBERT output loss −Σ softmax(z_T/T)·log softmax(z_S/T), mean over the term's positions."""
    _same_tokens(term, x)
    return soft_cross_entropy_loss(*_logit_rows(term, x), x.temperature)


def _same_tokens(term: Term, x: TermInputs) -> None:
    """Terms that compare logits entry by entry have no form across tokenizers (the pre-flight refuses them)."""
    if x.units is not None:
        raise BiodistilError(f"Objective term {term.cfg.loss} compares logits over one vocabulary; across tokenizers "
                             "use logit_kl (shared strings) and uld")


def _logit_mse(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """(1/N)·Σ_rows of the squared errors over the shared vocabulary, averaged (`vocab_reduction: mean`) or
    summed (`sum`, VE-KD's L′_MSE) over it, at the term's N positions."""
    _same_tokens(term, x)
    return logit_mse_loss(*_logit_rows(term, x), class_reduction=term.cfg.vocab_reduction)


# ------------------------------------------------------------------------------------------ classifier terms
def _ce(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """CE(y, z_S) with the gold labels: softmax CE at the labelled positions (per example, or per labelled
    sub-word of a token task), or per-label BCE for multi-label tasks; 0 when the batch has no labels."""
    if x.labels is None:
        return x.student.logits.logits().float().sum() * 0.0
    if x.multi_label:
        logits = x.student.logits.at(x.masks["masked"]).logits()
        return F.binary_cross_entropy_with_logits(logits.float(), x.labels.float())
    return _mlm(objective, term, x)


def _sigmoid_kd(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """Label-free binary KD BCE(σ(z_T/T), σ(z_S/T)) of the positive class (z = z_1 − z_0 for two logits), at the
    term's positions; per label for multi-label tasks."""
    student, teacher = _logit_rows(term, x)
    if x.multi_label:
        student, teacher = student.reshape(-1), teacher.reshape(-1)
    return sigmoid_kd_loss(student, teacher, x.temperature)


def _patient_kd(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """PatientKD Σ_i MSE(h_S,i/‖h_S,i‖, h_T,g(i)/‖h_T,g(i)‖) of the [CLS] states (position 0) of the term's layer
    pairs, over the examples whose teacher [CLS] is known (mask "cls")."""
    rows = x.masks["cls"]
    if not bool(rows.any()):
        return x.student.logits.logits().float().sum() * 0.0
    student = [x.student.hidden_at(s)[:, :1][rows] for s, _ in term.pairs]
    teacher = [x.teacher.hidden_at(t)[:, :1][rows].to(student[0].dtype) for _, t in term.pairs]
    return patient_kd_loss(student, teacher)


# ------------------------------------------------------------------------------------------ layer terms
def _reduce(values: list[torch.Tensor], how: str) -> torch.Tensor:
    """Σ_l L(l), or (1/M)·Σ_l L(l) with how="mean", over the term's layer pairs."""
    total = torch.stack(values).sum()
    return total / len(values) if how == "mean" else total


def _hidden(loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]):
    """A hidden-state term: loss(h_S^l·W_l, h_T^g(l)) at the term's positions, for every layer pair. Across
    tokenizers the same loss on unit means, loss(P_S·h_S^l·W_l, P_T·h_T^g(l)) over the shared units (`positions:
    masked`: the masked words) — `word_hidden_mse_loss` / `word_hidden_cosine_loss`; the projection is affine and the
    pooling a mean, so projecting the pooled states is the same."""
    def compute(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
        if x.units is not None:
            units = x.units
            values = [loss(objective.project(term, s, t, units.pool_student(x.student.hidden_at(s))),
                           units.pool_teacher(x.teacher.hidden_at(t)), units.units(term.cfg.positions))
                      for s, t in term.pairs]
            return _reduce(values, term.cfg.layer_reduction)
        mask = x.masks[term.cfg.positions]
        values = [
            loss(objective.project(term, s, t, x.student.hidden_at(s)), x.teacher.hidden_at(t), mask)
            for s, t in term.pairs
        ]
        return _reduce(values, term.cfg.layer_reduction)

    return compute


def _attention_pairs(term: Term, x: TermInputs, scores: bool = False):
    """(a_S^l, a_T^g(l), w) per layer pair: both maps on the keys both layers see (window w; None: every key)."""
    if scores:
        student, teacher = x.student.attention_scores_at, x.teacher.attention_scores_at
        return [(student(s), teacher(t), w) for (s, t), w in zip(term.pairs, term.windows, strict=True)]
    return [
        (restrict_to_window(x.student.attention_at(s), w), restrict_to_window(x.teacher.attention_at(t), w), w)
        for (s, t), w in zip(term.pairs, term.windows, strict=True)
    ]


def _word_attention(term: Term, x: TermInputs, loss: Callable[..., torch.Tensor], **options) -> torch.Tensor:
    """Across tokenizers: Σ_l loss on the word × word maps of each layer pair (`pool_attention`: keys summed,
    queries averaged, rows renormalised), each model's probabilities as its own layer computes them (a local
    layer's are zero outside its window)."""
    if term.cfg.attention_map == "scores":
        raise BiodistilError("attention_map: scores does not pool into words; use attention_map: probabilities")
    members = x.units.membership("student"), x.units.membership("teacher")
    values = [loss(x.student.attention_at(s), x.teacher.attention_at(t), *members, x.units.unit_mask, **options)
              for s, t in term.pairs]
    return _reduce(values, term.cfg.layer_reduction)


def _attention_mse(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """Σ_l (1/H)·Σ_heads MSE(a_S^l, a_T^g(l)) over real (query, key) pairs, on attention probabilities or, with
    `attention_map: scores`, on the unnormalised scores Q·Kᵀ/√d (TinyBERT). Across tokenizers on word × word maps of
    probabilities (`word_attention_mse_loss`)."""
    if x.units is not None:
        return _word_attention(term, x, word_attention_mse_loss)
    pairs = _attention_pairs(term, x, scores=term.cfg.attention_map == "scores")
    values = [attention_mse_loss(student, teacher, x.attention_mask, window) for student, teacher, window in pairs]
    return _reduce(values, term.cfg.layer_reduction)


def _attention_kl(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """Σ_l KL(a_S^l ‖ a_T^g(l)) per query row, averaged (CompactBioBERT) or summed (MobileBERT) over tokens; across
    tokenizers per query word of the word × word maps (`word_attention_kl_loss`)."""
    if x.units is not None:
        return _word_attention(term, x, word_attention_kl_loss, reduction=term.cfg.token_reduction)
    values = [
        attention_kl_loss(student, teacher, x.attention_mask, term.cfg.token_reduction, window=window)
        for student, teacher, window in _attention_pairs(term, x)
    ]
    return _reduce(values, term.cfg.layer_reduction)


def _minilm(objective: "Objective", term: Term, x: TermInputs) -> torch.Tensor:
    """MiniLMv2 Σ_r KL(R_T^r ‖ R_S^r) for r in the term's relations (Q-Q, K-K, V-V); across tokenizers on the
    unit means of Q, K and V over the shared units (`word_relations_loss`)."""
    ((s, t),) = term.pairs
    student, teacher, mask = x.student.qkv_at(s), x.teacher.qkv_at(t), x.attention_mask
    if x.units is not None:
        student = {r: x.units.pool_student(v) for r, v in student.items()}
        teacher = {r: x.units.pool_teacher(v) for r, v in teacher.items()}
        mask = x.units.unit_mask
    return minilm_relations_loss(student, teacher, mask, term.relation_heads, term.cfg.relations)


TERM_KINDS: dict[str, TermKind] = {
    "mlm": TermKind(False, "logits", _mlm, formed=True),
    "logit_kl": TermKind(True, "logits", _logit_kl, cached=True, formed=_kl_forms),
    "uld": TermKind(True, "logits", _uld, formed=True),
    "soft_ce": TermKind(True, "logits", _soft_ce, formed=True),
    "logit_mse": TermKind(True, "logits", _logit_mse, formed=True),
    "hidden_cosine": TermKind(True, "hidden", _hidden(cosine_embedding_loss), cached=True),
    "hidden_mse": TermKind(True, "hidden", _hidden(hidden_mse_loss), cached=True),
    "attention_mse": TermKind(True, "attention", _attention_mse),
    "attention_kl": TermKind(True, "attention", _attention_kl),
    "minilm_relations": TermKind(True, "qkv", _minilm),
    "ce": TermKind(False, "logits", _ce, formed=True),
    "sigmoid_kd": TermKind(True, "logits", _sigmoid_kd, formed=True),
    "patient_kd": TermKind(True, "cls", _patient_kd),
}
_REQUEST_FIELD = {"hidden": "hidden", "attention": "attentions", "qkv": "qkv"}


class Objective(nn.Module):
    """The weighted sum of the recipe's terms; owns the learned projections the terms need."""

    def __init__(self, cfg: ObjectiveConfig, student: PreTrainedModel, teacher: PreTrainedModel | None,
                 vocabulary: SharedVocabulary | None = None):
        super().__init__()
        self.cfg = cfg
        self.vocabulary = vocabulary  # across tokenizers: the strings both vocabularies share (logit_kl)
        needing = [t.loss for t in cfg.terms if TERM_KINDS[t.loss].needs_teacher]
        if teacher is None and needing:
            raise BiodistilError(f"Objective terms {needing} need a teacher, and this stage has none")
        if teacher is not None:
            _check_teacher_head(cfg, teacher)
        self.terms: list[Term] = []
        for term_cfg in cfg.terms:
            self.terms.append(_resolve(term_cfg, student, teacher, {t.name for t in self.terms}))
        self.projections = nn.ModuleDict()
        for term in self.terms:
            if TERM_KINDS[term.cfg.loss].features == "hidden":
                self._add_projections(term, student, teacher)

    def _add_projections(self, term: Term, student: PreTrainedModel, teacher: PreTrainedModel) -> None:
        """W_h (and W_e for the embeddings) per mapped layer pair, only when the widths differ."""
        d_student, d_teacher = hidden_size(student.config), hidden_size(teacher.config)
        if d_student == d_teacher:
            return
        for s, t in term.pairs:
            key = self._projection_key(term, s, t)
            if key not in self.projections:
                self.projections[key] = nn.Linear(d_student, d_teacher)

    @staticmethod
    def _projection_key(term: Term, student_layer: int, teacher_layer: int) -> str:
        if term.cfg.layer_map is None:  # a single pair keeps the recipe's own indices (as in older checkpoints)
            student_layer, teacher_layer = term.cfg.student_layer, term.cfg.teacher_layer
        return f"{term.cfg.loss}_s{student_layer}_t{teacher_layer}".replace("-", "m")

    def project(self, term: Term, student_layer: int, teacher_layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """h_S·W (+ b) for the pair's projection, or h_S unchanged when the widths match."""
        key = self._projection_key(term, student_layer, teacher_layer)
        return self.projections[key](hidden) if key in self.projections else hidden

    @property
    def needs_teacher(self) -> bool:
        return any(TERM_KINDS[t.cfg.loss].needs_teacher for t in self.terms)

    def student_request(self) -> FeatureRequest:
        return _merged(_request(t, teacher=False) for t in self.terms)

    def teacher_request(self) -> FeatureRequest:
        return _merged(_request(t, teacher=True) for t in self.terms if TERM_KINDS[t.cfg.loss].needs_teacher)

    def cache_request(self) -> FeatureRequest:
        """What a teacher cache must hold for these terms (`teacher_request`), after checking that every teacher
        term can read one: a cache keeps the top-k logits at the masked positions and hidden states."""
        for term in self.terms:
            kind = TERM_KINDS[term.cfg.loss]
            if kind.needs_teacher and not kind.cached:
                cacheable = sorted(name for name, k in TERM_KINDS.items() if k.cached)
                raise BiodistilError(f"Objective term {term.cfg.loss} needs the running teacher ({kind.features}); a "
                                     f"teacher cache serves {', '.join(cacheable)}. Remove teacher_cache or the term")
            if kind.needs_teacher and kind.features == "logits" and term.cfg.positions != "masked":
                raise BiodistilError(f"Objective term {term.cfg.loss} with positions: {term.cfg.positions}: a teacher "
                                     "cache holds the teacher's logits at the masked positions only; use positions: "
                                     "masked (DistilBERT's soft MLM) or remove teacher_cache")
        return self.teacher_request()

    def logit_positions(self, masks: dict[str, torch.Tensor], teacher: bool = False) -> torch.Tensor | None:
        """Union of the positions of the terms that read this model's logits (None when none does). Every named
        set lies within "all", so a union that holds it is that very tensor (its terms then read the logits
        without a copy, `LogitRows.at`)."""
        kinds = [(TERM_KINDS[term.cfg.loss], term.cfg) for term in self.terms]
        names = {kind.positions(cfg) for kind, cfg in kinds
                 if kind.features == "logits" and (kind.needs_teacher or not teacher)}
        if not names:
            return None
        if "all" in names:
            return masks["all"]
        chosen = None
        for name in sorted(names):
            chosen = masks[name] if chosen is None else chosen | masks[name]
        return chosen

    def forward(self, inputs: TermInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return weighted_sum(self, self.terms, inputs)


def weighted_sum(objective: object, terms: Iterable[Term], inputs: TermInputs,
                 weights: dict[str, Weight] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = Σ_k w_k·L_k over the terms, each computed by its kind in `TERM_KINDS` (the one dispatch of every
    method), and each term's unweighted value for the logs. `weights` replaces the recipe weight of the terms it
    names (MetaAdaptiveKD's learned α and β, tensors that receive gradients). What is computed does not depend on
    the order of the terms: the rows read as formed logits are declared first (`planned_inputs`)."""
    terms = list(terms)
    inputs = planned_inputs(terms, inputs)
    total = torch.zeros((), device=inputs.attention_mask.device)
    logs = {}
    for term in terms:
        value = TERM_KINDS[term.cfg.loss].compute(objective, term, inputs)
        if term.cfg.epsilon is not None:
            logs[f"{term.name}_raw"] = value.detach()
            value = tolerance_hinge(value, term.cfg.hinge_weight, term.cfg.epsilon)
        logs[term.name] = value.detach()
        weight = term.cfg.weight if weights is None else weights.get(term.name, term.cfg.weight)
        total = total + weight * value
    return total, logs


def planned_inputs(terms: list[Term], inputs: TermInputs) -> TermInputs:
    """`inputs` with the student's logit rows told, before any term runs, at which positions the terms read formed
    logits (`LogitRows.planned`; by position name, in sorted order, so the plan does not depend on the order of
    the terms either)."""
    if inputs.student.logits is None:
        return inputs
    names = sorted({TERM_KINDS[t.cfg.loss].positions(t.cfg) for t in terms if TERM_KINDS[t.cfg.loss].forms(inputs)})
    rows = inputs.student.logits.planned([inputs.masks[name] for name in names])
    return replace(inputs, student=replace(inputs.student, logits=rows))


def _check_teacher_head(cfg: ObjectiveConfig, teacher: PreTrainedModel) -> None:
    """Pre-flight: terms that read the teacher's vocabulary logits need a teacher whose MLM head was trained."""
    untrained = untrained_head_weights(teacher)
    kinds = {t.loss: TERM_KINDS[t.loss] for t in cfg.terms}
    reading = [name for name, kind in kinds.items() if kind.needs_teacher and kind.features == "logits"]
    if untrained and reading:
        raise BiodistilError(
            f"Objective terms {reading} read the teacher's vocabulary logits, but the teacher has no trained MLM head "
            f"(its checkpoint lacks {', '.join(untrained[:4])}{', ...' if len(untrained) > 4 else ''}; those weights "
            "would be random). Use terms that read hidden states, attention or Q/K/V relations (hidden_cosine, "
            "hidden_mse, attention_mse, attention_kl, minilm_relations), or give the teacher an MLM head first "
            "(biodistil pretrain with model.init=continual)."
        )


def _resolve(cfg: TermConfig, student: PreTrainedModel, teacher: PreTrainedModel | None, taken: set[str]) -> Term:
    """Layer pairs, relation heads and a unique log name for one recipe term; recipe errors are named."""
    kind = TERM_KINDS[cfg.loss]
    name = _log_name(cfg, taken)
    if kind.features == "logits":
        return Term(cfg, (), name)
    assert teacher is not None
    try:
        pairs = _pairs(cfg, kind.features, num_layers(student.config), num_layers(teacher.config))
    except (IndexError, BiodistilError) as err:
        raise BiodistilError(f"Objective term {cfg.loss}: {err}") from None
    if kind.features == "attention" and num_heads(student.config) != num_heads(teacher.config):
        raise BiodistilError(
            f"Objective term {cfg.loss} compares attention maps head by head, but the student has "
            f"{num_heads(student.config)} heads and the teacher {num_heads(teacher.config)}"
        )
    heads = None
    if kind.features == "qkv":
        heads = cfg.num_relation_heads or num_heads(teacher.config)
        _check_relation_heads(heads, student, pairs[0][0], teacher, pairs[0][1])
    windows = ()
    if kind.features == "attention":
        windows = tuple(
            _narrower(attention_window(student.config, s), attention_window(teacher.config, t)) for s, t in pairs
        )
    return Term(cfg, pairs, name, heads, windows)


def _narrower(first: int | None, second: int | None) -> int | None:
    """The narrower of two attention windows (None = every key)."""
    if first is None or second is None:
        return second if first is None else first
    return min(first, second)


def _pairs(cfg: TermConfig, features: FeatureKind, student_layers: int, teacher_layers: int) -> Pairs:
    if cfg.layer_map is not None:
        if cfg.layer_map == "uniform":
            full = uniform_layer_map(student_layers, teacher_layers)
        else:
            full = explicit_layer_map(cfg.layer_map, teacher_layers)
        if len(full) != student_layers + 2:
            raise BiodistilError(
                f"layer_map lists {len(full) - 2} teacher layers, but the student has {student_layers} layers"
            )
        return tuple((layer, full[layer]) for layer in range(1, student_layers + 1))
    normalise = normalise_layer if features == "hidden" else normalise_block
    return ((normalise(cfg.student_layer, student_layers), normalise(cfg.teacher_layer, teacher_layers)),)


def _check_relation_heads(
    heads: int, student: PreTrainedModel, student_layer: int, teacher: PreTrainedModel, teacher_layer: int
) -> None:
    for who, model, layer in (("student", student, student_layer), ("teacher", teacher, teacher_layer)):
        widths = set(qkv_widths(model, layer))
        if any(width % heads for width in widths):
            raise BiodistilError(
                f"minilm_relations: num_relation_heads={heads} does not divide the {who}'s Q/K/V width "
                f"{sorted(widths)} at layer {layer}; choose a common divisor of the student and teacher widths"
            )


def _request(term: Term, teacher: bool) -> FeatureRequest:
    kind = TERM_KINDS[term.cfg.loss]
    if kind.features == "logits":
        return FeatureRequest(logits=True)
    layers = {pair[1] if teacher else pair[0] for pair in term.pairs}
    field = _REQUEST_FIELD[kind.features]
    if kind.features == "attention" and term.cfg.attention_map == "scores":
        field = "attention_scores"
    return FeatureRequest(**{field: layers})


def _merged(requests: Iterable[FeatureRequest]) -> FeatureRequest:
    merged = FeatureRequest()
    for request in requests:
        merged = merged.merge(request)
    return merged


def _log_name(term: TermConfig, taken: set[str]) -> str:
    name, suffix = f"loss_{term.loss}", 2
    while name in taken:
        name, suffix = f"loss_{term.loss}_{suffix}", suffix + 1
    return name
