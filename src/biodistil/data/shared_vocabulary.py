"""The strings two vocabularies share, across the conventions of WordPiece, byte-level BPE and SentencePiece.

A token's **key** is the text it stands for, with its convention's marks removed and normalised as both tokenizers
normalise their input:
- WordPiece: the continuation prefix goes ("##53" → "53"; "p53" → "p53");
- byte-level BPE (RoBERTa, ModernBERT, GPT-2): the byte characters are decoded to UTF-8 ("Ã©" → "é") and the leading
  space a "Ġ" stands for goes ("Ġcell" → "cell"); a token holding part of a character's bytes has no key;
- SentencePiece (Metaspace): the "▁" word-start mark goes;
- then each tokenizer's normalizer is applied, the student's and the teacher's (an uncased BERT's lowercasing and
  accent stripping: a cased "Müller" and an uncased "muller" name the same key), and surrounding whitespace is
  stripped. Tokens left empty (whitespace), special tokens ([CLS], [PAD], <s>, [UNK], [MASK] ...: the tokenizer's
  special and added tokens) and BERT's "[unusedN]" placeholders have no key.

Word-start marks are dropped on purpose: a byte-level BPE writes a word after punctuation ("(n") without "Ġ", where a
WordPiece writes a word start; comparing strings, not (string, position-in-word) pairs, keeps those together. Several
tokens of one side may share a key ("p53", "##p53"; "The" and "the" beside an uncased vocabulary): a distribution
over a vocabulary becomes one over keys by summing the probabilities of each key's tokens
(`biodistil.losses.cross_tokenizer.shared_vocab_kl_loss`). The shared keys are those both sides have.
"""

import re
from dataclasses import dataclass

import torch
from tokenizers import models
from transformers import PreTrainedTokenizerBase

NO_KEY = -1
_UNUSED = re.compile(r"\[unused\d+\]")


@dataclass(frozen=True)
class SharedVocabulary:
    """The keys both vocabularies name, and each token's key id (NO_KEY for tokens of no shared key): `student_index`
    [V_S] and `teacher_index` [V_T], as long as each model's logit rows."""

    keys: tuple[str, ...]
    student_index: torch.Tensor
    teacher_index: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.keys)


def shared_vocabulary(
    student_tokenizer: PreTrainedTokenizerBase,
    teacher_tokenizer: PreTrainedTokenizerBase,
    student_size: int | None = None,
    teacher_size: int | None = None,
) -> SharedVocabulary:
    """The keys both tokenizers' vocabularies name (module docstring), sorted, and each token's key id; `*_size` is the
    length of a model's logit rows when its embedding matrix is larger than its tokenizer (padded rows: NO_KEY)."""
    tokenizers = (student_tokenizer, teacher_tokenizer)
    student_keys, teacher_keys = (token_keys(tokenizer, tokenizers) for tokenizer in tokenizers)
    keys = tuple(sorted(set(student_keys.values()) & set(teacher_keys.values())))
    ids = {key: i for i, key in enumerate(keys)}
    return SharedVocabulary(
        keys,
        _index(student_keys, ids, student_size or len(student_tokenizer)),
        _index(teacher_keys, ids, teacher_size or len(teacher_tokenizer)),
    )


def token_keys(
    tokenizer: PreTrainedTokenizerBase, normalising: tuple[PreTrainedTokenizerBase, ...] = ()
) -> dict[int, str]:
    """Each token id's key, normalised by the normalizers of `normalising` (default: the tokenizer's own); tokens
    without a key are left out."""
    excluded = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    normalisers = [t.backend_tokenizer.normalizer for t in (normalising or (tokenizer,))]
    unmark = _unmarker(tokenizer)
    keys = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id in excluded or _UNUSED.fullmatch(token):
            continue
        key = unmark(token)
        for normaliser in normalisers:
            key = normaliser.normalize_str(key) if key and normaliser is not None else key
        if key and key.strip():
            keys[token_id] = key.strip()
    return keys


def _unmarker(tokenizer: PreTrainedTokenizerBase):
    """The function that turns one of the tokenizer's token strings into its text (None: not a whole text)."""
    backend = tokenizer.backend_tokenizer
    if isinstance(backend.model, models.WordPiece):
        prefix = backend.model.continuing_subword_prefix
        return lambda token: token[len(prefix):] if prefix and token.startswith(prefix) else token
    if "ByteLevel" in repr(backend.pre_tokenizer) or "ByteLevel" in repr(backend.decoder):
        return _byte_level_text
    if "Metaspace" in repr(backend.pre_tokenizer):
        return lambda token: token.replace("▁", " ")
    return lambda token: token


def _byte_level_text(token: str) -> str | None:
    """The UTF-8 text of a byte-level token ("Ġcaf" → " caf"), None when its bytes are not whole characters."""
    try:
        return bytes(_BYTE_OF_CHAR[char] for char in token).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return None


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte ↔ character table, inverted: printable Latin-1 bytes stand for themselves, the others for
    chr(256 + n) in byte order (the space, byte 32, is "Ġ")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + shifted)] = byte
            shifted += 1
    return table


_BYTE_OF_CHAR = _byte_of_char()


def _index(token_keys: dict[int, str], ids: dict[str, int], size: int) -> torch.Tensor:
    index = torch.full((size,), NO_KEY, dtype=torch.long)
    for token_id, key in token_keys.items():
        if key in ids and token_id < size:
            index[token_id] = ids[key]
    return index
