"""The loss of task-specific distillation as terms of the term registry (`biodistil.term_specs`).

    L = α·soft(z_S, z_T) + β·CE(y, z_S) [+ γ·PatientKD]

`kd.soft_loss` names the soft term's kind: `hinton` is `logit_kl` (T²·KL(softmax(z_T/T) ‖ softmax(z_S/T))),
`logit_mse` is `logit_mse` ((1/C)·Σ_c (z_S,c − z_T,c)²) and `sigmoid` is `sigmoid_kd`; `none` leaves only β·CE,
the fine-tune baseline on the transfer set's gold labels. The terms are computed by the same dispatch as the
masked-LM terms (`weighted_sum`) on a classifier's outputs read as features: logits at every token position
(token tasks; the soft term covers the positions of the batch's `kd` mask, the first sub-word of each word) or one
row per example, and the [CLS] states of the PatientKD layers. Log names: `soft`, `ce`, `pkd`.
"""

from collections.abc import Sequence
from dataclasses import replace

import torch

from biodistil.config import TermConfig
from biodistil.data.batch import Batch
from biodistil.errors import BiodistilError
from biodistil.kd.recipe import KDOptions
from biodistil.losses.distillation import KLRows
from biodistil.losses.multi_teacher import confidence_weights, mixed_teacher_logits
from biodistil.methods.layer_map import pkd_last_map, pkd_skip_map
from biodistil.methods.objective import Term, TermInputs, Weight, weighted_sum
from biodistil.models.features import Features
from biodistil.models.logits import LogitRows
from biodistil.tasks.registry import TaskSpec
from biodistil.term_specs import KD_SOFT_TERMS


def kd_terms(cfg: KDOptions, pairs: Sequence[tuple[int, int]] = ()) -> list[Term]:
    """The recipe's terms: α·soft (unless soft_loss none), β·CE (when β > 0), γ·PatientKD over `pairs`."""
    terms = []
    if cfg.soft_loss != "none":
        terms.append(Term(TermConfig(loss=KD_SOFT_TERMS[cfg.soft_loss], weight=cfg.alpha), (), "soft"))
    if cfg.beta > 0:
        terms.append(Term(TermConfig(loss="ce", weight=cfg.beta), (), "ce"))
    if cfg.patient is not None:
        terms.append(Term(TermConfig(loss="patient_kd", weight=cfg.patient.gamma), tuple(pairs), "pkd"))
    return terms


class KDObjective:
    """The weighted terms of a `kd` recipe, computed on student and teacher features of one batch; with several
    teachers (`teacher_weights` λ_k, summing to 1) each teacher term is computed on the teachers' mixture where its
    spec has one and `kd.combine` is mixture (`losses.multi_teacher`), else once per teacher and weighted by λ_k."""

    def __init__(self, cfg: KDOptions, task: TaskSpec, pairs: Sequence[tuple[int, int]] = (),
                 teacher_weights: Sequence[float] = (1.0,)):
        self.terms = kd_terms(cfg, pairs)
        self.temperature = cfg.temperature
        self.multi_label = task.kind == "multilabel_classification"
        self.combine, self.confidence = cfg.combine, cfg.confidence
        self.teacher_weights = torch.tensor(list(teacher_weights), dtype=torch.float32)
        self._ce = Term(TermConfig(loss="ce"), (), "ce")
        self.vocabulary = None  # classifier logits: one label set on both sides
        self.kl_rows: KLRows | None = None  # Hinton KD's row kernel: set by the engine (`train.compile`)

    def __call__(self, student: Features, teacher: Features | Sequence[Features] | None, batch: Batch,
                 weights: dict[str, Weight] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L and the value of each term; `weights` replaces α (`soft`) and β (`ce`) when they are learned."""
        teachers = [] if teacher is None else [teacher] if isinstance(teacher, Features) else list(teacher)
        if len(teachers) > 1:
            return self._several(student, teachers, batch, weights)
        one = teachers[0] if teachers else None
        terms = [t for t in self.terms if one is not None or not t.spec.needs_teacher]
        return weighted_sum(self, terms, self.inputs(student, one, batch), weights)

    def _several(self, student: Features, teachers: list[Features], batch: Batch,
                 weights: dict[str, Weight] | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The terms without a teacher once; the mixed terms once on the mixture; the others Σ_k λ_k·term(teacher k),
        logged per teacher (`soft@k`) and weighted (`soft`)."""
        own = [t for t in self.terms if not t.spec.needs_teacher]
        mixed = [t for t in self.terms if t.spec.needs_teacher and self.combine == "mixture" and t.spec.mixture]
        apart = [t for t in self.terms if t.spec.needs_teacher and t not in mixed]
        total, logs = weighted_sum(self, own, self.inputs(student, None, batch), weights)
        for term in mixed:
            value, more = weighted_sum(self, [term], self.inputs(student, self.mixture(term, teachers, batch), batch),
                                       weights)
            total, logs = total + value, {**logs, **more}
        for k, teacher in enumerate(teachers):
            value, more = weighted_sum(self, apart, self.inputs(student, teacher, batch), weights)
            share = float(self.teacher_weights[k])
            total = total + share * value
            for name, term_value in more.items():
                logs[f"{name}@{k}"] = term_value
                logs[name] = logs.get(name, 0.0) + share * term_value
        return total, logs

    def mixture(self, term: Term, teachers: list[Features], batch: Batch) -> Features:
        """The teachers' mixture for `term` as one teacher's features: the logits z_mix of its spec's mixture space,
        with per-row confidence weights when asked (`losses.multi_teacher`)."""
        rows = [teacher.logits.logits() for teacher in teachers]
        prior = self.teacher_weights.to(rows[0].device)
        weights = prior
        if self.confidence:
            labels = batch.labels
            if labels is not None and not self.multi_label:
                labels = labels.reshape(-1)
            weights = confidence_weights(rows, prior, labels, self.multi_label)
        binary_pair = not self.multi_label and rows[0].size(-1) == 2
        mixed = mixed_teacher_logits(rows, weights, term.spec.mixture, self.temperature, binary_pair)
        first = teachers[0]
        return replace(first, logits=LogitRows(first.logits.positions, mixed), hidden={})

    def task_loss(self, student: Features, batch: Batch) -> torch.Tensor:
        """CE(y, z_S) alone, whatever β is (MetaDistil's quiz loss)."""
        return weighted_sum(self, [self._ce], self.inputs(student, None, batch))[0]

    def inputs(self, student: Features, teacher: Features | None, batch: Batch) -> TermInputs:
        """The term inputs of one batch: labels shaped like the logit positions and the named position sets
        `all` (where the teacher term counts: the batch's `kd` mask, else everywhere), `masked` (gold labels) and
        `cls` (examples whose teacher [CLS] states are known: the batch's `cls` mask, else all)."""
        shape = student.logits.positions.shape
        labels = batch.labels
        if labels is not None and not self.multi_label:
            labels = labels.reshape(shape)
        everywhere = torch.ones(shape, dtype=torch.bool, device=student.logits.positions.device)
        masks = {"all": batch.masks["kd"].bool() if "kd" in batch.masks else everywhere,
                 "masked": labels != -100 if labels is not None and not self.multi_label else everywhere,
                 "cls": batch.masks["cls"].bool().reshape(-1, 1) if "cls" in batch.masks else everywhere[:, :1]}
        return TermInputs(student=student, teacher=teacher, labels=labels,
                          attention_mask=batch.attention_mask.bool(), masks=masks,
                          temperature=self.temperature, multi_label=self.multi_label)


def check_loss_fits_task(cfg: KDOptions, task: TaskSpec) -> None:
    """The soft loss must suit the task's outputs: softmax KD is not for multi-label tasks, sigmoid KD is binary."""
    if cfg.soft_loss == "hinton" and task.kind == "multilabel_classification":
        raise BiodistilError(f"kd.soft_loss hinton (softmax over classes) does not fit multi-label task {task.name}; "
                             "use sigmoid or logit_mse")
    if cfg.soft_loss == "sigmoid" and (task.kind == "token_classification" or (
            task.kind == "sequence_classification" and task.num_labels > 2)):
        raise BiodistilError(f"kd.soft_loss sigmoid is binary KD; task {task.name} has {task.num_labels} "
                             f"{'tags' if task.kind == 'token_classification' else 'classes'}: use hinton or "
                             "logit_mse")


def pkd_pairs(cfg: KDOptions, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs of PatientKD (PKD-Skip or PKD-Last), [] without PatientKD."""
    if cfg.patient is None:
        return []
    layers = student_layers
    pairs = (pkd_skip_map if cfg.patient.layer_map == "skip" else pkd_last_map)(layers, teacher_layers)
    if not pairs:
        raise BiodistilError(f"PatientKD maps the student's layers 1..M−1 to teacher layers; this student has "
                             f"{layers} layer(s), so there is nothing to map: use a deeper student or drop kd.patient")
    return pairs
