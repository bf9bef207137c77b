"""Token alignment across tokenizers: a student's and a teacher's tokens of the same texts, mapped to shared units.

Two fast tokenizers split a text differently ("p53-deficient": cased WordPiece `p53 - deficient`, a byte-level BPE
`Ġp 53 - de ficient`), but both report each token's character span in the original text
(`return_offsets_mapping=True`), and those spans are what this module aligns. The unit is the word.

Rules
- **Words** are the pre-tokens of BERT's pre-tokenizer on the raw text (`words="bert"`, the default,
  `tokenizers.pre_tokenizers.BertPreTokenizer`): maximal runs of non-whitespace characters, each punctuation character
  (ASCII punctuation or a Unicode P* character) a word of its own — "IL-2," is `IL - 2 ,`, "(n=12)" is
  `( n = 12 )`. So a WordPiece token never straddles two words. `words="whitespace"` takes whitespace-separated runs
  ("IL-2," is one word): fewer, coarser units, which no token of a BERT, RoBERTa or ModernBERT tokenizer straddles.
- **A token belongs to the word that holds its anchor**, the first non-whitespace character of its span. Offsets that
  include a byte-level BPE token's leading space ("Ġp" as " p": RoBERTa with trim_offsets=False, ModernBERT's template
  post-processor) and offsets that exclude it (RoBERTa's default trim_offsets=True) thus give the same word, and a
  token of whitespace only ("Ġ", an empty span when trimmed) belongs to no word. A token that straddles two words
  (byte-level BPE keeps runs of punctuation and symbols together: ")." or "(±") is anchored in the word where it
  starts, and neither word is shared (below). Pieces of one character split into bytes ("MÃ", "¼ll" of "Müller")
  overlap; each belongs to the word of its own anchor.
- **Normalisation changes no offset**: an uncased WordPiece lowercases and strips accents ("Müller" → "muller"), yet
  its offsets index the original text, so "Müller" is one word on both sides.
- **Special tokens** ([CLS], [SEP], <s>, </s>, padding: the tokenizer's `special_tokens_mask`) belong to no word.
  With `sequence_units=True` (the default) the sequence's start token ([CLS] / <s>: the tokenizer's cls token, else its
  bos token) and its last end token ([SEP] / </s>: sep, else eos) are aligned with each other as two extra units, the
  first and the last: the sequence summary a classifier reads, and the tokens that hold much of an encoder's attention
  (word × word attention maps keep that mass). A pair needs the token on both sides and both sides' tokens covering
  the text from the same character (start) or to the same character (end): the end tokens of two sides truncated at
  different places close different text, and stay unpaired.
- **Shared units**: a word counts only when it is complete and its own on both sides: a token anchored in it; all its
  characters inside the span the side's anchored tokens cover (from the first anchor to the last token's end, which
  reaches over the zero-width marks an accent-stripping normaliser drops, e.g. the U+0301 of a decomposed "é"); no
  token over it and another word (a byte-level BPE's "Ġ(Â±" covers "(" and the "±" of "±SD": sharing either would
  mask `± ##S ##D` on one side against "SD", or "(±" against "(", on the other, and pool two words' states into
  one); and no token that truncation dropped overlapping it (a cut between the bytes of one character keeps "Î" of
  "α" but not its "±"). So the tokens of a shared word spell that word, and only it, on both sides. Truncation cuts
  the two sides at different places; a word cut, or left out, on either side is not shared. Tokens of words that are
  not shared belong to no unit (-1).

Output: per text a `TextAlignment` (each side's unit id per token, -1 for none; each unit's character span); for a
batch an `AlignedBatch` with both sides' model inputs, [B, L_side] unit ids and [B, W] unit and word masks. From
them `membership` and `pooling_matrix` build the [B, W, L] matrices the losses of `biodistil.losses.cross_tokenizer`
take (mean over a unit's tokens, or its first token). `mask_same_words` masks the same words on both sides (whole
words), and `first_tokens` gives each chosen word's first token on each side, where vocabulary logits are compared.
"""

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from tokenizers import Encoding, pre_tokenizers
from transformers import PreTrainedTokenizerBase

from biodistil.config import MaskingConfig
from biodistil.data.batch import Batch, UnitIds
from biodistil.data.masking import IGNORE_INDEX, MaskingVocabulary
from biodistil.errors import BiodistilError

NO_UNIT = -1

WordRule = Literal["bert", "whitespace"]
Pooling = Literal["mean", "first"]
Span = tuple[int, int]

_PRE_TOKENIZERS = {"bert": pre_tokenizers.BertPreTokenizer(), "whitespace": pre_tokenizers.WhitespaceSplit()}


@dataclass(frozen=True)
class SideTokens:
    """One tokenizer's tokens of one text: ids, character spans [start, end) in the text, special-token flags, the ids
    of its sequence start and end tokens (None when it has none) and the spans of the tokens truncation dropped."""

    ids: Sequence[int]
    offsets: Sequence[Span]
    special: Sequence[bool]
    start_id: int | None = None
    end_id: int | None = None
    dropped: Sequence[Span] = ()  # spans of the tokens truncation removed right after the kept ones


@dataclass(frozen=True)
class TextAlignment:
    """The shared units of one text: each side's unit per token (NO_UNIT for none), each unit's character span (None
    for the two sequence units) and whether it is a word."""

    student_units: tuple[int, ...]
    teacher_units: tuple[int, ...]
    spans: tuple[Span | None, ...]
    more_units: tuple[tuple[int, ...], ...] = ()  # several teachers: the units of each further teacher's tokens

    @property
    def num_units(self) -> int:
        return len(self.spans)

    @property
    def is_word(self) -> tuple[bool, ...]:
        return tuple(span is not None for span in self.spans)


@dataclass(frozen=True)
class AlignedBatch:
    """Texts tokenized by both tokenizers (padded model inputs) and aligned: [B, L_side] unit ids (NO_UNIT for tokens of
    no shared unit and for padding), `unit_mask` [B, W] (the units each text has) and `word_mask` [B, W] (those that
    are words, not sequence units)."""

    student_inputs: dict[str, torch.Tensor]
    teacher_inputs: dict[str, torch.Tensor]
    student_units: torch.Tensor
    teacher_units: torch.Tensor
    unit_mask: torch.Tensor
    word_mask: torch.Tensor
    alignments: tuple[TextAlignment, ...]
    more_teachers: tuple[tuple[dict[str, torch.Tensor], torch.Tensor], ...] = ()  # (inputs, unit ids) per teacher

    @property
    def num_units(self) -> int:
        return self.unit_mask.size(1)

    def to_batch(self) -> Batch:
        """The aligned batch as the engine carries it: the student's inputs, the teacher's as its payload, the unit
        ids and masks as the batch's alignment; several teachers: each further teacher's inputs and unit ids
        (`unit_ids`) as its payload."""
        sides = [{key: inputs[key] for key in ("input_ids", "attention_mask")}
                 for inputs in (self.student_inputs, self.teacher_inputs)]
        more = [{**{key: inputs[key] for key in ("input_ids", "attention_mask")}, "unit_ids": units}
                for inputs, units in self.more_teachers]
        return Batch(sides[0], alignment=UnitIds(self.student_units, self.teacher_units, self.unit_mask,
                                                 self.word_mask), teachers=[sides[1], *more])

    @classmethod
    def from_batch(cls, batch: Batch) -> "AlignedBatch":
        """The aligned batch of `to_batch()` (without the per-text alignments, which only its builder needs)."""
        units = batch.alignment
        if units is None:
            raise ValueError("this batch is not aligned across tokenizers (no alignment)")
        teacher = {key: batch.teacher[key] for key in ("input_ids", "attention_mask")}
        return cls({key: batch.inputs[key] for key in ("input_ids", "attention_mask")}, teacher,
                   units.student_units, units.teacher_units, units.unit_mask, units.word_mask, ())


@dataclass(frozen=True)
class MaskedSide:
    """One side's corrupted input ids and MLM labels (the original id at every token of a chosen word, else -100)."""

    input_ids: torch.Tensor
    labels: torch.Tensor


# ------------------------------------------------------------------------------------------ one text
def word_spans(text: str, words: WordRule = "bert") -> list[Span]:
    """Character spans [start, end) of the words of `text`: BERT's pre-tokens ("bert") or whitespace-separated runs."""
    if words not in _PRE_TOKENIZERS:
        raise ValueError(f"words must be one of {sorted(_PRE_TOKENIZERS)}, not {words!r}")
    return [span for _, span in _PRE_TOKENIZERS[words].pre_tokenize_str(text)]


def token_words(text: str, side: SideTokens, spans: Sequence[Span]) -> list[int]:
    """The word (an index into `spans`) of each token: the word holding the token's anchor, its first non-whitespace
    character; NO_UNIT for special tokens and for tokens with no such character (whitespace, empty spans)."""
    owners = _owners(text, spans)
    return [NO_UNIT if special else _anchor_owner(text, owners, span)
            for span, special in zip(side.offsets, side.special, strict=True)]


def _anchor_owner(text: str, owners: list[int], span: Span) -> int:
    anchor = _anchor(text, span)
    return NO_UNIT if anchor is None else owners[anchor]


def _anchor(text: str, span: Span) -> int | None:
    """The position of the span's first non-whitespace character, None when it has none."""
    start, end = span
    for position in range(start, min(end, len(text))):
        if not text[position].isspace():
            return position
    return None


_ZERO_WIDTH = ("Mn", "Me", "Cf")  # combining marks and format characters: normalisers may drop them


def covered_span(text: str, side: SideTokens, words_of_tokens: Sequence[int]) -> Span | None:
    """The characters a side's tokens cover: from the first anchored token's anchor (untrimmed byte-level offsets
    include a leading space) to the last one's end, extended over zero-width characters a normaliser dropped (None
    when no token is anchored in a word); truncation cuts a side at a token."""
    anchored = [span for span, word in zip(side.offsets, words_of_tokens, strict=True) if word != NO_UNIT]
    if not anchored:
        return None
    first = min(position for span in anchored if (position := _anchor(text, span)) is not None)
    last = max(end for _, end in anchored)
    while last < len(text) and unicodedata.category(text[last]) in _ZERO_WIDTH:
        last += 1
    return first, last


def complete_words(text: str, side: SideTokens, words_of_tokens: Sequence[int], spans: Sequence[Span]) -> set[int]:
    """The words a side holds whole and alone: a token anchored in each, all its characters inside `covered_span`,
    no token anchored in another word nor any token truncation dropped overlapping it."""
    covered = covered_span(text, side, words_of_tokens)
    if covered is None:
        return set()
    first, last = covered
    whole = {word for word in words_of_tokens if word != NO_UNIT and first <= spans[word][0] and spans[word][1] <= last}
    owners = _owners(text, spans)
    tokens = [(span, word) for span, word in zip(side.offsets, words_of_tokens, strict=True) if word != NO_UNIT]
    for (start, end), word in [*tokens, *((span, NO_UNIT) for span in side.dropped)]:
        others = {owners[c] for c in range(start, min(end, len(text))) if owners[c] not in (word, NO_UNIT)}
        if others:  # a token over two words: neither is a unit of its own on this side
            whole -= others | {word}
    return whole


def _owners(text: str, spans: Sequence[Span]) -> list[int]:
    """The word of every character of `text` (NO_UNIT for characters between words)."""
    owners = [NO_UNIT] * len(text)
    for word, (start, end) in enumerate(spans):
        owners[start:end] = [word] * (end - start)
    return owners


def align_tokens(
    text: str, student: SideTokens, teacher: SideTokens, words: WordRule = "bert", sequence_units: bool = True,
    more: Sequence[SideTokens] = (),
) -> TextAlignment:
    """The shared units of `text` (module docstring): the words complete on both sides in text order, between the
    sequence start unit and the sequence end unit (`sequence_units`, `_sequence_pairs`). Several teachers (`more`,
    the further teachers' tokens): the words complete on every side, and a sequence unit only where every teacher
    pairs it with the student, so that the same units — and later the same masked words — exist on every side."""
    spans = word_spans(text, words)
    teachers = [teacher, *more]
    student_words = token_words(text, student, spans)
    teacher_words = [token_words(text, side, spans) for side in teachers]
    shared = complete_words(text, student, student_words, spans)
    for side, words_of_tokens in zip(teachers, teacher_words, strict=True):
        shared &= complete_words(text, side, words_of_tokens, spans)
    pairs = [_sequence_pairs(text, student, side, student_words, words_of_tokens) if sequence_units
             else (None, None) for side, words_of_tokens in zip(teachers, teacher_words, strict=True)]
    starts, ends = ([pair[edge] for pair in pairs] for edge in (0, 1))
    has_start, has_end = all(p is not None for p in starts), all(p is not None for p in ends)
    offset = int(has_start)
    unit_of_word = {word: offset + i for i, word in enumerate(sorted(shared))}
    unit_spans: list[Span | None] = [None] * offset + [spans[w] for w in sorted(shared)] + [None] * int(has_end)

    def units_of(words_of_tokens: Sequence[int], start: int | None, end: int | None) -> tuple[int, ...]:
        units = [unit_of_word.get(word, NO_UNIT) for word in words_of_tokens]
        if has_start:
            units[start] = 0
        if has_end:
            units[end] = len(unit_spans) - 1
        return tuple(units)

    def position(pair: tuple[int, int] | None, side: int) -> int | None:  # side 0: the student's, 1: the teacher's
        return None if pair is None else pair[side]

    student_units = units_of(student_words, position(starts[0], 0), position(ends[0], 0))
    sides = [units_of(words_of_tokens, position(start, 1), position(end, 1))
             for words_of_tokens, start, end in zip(teacher_words, starts, ends, strict=True)]
    return TextAlignment(student_units, sides[0], tuple(unit_spans), tuple(sides[1:]))


def _sequence_pairs(
    text: str, student: SideTokens, teacher: SideTokens, student_words: Sequence[int], teacher_words: Sequence[int]
) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """Positions (student, teacher) of the paired start tokens and of the paired end tokens, each None when unpaired:
    a pair needs the token on both sides, and both sides' tokens covering the text from the same character (start) or
    to the same character (end) — two sides truncated at different places close different text."""
    student_span, teacher_span = covered_span(text, student, student_words), covered_span(text, teacher, teacher_words)
    pairs = []
    for which, edge in (("start", 0), ("end", 1)):
        same_edge = (student_span is None and teacher_span is None) or (
            student_span is not None and teacher_span is not None and student_span[edge] == teacher_span[edge])
        pairs.append(_sequence_tokens(student, teacher, which) if same_edge else None)
    return pairs[0], pairs[1]


def _sequence_tokens(student: SideTokens, teacher: SideTokens, which: str) -> tuple[int, int] | None:
    """Positions of the first start token (which="start") or the last end token ("end") on both sides, or None when
    either side has none."""
    positions = []
    for side in (student, teacher):
        token_id = side.start_id if which == "start" else side.end_id
        found = [i for i, (t, special) in enumerate(zip(side.ids, side.special, strict=True))
                 if special and token_id is not None and t == token_id]
        if not found:
            return None
        positions.append(found[0] if which == "start" else found[-1])
    return positions[0], positions[1]


# ------------------------------------------------------------------------------------------ a batch
def align_texts(texts: Sequence[str], student_tokenizer: PreTrainedTokenizerBase,
                teacher_tokenizer: PreTrainedTokenizerBase, *, student_max_length: int | None = None,
                teacher_max_length: int | None = None, words: WordRule = "bert", sequence_units: bool = True,
                more_teachers: Sequence[tuple[PreTrainedTokenizerBase, int | None]] = ()) -> AlignedBatch:
    """Tokenize `texts` with both fast tokenizers (each truncated at its own max length, padded to its longest text)
    and align them (`align_tokens`); units are padded to the batch's largest W. Several teachers: `more_teachers`,
    (tokenizer, max length) of each further teacher, aligned with all the others (units every side shares)."""
    student_inputs, student_sides = _encode(student_tokenizer, texts, student_max_length)
    teacher_inputs, teacher_sides = _encode(teacher_tokenizer, texts, teacher_max_length)
    more = [_encode(tokenizer, texts, max_length) for tokenizer, max_length in more_teachers]
    alignments = tuple(align_tokens(text, s, t, words, sequence_units, [sides[i] for _, sides in more])
                       for i, (text, s, t) in enumerate(zip(texts, student_sides, teacher_sides, strict=True)))
    width = max((a.num_units for a in alignments), default=0)
    more_units = tuple((inputs, _padded([a.more_units[k] for a in alignments], inputs["input_ids"].size(1), NO_UNIT))
                       for k, (inputs, _) in enumerate(more))
    return AlignedBatch(student_inputs, teacher_inputs,
                        _padded([a.student_units for a in alignments], student_inputs["input_ids"].size(1), NO_UNIT),
                        _padded([a.teacher_units for a in alignments], teacher_inputs["input_ids"].size(1), NO_UNIT),
                        _padded([[True] * a.num_units for a in alignments], width, False).bool(),
                        _padded([a.is_word for a in alignments], width, False).bool(),
                        alignments, more_units)


def _encode(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int | None
) -> tuple[dict[str, torch.Tensor], list[SideTokens]]:
    """Padded model inputs of `texts` and each text's `SideTokens`."""
    if not getattr(tokenizer, "is_fast", False):
        raise BiodistilError(f"aligning tokens across tokenizers needs fast tokenizers (character offsets); "
                             f"{type(tokenizer).__name__} is not one: load it with use_fast=True")
    encoded = tokenizer(list(texts), padding=True, truncation=max_length is not None, max_length=max_length,
                        return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
    offsets, special = encoded.pop("offset_mapping").tolist(), encoded.pop("special_tokens_mask").tolist()
    start_id, end_id = sequence_token_ids(tokenizer)
    dropped = [_dropped_spans(encoding) for encoding in encoded.encodings or [None] * len(offsets)]
    sides = [SideTokens(ids, [(int(a), int(b)) for a, b in spans], [bool(flag) for flag in flags], start_id, end_id,
                        cut)
             for ids, spans, flags, cut in zip(encoded["input_ids"].tolist(), offsets, special, dropped, strict=True)]
    return dict(encoded), sides


def _dropped_spans(encoding: Encoding | None) -> list[Span]:
    """The spans of the ordinary tokens right after a truncation (the first overflowing piece): those that can
    overlap the last word kept."""
    if encoding is None or not encoding.overflowing:
        return []
    after = encoding.overflowing[0]
    return [tuple(span) for span, special in zip(after.offsets, after.special_tokens_mask, strict=True)
            if not special]


def sequence_token_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int | None, int | None]:
    """Ids of the sequence start token (cls, else bos) and end token (sep, else eos); None where there is none."""
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return start, end


def _padded(rows: Sequence[Sequence[int | bool]], length: int, fill: int | bool) -> torch.Tensor:
    out = torch.full((len(rows), length), int(fill), dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    return out


# ------------------------------------------------------------------------------------------ pooling matrices
def membership(unit_ids: torch.Tensor, num_units: int) -> torch.Tensor:
    """M [B, W, L] bool: M[b, u, i] = token i of text b belongs to unit u (from [B, L] unit ids, NO_UNIT for none)."""
    units = torch.arange(num_units, device=unit_ids.device)
    return unit_ids.long()[:, None, :] == units[None, :, None]


def pooling_matrix(unit_ids: torch.Tensor, num_units: int, how: Pooling = "mean") -> torch.Tensor:
    """P [B, W, L] float32 with P·h the units' states: "mean": P[u, i] = M[u, i] / |u| (rows sum to 1; a unit
    without tokens, padding, is a zero row); "first": P[u, i] = 1 at the first token of u."""
    member = membership(unit_ids, num_units).float()
    if how == "mean":
        return member / member.sum(-1, keepdim=True).clamp_min(1.0)
    if how == "first":
        return member * (member.cumsum(-1) == 1)
    raise ValueError(f"pooling must be 'mean' or 'first', not {how!r}")


def first_tokens(unit_ids: torch.Tensor, units: torch.Tensor) -> torch.Tensor:
    """[B, L] bool: the first token of every unit where `units` [B, W] is True. Units are numbered in text order and
    tokens come in text order, so the mask's positions in row-major order are in (row, unit) order: a model's logit
    rows read at this mask pair up with the other side's."""
    return (pooling_matrix(unit_ids, units.size(1), "first") * units[..., None]).sum(1) > 0


def tokens_of_units(unit_ids: torch.Tensor, units: torch.Tensor) -> torch.Tensor:
    """[B, L] bool: the tokens of the units where `units` [B, W] is True."""
    if units.size(1) == 0:
        return torch.zeros_like(unit_ids, dtype=torch.bool)
    return units.gather(1, unit_ids.long().clamp_min(0)) & (unit_ids >= 0)


# ------------------------------------------------------------------------------------------ whole-word masking
def mask_same_words(batch: AlignedBatch, student_vocab: MaskingVocabulary, teacher_vocab: MaskingVocabulary,
                    cfg: MaskingConfig, generator: torch.Generator) -> tuple[torch.Tensor, MaskedSide, MaskedSide]:
    """Whole-word MLM masking of the same words on both sides: (chosen words [B, W], student side, teacher side).

    Each shared word (never a sequence unit, never a word the two sides do not share) is chosen with probability
    `cfg.probability`; one draw per chosen word picks its corruption, the same on both sides: all its tokens become
    [MASK] (`cfg.mask_ratio`), random ordinary tokens of each side's vocabulary (`cfg.random_ratio`), or stay. Labels
    hold the original id at every token of a chosen word. (`cfg.whole_word` is implied; static masks are not offered.)
    """
    words = draw_words(batch.word_mask, cfg, generator)
    sides = [corrupt_side(inputs["input_ids"], units, words, vocab, generator)
             for inputs, units, vocab in ((batch.student_inputs, batch.student_units, student_vocab),
                                          (batch.teacher_inputs, batch.teacher_units, teacher_vocab))]
    return words[0], sides[0], sides[1]


WordDraw = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (chosen, to [MASK], to random tokens), each [B, W]


def draw_words(word_mask: torch.Tensor, cfg: MaskingConfig, generator: torch.Generator) -> WordDraw:
    """Which words `mask_same_words` masks and how: each word of `word_mask` chosen with `cfg.probability`, one draw per
    chosen word for its corruption (the same on every side)."""
    chosen = (torch.rand(word_mask.shape, generator=generator) < cfg.probability) & word_mask
    action = torch.rand(word_mask.shape, generator=generator)
    to_mask = chosen & (action < cfg.mask_ratio)
    to_random = chosen & (action >= cfg.mask_ratio) & (action < cfg.mask_ratio + cfg.random_ratio)
    return chosen, to_mask, to_random


def corrupt_side(input_ids: torch.Tensor, unit_ids: torch.Tensor, words: WordDraw, vocab: MaskingVocabulary,
                 generator: torch.Generator) -> MaskedSide:
    """One side's tokens of the drawn words corrupted as drawn (random tokens from this side's vocabulary), and its
    labels."""
    chosen, to_mask, to_random = (tokens_of_units(unit_ids, w) for w in words)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    corrupted = input_ids.masked_fill(to_mask, vocab.mask_id)
    ordinary = (~vocab.special).nonzero().squeeze(1)
    picks = torch.randint(len(ordinary), (int(to_random.sum()),), generator=generator)
    corrupted[to_random] = ordinary[picks].to(corrupted.dtype)
    return MaskedSide(corrupted, labels)
