"""Objectives: a method is a weighted list of loss terms chosen in the recipe.

Each term declares the features it needs from the student and the teacher, and computes one scalar from
them with a pure loss function from `biodistil.losses`. Adding a method means adding terms (here) and a
recipe, not a new training loop. Learned projections (student width -> teacher width) belong to the
objective: they are trained and checkpointed with the student, but never exported.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.config import ObjectiveConfig, TermConfig
from biodistil.data.masking import IGNORE_INDEX
from biodistil.errors import BiodistilError
from biodistil.losses.distillation import cosine_embedding_loss, masked_lm_loss, soft_kl_loss
from biodistil.models.families import hidden_size, num_layers
from biodistil.models.features import FeatureRequest, Features, normalise_layer


@dataclass
class TermInputs:
    """Everything a term may read for one batch."""

    student: Features
    teacher: Features | None
    labels: torch.Tensor  # [B, L], IGNORE_INDEX where no MLM target
    attention_mask: torch.Tensor  # [B, L] bool
    positions: torch.Tensor  # [B, L] bool: rows of the logits tensors
    temperature: float


@dataclass(frozen=True)
class TermKind:
    """A kind of loss term: what it needs and how it is computed."""

    needs_teacher: bool
    student_request: Callable[[TermConfig], FeatureRequest]
    teacher_request: Callable[[TermConfig], FeatureRequest]
    compute: Callable[["Objective", TermConfig, TermInputs], torch.Tensor]
    logit_positions: Callable[[TermConfig], str | None] = lambda cfg: None


def _mlm(objective: "Objective", cfg: TermConfig, x: TermInputs) -> torch.Tensor:
    return masked_lm_loss(x.student.logits, x.labels[x.positions])


def _logit_kl(objective: "Objective", cfg: TermConfig, x: TermInputs) -> torch.Tensor:
    rows = x.labels[x.positions] != IGNORE_INDEX if cfg.positions == "masked" else slice(None)
    return soft_kl_loss(x.student.logits[rows], x.teacher.logits[rows], x.temperature)


def _hidden_cosine(objective: "Objective", cfg: TermConfig, x: TermInputs) -> torch.Tensor:
    student = objective.project(cfg, x.student.hidden_at(cfg.student_layer))
    return cosine_embedding_loss(student, x.teacher.hidden_at(cfg.teacher_layer), x.attention_mask)


_NOTHING = lambda cfg: FeatureRequest()  # noqa: E731
TERM_KINDS: dict[str, TermKind] = {
    "mlm": TermKind(False, lambda cfg: FeatureRequest(logits=True), _NOTHING, _mlm, lambda cfg: "masked"),
    "logit_kl": TermKind(
        True, lambda cfg: FeatureRequest(logits=True), lambda cfg: FeatureRequest(logits=True), _logit_kl,
        lambda cfg: cfg.positions,
    ),
    "hidden_cosine": TermKind(
        True,
        lambda cfg: FeatureRequest(hidden={cfg.student_layer}),
        lambda cfg: FeatureRequest(hidden={cfg.teacher_layer}),
        _hidden_cosine,
    ),
}


class Objective(nn.Module):
    """The weighted sum of the recipe's terms; owns the learned projections the terms need."""

    def __init__(self, cfg: ObjectiveConfig, student: PreTrainedModel, teacher: PreTrainedModel | None):
        super().__init__()
        self.cfg = cfg
        self.terms = list(cfg.terms)
        if teacher is None and any(TERM_KINDS[t.loss].needs_teacher for t in self.terms):
            needing = [t.loss for t in self.terms if TERM_KINDS[t.loss].needs_teacher]
            raise BiodistilError(f"Objective terms {needing} need a teacher, and this stage has none")
        self.projections = nn.ModuleDict()
        for term in self.terms:
            if term.loss == "hidden_cosine":
                self._add_projection(term, student, teacher)

    def _add_projection(self, term: TermConfig, student: PreTrainedModel, teacher: PreTrainedModel) -> None:
        normalise_layer(term.student_layer, num_layers(student.config))
        normalise_layer(term.teacher_layer, num_layers(teacher.config))
        d_student, d_teacher = hidden_size(student.config), hidden_size(teacher.config)
        if d_student != d_teacher:
            self.projections[self._projection_key(term)] = nn.Linear(d_student, d_teacher)

    @staticmethod
    def _projection_key(term: TermConfig) -> str:
        return f"{term.loss}_s{term.student_layer}_t{term.teacher_layer}".replace("-", "m")

    def project(self, term: TermConfig, student_hidden: torch.Tensor) -> torch.Tensor:
        key = self._projection_key(term)
        return self.projections[key](student_hidden) if key in self.projections else student_hidden

    @property
    def needs_teacher(self) -> bool:
        return any(TERM_KINDS[t.loss].needs_teacher for t in self.terms)

    def student_request(self) -> FeatureRequest:
        return _merged(TERM_KINDS[t.loss].student_request(t) for t in self.terms)

    def teacher_request(self) -> FeatureRequest:
        return _merged(TERM_KINDS[t.loss].teacher_request(t) for t in self.terms if TERM_KINDS[t.loss].needs_teacher)

    def logit_positions(self, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """All non-padding positions if any term wants them, else only the MLM targets."""
        wanted = {TERM_KINDS[t.loss].logit_positions(t) for t in self.terms}
        return attention_mask.bool() if "all" in wanted else labels != IGNORE_INDEX

    def forward(self, inputs: TermInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total = torch.zeros((), device=inputs.attention_mask.device)
        logs = {}
        for term in self.terms:
            value = TERM_KINDS[term.loss].compute(self, term, inputs)
            logs[_log_name(term, logs)] = value.detach()
            total = total + term.weight * value
        return total, logs


def _merged(requests) -> FeatureRequest:
    merged = FeatureRequest()
    for request in requests:
        merged = merged.merge(request)
    return merged


def _log_name(term: TermConfig, taken: dict) -> str:
    name, suffix = f"loss_{term.loss}", 2
    while name in taken:
        name, suffix = f"loss_{term.loss}_{suffix}", suffix + 1
    return name
