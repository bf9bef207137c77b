"""Layer terms: hidden states, attention maps and MiniLMv2 relations of (student layer, teacher layer) pairs. Token
forms compare positions; word forms (across tokenizers) compare the words both tokenizations hold whole
(`WordUnits`): hidden states and Q/K/V mean-pooled to words, attention pooled to word × word maps."""

from collections.abc import Callable

import torch

from biodistil.errors import BiodistilError
from biodistil.losses.cross_tokenizer import word_attention_kl_loss, word_attention_mse_loss
from biodistil.losses.distillation import cosine_embedding_loss
from biodistil.losses.layers import attention_kl_loss, attention_mse_loss, hidden_mse_loss, minilm_relations_loss
from biodistil.methods.terms.base import Compute, Term, TermForms, TermInputs, TermOwner, reduce_layers
from biodistil.models.attention import restrict_to_window

HiddenLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def hidden_tokens(loss: HiddenLoss) -> Compute:
    """loss(h_S^l·W_l, h_T^g(l)) at the term's positions, for every layer pair."""
    def compute(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
        mask = x.masks[term.cfg.positions]
        values = [loss(owner.project(term, s, t, x.student.hidden_at(s)), x.teacher.hidden_at(t), mask)
                  for s, t in term.pairs]
        return reduce_layers(values, term.cfg.layer_reduction)

    return compute


def hidden_words(loss: HiddenLoss) -> Compute:
    """The same loss on unit means, loss(P_S·h_S^l·W_l, P_T·h_T^g(l)) over the shared units (`positions: masked`: the
    masked words); the projection is affine and the pooling a mean, so projecting the pooled states is the same."""
    def compute(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
        units = x.units
        values = [loss(owner.project(term, s, t, units.pool_student(x.student.hidden_at(s))),
                       units.pool_teacher(x.teacher.hidden_at(t)), units.units(term.cfg.positions))
                  for s, t in term.pairs]
        return reduce_layers(values, term.cfg.layer_reduction)

    return compute


hidden_cosine_tokens, hidden_cosine_words = hidden_tokens(cosine_embedding_loss), hidden_words(cosine_embedding_loss)
hidden_mse_tokens, hidden_mse_words = hidden_tokens(hidden_mse_loss), hidden_words(hidden_mse_loss)


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
    """Σ_l loss on the word × word maps of each layer pair (`pool_attention`: keys summed, queries averaged, rows
    renormalised), each model's probabilities as its own layer computes them (a local layer's are zero outside its
    window)."""
    if term.cfg.attention_map == "scores":
        raise BiodistilError("attention_map: scores does not pool into words; use attention_map: probabilities")
    members = x.units.membership("student"), x.units.membership("teacher")
    values = [loss(x.student.attention_at(s), x.teacher.attention_at(t), *members, x.units.unit_mask, **options)
              for s, t in term.pairs]
    return reduce_layers(values, term.cfg.layer_reduction)


def attention_mse_tokens(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """Σ_l (1/H)·Σ_heads MSE(a_S^l, a_T^g(l)) over real (query, key) pairs, on attention probabilities or, with
    `attention_map: scores`, on the unnormalised scores Q·Kᵀ/√d (TinyBERT)."""
    pairs = _attention_pairs(term, x, scores=term.cfg.attention_map == "scores")
    values = [attention_mse_loss(student, teacher, x.attention_mask, window) for student, teacher, window in pairs]
    return reduce_layers(values, term.cfg.layer_reduction)


def attention_mse_words(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """On word × word maps of probabilities (`word_attention_mse_loss`)."""
    return _word_attention(term, x, word_attention_mse_loss)


def attention_kl_tokens(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """Σ_l KL(a_S^l ‖ a_T^g(l)) per query row, averaged (CompactBioBERT) or summed (MobileBERT) over tokens."""
    values = [
        attention_kl_loss(student, teacher, x.attention_mask, term.cfg.token_reduction, window=window)
        for student, teacher, window in _attention_pairs(term, x)
    ]
    return reduce_layers(values, term.cfg.layer_reduction)


def attention_kl_words(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """Per query word of the word × word maps (`word_attention_kl_loss`)."""
    return _word_attention(term, x, word_attention_kl_loss, reduction=term.cfg.token_reduction)


def relations_tokens(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """MiniLMv2 Σ_r KL(R_T^r ‖ R_S^r) for r in the term's relations (Q-Q, K-K, V-V)."""
    ((s, t),) = term.pairs
    return minilm_relations_loss(x.student.qkv_at(s), x.teacher.qkv_at(t), x.attention_mask, term.relation_heads,
                                 term.cfg.relations)


def relations_words(owner: TermOwner, term: Term, x: TermInputs) -> torch.Tensor:
    """The same relations on the unit means of Q, K and V over the shared units."""
    ((s, t),) = term.pairs
    student = {r: x.units.pool_student(v) for r, v in x.student.qkv_at(s).items()}
    teacher = {r: x.units.pool_teacher(v) for r, v in x.teacher.qkv_at(t).items()}
    return minilm_relations_loss(student, teacher, x.units.unit_mask, term.relation_heads, term.cfg.relations)


FORMS = {
    "hidden_cosine": TermForms(hidden_cosine_tokens, hidden_cosine_words),
    "hidden_mse": TermForms(hidden_mse_tokens, hidden_mse_words),
    "attention_mse": TermForms(attention_mse_tokens, attention_mse_words),
    "attention_kl": TermForms(attention_kl_tokens, attention_kl_words),
    "minilm_relations": TermForms(relations_tokens, relations_words),
}
