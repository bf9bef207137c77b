"""Terms only classifiers have (task-specific distillation, `biodistil.kd.objective`): gold-label CE, sigmoid KD and
PatientKD. Across tokenizers the classifier's outputs are aligned before the terms run, so each has one form."""

import torch
import torch.nn.functional as F

from biodistil.losses.task import patient_kd_loss, sigmoid_kd_loss
from biodistil.methods.terms.base import Term, TermForms, TermInputs, TermOwner, zero_like_logits
from biodistil.methods.terms.logits import logit_rows, mlm


def ce(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """CE(y, z_S) with the gold labels: softmax CE at the labelled positions (per example, or per labelled
    sub-word of a token task), or per-label BCE for multi-label tasks; 0 when the batch has no labels."""
    if x.labels is None:
        return zero_like_logits(x)
    if x.multi_label:
        logits = x.student.logits.at(x.masks["masked"]).logits()
        return F.binary_cross_entropy_with_logits(logits.float(), x.labels.float())
    return mlm(owner, term, x)


def sigmoid_kd(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """Label-free binary KD BCE(σ(z_T/T), σ(z_S/T)) of the positive class (z = z_1 − z_0 for two logits), at the
    term's positions; per label for multi-label tasks."""
    student, teacher = logit_rows(term, x)
    if x.multi_label:
        student, teacher = student.reshape(-1), teacher.reshape(-1)
    return sigmoid_kd_loss(student, teacher, x.temperature)


def patient_kd(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """PatientKD Σ_i MSE(h_S,i/‖h_S,i‖, h_T,g(i)/‖h_T,g(i)‖) of the [CLS] states (position 0) of the term's layer
    pairs, over the examples whose teacher [CLS] is known (mask "cls")."""
    rows = x.masks["cls"]
    if not bool(rows.any()):
        return zero_like_logits(x)
    student = [x.student.hidden_at(s)[:, :1][rows] for s, _ in term.pairs]
    teacher = [x.teacher.hidden_at(t)[:, :1][rows].to(student[0].dtype) for _, t in term.pairs]
    return patient_kd_loss(student, teacher)


FORMS = {"ce": TermForms(ce), "sigmoid_kd": TermForms(sigmoid_kd), "patient_kd": TermForms(patient_kd)}
