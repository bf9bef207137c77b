"""Objectives: a method is a weighted list of loss terms chosen in the recipe.

What each kind of term is (what it reads, whether a cache serves it, its options, whether it has a form across
tokenizers) is its `TermSpec` (`biodistil.term_specs`); how it computes is one short function per form
(`biodistil.methods.terms`), each calling a pure loss function of `biodistil.losses`. This module resolves a recipe's
terms against the models (layer pairs, relation heads, attention windows, log names), owns the learned projections
(student width -> teacher width: trained and checkpointed with the student, never exported) and sums the terms
(`weighted_sum`, the one dispatch of every method, shared with task KD in `biodistil.kd.objective`).

Layer terms compare one (student layer, teacher layer) pair or, with `layer_map`, every student transformer layer
l = 1..M with teacher layer g(l) (uniform or explicit, `biodistil.methods.layer_map`). Attention terms compare the
two maps on the keys both layers can see: when one of them is a local (sliding-window) layer, the other's attention
is restricted to the same window and renormalised. A term with `epsilon` passes through the VE-KD tolerance hinge
max(W·L − ε, 0) before its weight. Before any term runs, `weighted_sum` declares at which rows terms read the
student's formed logits (`planned_inputs`), so the order of the terms never changes what is computed.
"""

import functools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Literal

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.config import ObjectiveConfig, TermConfig
from biodistil.data.shared_vocabulary import SharedVocabulary
from biodistil.errors import BiodistilError
from biodistil.losses.distillation import KLRows
from biodistil.losses.layers import tolerance_hinge
from biodistil.methods.layer_map import explicit_layer_map, uniform_layer_map
from biodistil.methods.several_teachers import Teachers, expand, mix, teacher_table
from biodistil.methods.terms import Pairs, Term, TermInputs, Weight, form_for, position_masks
from biodistil.models.families import attention_window, hidden_size, num_heads, num_layers, qkv_widths
from biodistil.models.features import FeatureRequest, normalise_block, normalise_layer
from biodistil.models.loading import untrained_head_weights
from biodistil.term_specs import TERM_SPECS, Reads

__all__ = ["Objective", "Term", "TermInputs", "Weight", "planned_inputs", "position_masks", "weighted_sum"]
_REQUEST_FIELD = {"hidden": "hidden", "attention": "attentions", "qkv": "qkv"}
LayerMap = Literal["uniform"] | list[int]


class Objective(nn.Module):
    """The weighted sum of the recipe's terms; owns the learned projections the terms need.

    Several teachers (`teacher` a sequence, `teacher_weights` λ_k summing to 1, `layer_maps` per teacher or None):
    the terms are expanded once per teacher or onto their mixture (`methods.several_teachers.expand`, with their own
    layer pairs and projections per teacher). Logit terms read only the teachers with a trained MLM head
    (`Teachers.logit_teachers`); the layer terms read every teacher (`contributions` says which reads what, before
    any work)."""

    def __init__(self, cfg: ObjectiveConfig, student: PreTrainedModel,
                 teacher: PreTrainedModel | Sequence[PreTrainedModel] | None,
                 vocabulary: SharedVocabulary | Sequence[SharedVocabulary | None] | None = None,
                 teacher_weights: Sequence[float] = (1.0,), layer_maps: Sequence[LayerMap | None] = ()):
        super().__init__()
        self.cfg = cfg
        teachers = [] if teacher is None else list(teacher) if isinstance(teacher, Sequence) else [teacher]
        # across tokenizers: the strings the student's and each teacher's vocabularies share (logit_kl)
        self.vocabularies = tuple(vocabulary) if isinstance(vocabulary, Sequence) else (vocabulary,) * max(
            1, len(teachers))
        self.vocabulary = self.vocabularies[0]
        self.kl_rows: KLRows | None = None  # the vocabulary KL's row kernel: set by the engine (`train.compile`)
        needing = [t.loss for t in cfg.terms if TERM_SPECS[t.loss].needs_teacher]
        if not teachers and needing:
            raise BiodistilError(f"Objective terms {needing} need a teacher, and this stage has none")
        self.teachers = Teachers(tuple(teacher_weights) if len(teachers) > 1 else (1.0,), cfg,
                                 tuple(k for k, model in enumerate(teachers) if not untrained_head_weights(model)))
        if teachers and (len(teachers) == 1 or not self.teachers.readers):
            _check_teacher_head(cfg, teachers[0])
        taken: set[str] = set()
        recipe_terms = []
        for term_cfg in cfg.terms:
            recipe_terms.append(_resolve(term_cfg, student, teachers[0] if teachers else None, _log_name(term_cfg,
                                                                                                         taken)))
            taken.add(recipe_terms[-1].name)
        maps = list(layer_maps)

        def for_teacher(term: Term, k: int) -> Term:
            mapped = maps[k] if k < len(maps) and term.cfg.layer_map is not None else None
            return _resolve(term.cfg.model_copy(update={"layer_map": mapped}) if mapped else term.cfg, student,
                            teachers[k], term.name)

        self.terms: list[Term] = expand(recipe_terms, self.teachers, for_teacher)
        self.projections = nn.ModuleDict()
        for term in self.terms:
            if term.spec.reads == "hidden":
                self._add_projections(term, student, teachers[term.teacher])

    def contributions(self, about: Sequence[dict[str, str]] = ()) -> list[dict[str, Any]]:
        """The pre-flight table: what each teacher contributes to each recipe term, a row per teacher (`about[k]`: its
        name and tokens)."""
        return teacher_table(self.teachers, {t.loss: TERM_SPECS[t.loss] for t in self.cfg.terms}, about)

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
        key = f"{term.cfg.loss}_s{student_layer}_t{teacher_layer}".replace("-", "m")
        return key if not term.teacher else f"{key}_k{term.teacher}"  # the first teacher's: as with one teacher

    def project(self, term: Term, student_layer: int, teacher_layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """h_S·W (+ b) for the pair's projection, or h_S unchanged when the widths match."""
        key = self._projection_key(term, student_layer, teacher_layer)
        return self.projections[key](hidden) if key in self.projections else hidden

    @property
    def needs_teacher(self) -> bool:
        return any(t.spec.needs_teacher for t in self.terms)

    def student_request(self) -> FeatureRequest:
        return _merged(_request(t, teacher=False) for t in self.terms)

    def teacher_request(self, slot: int = 0) -> FeatureRequest:
        """What teacher `slot` must give: the features of its own terms and of the terms on the mixture."""
        return _merged(_request(t, teacher=True) for t in self.terms if self.teachers.reads(t, slot))

    def cache_request(self, slot: int = 0) -> FeatureRequest:
        """What a teacher cache must hold for these terms (`teacher_request`), after checking that every teacher
        term can read one: a cache keeps the top-k logits at the masked positions and hidden states."""
        for term in self.terms:
            spec = term.spec
            if spec.needs_teacher and not spec.cached:
                cacheable = sorted(name for name, other in TERM_SPECS.items() if other.cached)
                raise BiodistilError(f"Objective term {term.cfg.loss} needs the running teacher ({spec.reads}); a "
                                     f"teacher cache serves {', '.join(cacheable)}. Remove teacher_cache or the term")
            if spec.needs_teacher and spec.reads == "logits" and term.cfg.positions != "masked":
                raise BiodistilError(f"Objective term {term.cfg.loss} with positions: {term.cfg.positions}: a teacher "
                                     "cache holds the teacher's logits at the masked positions only; use positions: "
                                     "masked (DistilBERT's soft MLM) or remove teacher_cache")
        return self.teacher_request(slot)

    def logit_positions(self, masks: dict[str, torch.Tensor], teacher: bool = False) -> torch.Tensor | None:
        """Union of the positions of the terms that read this model's logits (None when none does). Every named
        set lies within "all", so a union that holds it is that very tensor (its terms then read the logits
        without a copy, `LogitRows.at`)."""
        names = {term.positions for term in self.terms
                 if term.spec.reads == "logits" and (term.spec.needs_teacher or not teacher)}
        if not names:
            return None
        return masks["all"] if "all" in names else functools.reduce(operator.or_, (masks[n] for n in sorted(names)))

    def forward(self, inputs: TermInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return weighted_sum(self, self.terms, mix(self.terms, inputs, self.teachers))


def weighted_sum(objective: object, terms: Iterable[Term], inputs: TermInputs,
                 weights: dict[str, Weight] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = Σ_k w_k·L_k over the terms, each computed by its form (`biodistil.methods.terms.form_for`: the one
    dispatch of every method), and each term's unweighted value for the logs. `weights` replaces the recipe weight of
    the terms it names (MetaAdaptiveKD's learned α and β, tensors that receive gradients). What is computed does not
    depend on the order of the terms: the rows read as formed logits are declared first (`planned_inputs`)."""
    terms = list(terms)
    inputs = planned_inputs(terms, inputs)
    total = torch.zeros((), device=inputs.attention_mask.device)
    logs = {}
    for term in terms:
        value = form_for(term, inputs)(objective, term, inputs.for_term(term))
        if term.cfg.epsilon is not None:
            logs[f"{term.name}_raw"] = value.detach()
            value = tolerance_hinge(value, term.cfg.hinge_weight, term.cfg.epsilon)
        logs[term.name] = value.detach()
        if term.name != term.family:  # one of several teachers': the recipe term's log is Σ_k λ_k·value_k
            logs[term.family] = logs.get(term.family, 0.0) + term.share * value.detach()
        weight = term.cfg.weight if weights is None else weights.get(term.family, term.cfg.weight)
        total = total + weight * term.share * value
    return total, logs


def planned_inputs(terms: list[Term], inputs: TermInputs) -> TermInputs:
    """`inputs` with the student's logit rows told, before any term runs, at which positions the terms read formed
    logits (`LogitRows.planned`; by position name, in sorted order, so the plan does not depend on the order of
    the terms either)."""
    if inputs.student.logits is None:
        return inputs
    names = sorted({term.positions for term in terms if inputs.for_term(term).reads_formed(term)})
    rows = inputs.student.logits.planned([inputs.masks[name] for name in names])
    return replace(inputs, student=replace(inputs.student, logits=rows))


def _check_teacher_head(cfg: ObjectiveConfig, teacher: PreTrainedModel) -> None:
    """Pre-flight: terms that read the teacher's vocabulary logits need a teacher whose MLM head was trained."""
    untrained = untrained_head_weights(teacher)
    specs = {t.loss: TERM_SPECS[t.loss] for t in cfg.terms}
    reading = [name for name, spec in specs.items() if spec.needs_teacher and spec.reads == "logits"]
    if untrained and reading:
        raise BiodistilError(
            f"Objective terms {reading} read the teacher's vocabulary logits, but the teacher has no trained MLM head "
            f"(its checkpoint lacks {', '.join(untrained[:4])}{', ...' if len(untrained) > 4 else ''}; those weights "
            "would be random). Use terms that read hidden states, attention or Q/K/V relations (hidden_cosine, "
            "hidden_mse, attention_mse, attention_kl, minilm_relations), or give the teacher an MLM head first "
            "(biodistil pretrain with model.init=continual).")


def _resolve(cfg: TermConfig, student: PreTrainedModel, teacher: PreTrainedModel | None, name: str) -> Term:
    """Layer pairs and relation heads of one recipe term, logged as `name`; recipe errors are named."""
    reads = TERM_SPECS[cfg.loss].reads
    if reads == "logits":
        return Term(cfg, (), name)
    assert teacher is not None
    try:
        pairs = _pairs(cfg, reads, num_layers(student.config), num_layers(teacher.config))
    except (IndexError, BiodistilError) as err:
        raise BiodistilError(f"Objective term {cfg.loss}: {err}") from None
    if reads == "attention" and num_heads(student.config) != num_heads(teacher.config):
        raise BiodistilError(f"Objective term {cfg.loss} compares attention maps head by head, but the student has "
                             f"{num_heads(student.config)} heads and the teacher {num_heads(teacher.config)}")
    heads = (cfg.num_relation_heads or num_heads(teacher.config)) if reads == "qkv" else None
    if heads is not None:
        _check_relation_heads(heads, student, pairs[0][0], teacher, pairs[0][1])
    windows = tuple(_narrower(attention_window(student.config, s), attention_window(teacher.config, t))
                    for s, t in pairs) if reads == "attention" else ()
    return Term(cfg, pairs, name, heads, windows)


def _narrower(first: int | None, second: int | None) -> int | None:
    """The narrower of two attention windows (None = every key)."""
    return min((window for window in (first, second) if window is not None), default=None)


def _pairs(cfg: TermConfig, reads: Reads, student_layers: int, teacher_layers: int) -> Pairs:
    if cfg.layer_map is not None:
        full = (uniform_layer_map(student_layers, teacher_layers) if cfg.layer_map == "uniform"
                else explicit_layer_map(cfg.layer_map, teacher_layers))
        if len(full) != student_layers + 2:
            raise BiodistilError(f"layer_map lists {len(full) - 2} teacher layers, but the student has "
                                 f"{student_layers} layers")
        return tuple((layer, full[layer]) for layer in range(1, student_layers + 1))
    normalise = normalise_layer if reads == "hidden" else normalise_block
    return ((normalise(cfg.student_layer, student_layers), normalise(cfg.teacher_layer, teacher_layers)),)


def _check_relation_heads(heads: int, student: PreTrainedModel, student_layer: int, teacher: PreTrainedModel,
                          teacher_layer: int) -> None:
    for who, model, layer in (("student", student, student_layer), ("teacher", teacher, teacher_layer)):
        widths = set(qkv_widths(model, layer))
        if any(width % heads for width in widths):
            raise BiodistilError(f"minilm_relations: num_relation_heads={heads} does not divide the {who}'s Q/K/V "
                                 f"width {sorted(widths)} at layer {layer}; choose a common divisor of the student "
                                 "and teacher widths")


def _request(term: Term, teacher: bool) -> FeatureRequest:
    reads = term.spec.reads
    if reads == "logits":
        return FeatureRequest(logits=True)
    layers = {pair[1] if teacher else pair[0] for pair in term.pairs}
    field = _REQUEST_FIELD[reads]
    if reads == "attention" and term.cfg.attention_map == "scores":
        field = "attention_scores"
    return FeatureRequest(**{field: layers})


def _merged(requests: Iterable[FeatureRequest]) -> FeatureRequest:
    return functools.reduce(FeatureRequest.merge, requests, FeatureRequest())


def _log_name(term: TermConfig, taken: set[str]) -> str:
    name, suffix = f"loss_{term.loss}", 2
    while name in taken:
        name, suffix = f"loss_{term.loss}_{suffix}", suffix + 1
    return name
