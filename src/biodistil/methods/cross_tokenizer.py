"""Pre-flight across tokenizers: which objective terms hold for a (student, teacher) tokenizer pair, and how.

Three pairs:
- **same** — one vocabulary and one tokenization (vocabulary, normalizer and pre-tokenizer equal): every term
  compares the two models token by token, as today.
- **extended** — the student's WordPiece vocabulary is the teacher's with tokens appended, ids unchanged (VE-KD):
  the teacher reads the student's ids with every new token as [MASK] (`biodistil.methods.vekd`), so every term stays
  token by token; vocabulary logits compare the teacher's |V_T| columns at `positions: known`.
- **different** — anything else (cased vs uncased WordPiece, two domain vocabularies, WordPiece vs byte-level BPE):
  tokens do not correspond, the words of the text do (`biodistil.data.token_alignment`). Hidden states, attention
  maps and MiniLMv2 relations are compared on aligned words (`biodistil.losses.cross_tokenizer`); vocabulary logits
  only at the first token of each whole-word-masked word, through the strings both vocabularies name (`logit_kl`)
  and the vocabulary-free ULD term (`uld`); a logit MSE or a soft cross-entropy over one vocabulary has no meaning
  across two.
  A classifier's logits are over the task's classes, shared by any pair: per sequence they need no alignment, per
  word (NER) they are compared at each word's first token on each side.

`term_support` only reports (`pair_support` for a pair known without its tokenizers: a student vocabulary still to
be trained is "different"); `refuse_unsupported` turns its refusals into one error naming each term and what to
change.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from transformers import PreTrainedTokenizerBase

from biodistil.config import TermConfig
from biodistil.errors import BiodistilError
from biodistil.term_specs import TERM_SPECS

PairKind = Literal["same", "extended", "different"]
Head = Literal["masked_lm", "sequence", "token"]


@dataclass(frozen=True)
class TermSupport:
    """One term's verdict: whether it holds for the pair, at which level ("tokens", "words", "sequence"; "" when
    refused), and how it is computed or, when refused, what to change."""

    term: str
    ok: bool
    level: str
    reason: str


def tokenizer_pair(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> PairKind:
    """"same" (equal vocabulary, normalizer and pre-tokenizer), "extended" (a WordPiece student vocabulary that holds
    the teacher's tokens under the same ids, and more) or "different"."""
    student_vocab, teacher_vocab = student.get_vocab(), teacher.get_vocab()
    student_rules = _rules(student)
    same_rules = student_rules == _rules(teacher)
    if student_vocab == teacher_vocab and same_rules:
        return "same"
    extends = len(student_vocab) > len(teacher_vocab) and all(
        student_vocab.get(token) == token_id for token, token_id in teacher_vocab.items())
    return "extended" if extends and same_rules and student_rules[2] == "WordPiece" else "different"


def _rules(tokenizer: PreTrainedTokenizerBase) -> tuple[str, str, str]:
    """What decides how a fast tokenizer cuts a text besides its vocabulary: its normalizer and pre-tokenizer (as
    JSON) and its model's type."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    parts = (json.dumps(backend.get(name), sort_keys=True) for name in ("normalizer", "pre_tokenizer"))
    return *parts, str((backend.get("model") or {}).get("type"))


def term_support(student_tokenizer: PreTrainedTokenizerBase, teacher_tokenizer: PreTrainedTokenizerBase,
                 terms: Iterable[str | TermConfig], head: Head = "masked_lm") -> list[TermSupport]:
    """For each term (a kind of `TERM_SPECS`, or a recipe term whose options are checked too), whether it holds for
    the tokenizer pair on a model with this head: "masked_lm" (task-agnostic distillation), "sequence" or "token"
    (task KD of a sequence or a token classifier)."""
    return pair_support(tokenizer_pair(student_tokenizer, teacher_tokenizer), terms, head)


def pair_support(pair: PairKind, terms: Iterable[str | TermConfig], head: Head = "masked_lm") -> list[TermSupport]:
    """`term_support` for a pair kind known without the tokenizers."""
    return [_support(_kind(term), term if isinstance(term, TermConfig) else None, pair, head) for term in terms]


def _kind(term: str | TermConfig) -> str:
    kind = term.loss if isinstance(term, TermConfig) else term
    if kind not in TERM_SPECS:
        raise BiodistilError(f"unknown objective term {kind!r}; terms are {', '.join(TERM_SPECS)}")
    return kind


def _support(kind: str, cfg: TermConfig | None, pair: PairKind, head: Head) -> TermSupport:
    spec = TERM_SPECS[kind]
    if head == "masked_lm" and spec.scope == "task":
        return TermSupport(kind, False, "", "a classifier term: it has no place in a masked-LM objective")
    if pair == "same":
        return TermSupport(kind, True, "tokens", "one tokenization: token by token")
    if pair == "extended":
        return _extended(kind, head)
    if head != "masked_lm" and spec.scope != "masked_lm":
        return _classifier_across(kind, head)
    return _masked_lm_across(kind, cfg)


def _extended(kind: str, head: Head) -> TermSupport:
    if head == "masked_lm" and TERM_SPECS[kind].scope == "both":  # the vocabulary logit terms
        return TermSupport(kind, True, "tokens", "VE-KD: the teacher's |V_T| columns at positions: known (new tokens "
                                                 "are [MASK] for the teacher)")
    return TermSupport(kind, True, "tokens", "VE-KD: the teacher reads the student's ids, new tokens as [MASK]")


def _classifier_across(kind: str, head: Head) -> TermSupport:
    if kind == "ce":
        return TermSupport(kind, True, "tokens", "gold labels on the student's own tokens")
    if kind == "patient_kd":
        return TermSupport(kind, True, "sequence", "[CLS] / <s> states at position 0 on both sides")
    if head == "sequence":
        return TermSupport(kind, True, "sequence", "one row of class logits per example on both sides")
    return TermSupport(kind, True, "words", "class logits at each word's first token on both sides (first_tokens)")


def _masked_lm_across(kind: str, cfg: TermConfig | None) -> TermSupport:
    """Word-level terms, refused ones, and the options of a recipe term (`cfg`) that do not hold across tokenizers."""
    spec = TERM_SPECS[kind]
    if not spec.has_words:
        return TermSupport(kind, False, "", spec.no_words)
    if cfg is not None and kind == "attention_mse" and cfg.attention_map == "scores":
        return TermSupport(kind, False, "", "attention scores Q·Kᵀ/√d do not pool into words; use attention_map: "
                                            "probabilities")
    if cfg is not None and kind in ("logit_kl", "uld") and cfg.positions != "masked":
        return TermSupport(kind, False, "", f"positions: {cfg.positions}: across vocabularies the logits are "
                                            "compared at whole-word-masked words; use positions: masked")
    return TermSupport(kind, True, "words", spec.words)


def refuse_unsupported(rows: Iterable[TermSupport]) -> None:
    """Raise one error naming every refused term and what to change; nothing when all hold."""
    refused = [row for row in rows if not row.ok]
    if refused:
        lines = "; ".join(f"{row.term}: {row.reason}" for row in refused)
        raise BiodistilError(f"these objective terms do not hold for the student and teacher tokenizers: {lines}")
