"""The loss of task-specific distillation as terms of the term registry (`biodistil.term_specs`).

    L = α·soft(z_S, z_T) + β·CE(y, z_S) [+ γ·PatientKD]

`kd.soft_loss` names the soft term's kind: `hinton` is `logit_kl` (T²·KL(softmax(z_T/T) ‖ softmax(z_S/T))),
`logit_mse` is `logit_mse` ((1/C)·Σ_c (z_S,c − z_T,c)²) and `sigmoid` is `sigmoid_kd`; `none` leaves only β·CE,
the fine-tune baseline on the transfer set's gold labels. The terms are computed by the same dispatch as the
masked-LM terms (`weighted_sum`) on a classifier's outputs read as features: logits at every token position
(token tasks; the soft term covers the positions of the batch's `kd` mask, the first sub-word of each word) or one
row per example, and the [CLS] states of the PatientKD layers. Log names: `soft`, `ce`, `pkd` (several teachers,
one term per teacher: `soft@k` too, `methods.several_teachers`).
"""

from collections.abc import Sequence
from dataclasses import replace

import torch

from biodistil.config import TermConfig
from biodistil.data.batch import Batch
from biodistil.errors import BiodistilError
from biodistil.kd.recipe import KDOptions
from biodistil.losses.distillation import KLRows
from biodistil.methods.layer_map import pkd_last_map, pkd_skip_map
from biodistil.methods.objective import Term, TermInputs, Weight, weighted_sum
from biodistil.methods.several_teachers import Teachers, each_teacher, expand, mix
from biodistil.models.features import Features
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
    teachers (`teacher_weights` λ_k, summing to 1) the teacher terms are expanded onto the teachers' mixture or once
    per teacher, as in task-agnostic distillation (`methods.several_teachers`)."""

    def __init__(self, cfg: KDOptions, task: TaskSpec, pairs: Sequence[tuple[int, int]] = (),
                 teacher_weights: Sequence[float] = (1.0,)):
        self.teachers = Teachers(tuple(teacher_weights), cfg)
        self.terms = expand(kd_terms(cfg, pairs), self.teachers)
        self.temperature = cfg.temperature
        self.multi_label = task.kind == "multilabel_classification"
        self._ce = Term(TermConfig(loss="ce"), (), "ce")
        self.vocabulary = None  # classifier logits: one label set on both sides
        self.kl_rows: KLRows | None = None  # Hinton KD's row kernel: set by the engine (`train.compile`)

    def __call__(self, student: Features, teacher: Features | Sequence[Features] | None, batch: Batch,
                 weights: dict[str, Weight] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L and the value of each term; `weights` replaces α (`soft`) and β (`ce`) when they are learned."""
        teachers = [] if teacher is None else [teacher] if isinstance(teacher, Features) else list(teacher)
        terms = [t for t in self.terms if teachers or not t.spec.needs_teacher]
        inputs = self.inputs(student, teachers[0] if teachers else None, batch)
        inputs = mix(terms, replace(inputs, by_teacher=each_teacher(teachers)), self.teachers)
        return weighted_sum(self, terms, inputs, weights)

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
    pairs = (pkd_skip_map if cfg.patient.layer_map == "skip" else pkd_last_map)(student_layers, teacher_layers)
    if not pairs:
        raise BiodistilError(f"PatientKD maps the student's layers 1..M−1 to teacher layers; this student has "
                             f"{student_layers} layer(s), so there is nothing to map: use a deeper student or drop "
                             "kd.patient")
    return pairs
