"""Logit terms: each form reads each model's `LogitRows` (`biodistil.models.logits`), which forms, restricts and
compares the logits. Across tokenizers they compare the first token of each whole-word-masked word on each side."""

import torch

from biodistil.errors import BiodistilError
from biodistil.losses.cross_tokenizer import shared_vocab_kl_loss, uld_loss
from biodistil.losses.distillation import masked_lm_loss
from biodistil.losses.prediction import soft_cross_entropy_loss
from biodistil.losses.task import logit_mse_loss
from biodistil.methods.terms.base import Term, TermForms, TermInputs, TermOwner


def mlm(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """CE(labels, student) over the MLM targets (over the student's whole vocabulary); across tokenizers the same,
    on the student's own labels."""
    rows = x.masks["masked"]
    return masked_lm_loss(x.student.logits.at(rows).logits(), x.labels[rows])


def logit_rows(term: Term, x: TermInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher logits at the term's positions, over the vocabulary both models share."""
    rows = x.masks[term.cfg.positions]
    student, teacher = x.student.logits.at(rows).logits(), x.teacher.logits.at(rows).logits()
    if x.shared_vocab is not None:
        student, teacher = student[:, : x.shared_vocab], teacher[:, : x.shared_vocab]
    return student, teacher


def logit_kl_tokens(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """T²·KL(softmax(z_T/T) ‖ softmax(z_S/T)) at the term's positions over the shared vocabulary; from a teacher
    cache, the KL over the teacher's top-k tokens and the tail (`topk_kl_loss`). `LogitRows.soft_kl` chooses the
    loss: on a student head it forms the logits inside the loss (`linear_soft_kl_loss`) except at the rows other
    terms read formed (the MLM targets), whose formed logits it reads; its rows with the owner's kernel (`kl_rows`)."""
    rows = x.masks[term.cfg.positions]
    return x.student.logits.at(rows).soft_kl(x.teacher.logits.at(rows), x.temperature, x.shared_vocab, owner.kl_rows)


def logit_kl_words(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """The shared-string KL T²·(1/N)·Σ_rows Σ_k q_T(k)·log(q_T(k)/q_S(k)) at the first token of each masked word
    (`shared_vocab_kl_loss`), over the strings the student's and this teacher's vocabularies share (the batch's
    words carry them: several teachers, several vocabularies)."""
    vocabulary = x.units.vocabulary if x.units is not None and x.units.vocabulary is not None else owner.vocabulary
    if vocabulary is None:
        raise BiodistilError(f"Objective term {term.cfg.loss} across tokenizers needs the strings both vocabularies "
                             "share (Objective(..., vocabulary=shared_vocabulary(...)))")
    return shared_vocab_kl_loss(*aligned_logits(x), vocabulary.student_index, vocabulary.teacher_index,
                                vocabulary.size, x.temperature)


def uld_tokens(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """Universal logit distillation (Boizard et al., 2024), (1/N)·Σ_rows Σ_i |p_S,(i) − p_T,(i)| on the sorted
    probabilities p = softmax(z/T) (`uld_loss`) at the term's positions."""
    rows = x.masks[term.cfg.positions]
    return uld_loss(x.student.logits.at(rows).logits(), x.teacher.logits.at(rows).logits(), x.temperature)


def uld_words(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """ULD at the first token of each masked word on each side: it needs no shared token, so it covers what the
    shared strings miss."""
    return uld_loss(*aligned_logits(x), x.temperature)


def aligned_logits(x: TermInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Across tokenizers: the student's logits [N, V_S] at the first token of each masked word, read from its logits
    formed at the MLM targets (the words' tokens), and the teacher's [N, V_T], computed at those first tokens only;
    row n of both is the same word."""
    student = x.student.logits.at(x.masks["masked"]).logits_at(x.units.first_masked("student"))
    return student, x.teacher.logits.logits()


def soft_ce(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """TinyBERT output loss −Σ softmax(z_T/T)·log softmax(z_S/T), mean over the term's positions."""
    return soft_cross_entropy_loss(*logit_rows(term, x), x.temperature)


def logit_mse(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """(1/N)·Σ_rows of the squared errors over the shared vocabulary, averaged (`vocab_reduction: mean`) or
    summed (`sum`, VE-KD's L′_MSE) over it, at the term's N positions."""
    return logit_mse_loss(*logit_rows(term, x), class_reduction=term.cfg.vocab_reduction)


FORMS = {
    "mlm": TermForms(mlm, words=mlm),  # the student's own labels on either side
    "logit_kl": TermForms(logit_kl_tokens, logit_kl_words),
    "uld": TermForms(uld_tokens, uld_words),
    "soft_ce": TermForms(soft_ce),
    "logit_mse": TermForms(logit_mse),
}
