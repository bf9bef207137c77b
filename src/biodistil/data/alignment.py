"""Word ↔ sub-word label alignment for token classification with a fast tokenizer's `word_ids()`.

Tokenizing: `tokenize_words` hands a sentence's words to the tokenizer as pre-split words, in the form the
tokenizer needs (byte-level BPE: each word with its leading space, see `words_for_tokenizer`).

Training: `align_labels` turns one label id per word into one label id per sub-word token, −100 (ignored by
the loss) for special tokens and, under policy "first", for the continuation pieces of a word. Policy "all"
labels every piece with its word's label (as in the compact biomedical transformers paper); with IOB tags
pass `b_to_i` so a B- word's continuation pieces get the matching I- label.

Evaluation: `word_predictions` maps token predictions back to one prediction per word (each word's first
piece). Words that were truncated away get a fill label; the result records how many, so the caller can
report it (see `WordPredictions.num_filled`). `chunk_words` splits a long
sentence into windows of whole words for the "split" truncation policy.
"""

from collections.abc import Sequence
from typing import Any, Literal

from transformers import BatchEncoding, PreTrainedTokenizerBase

IGNORE_INDEX = -100

LabelPolicy = Literal["first", "all"]


def words_for_tokenizer(tokenizer: PreTrainedTokenizerBase, words: Sequence[str]) -> list[str]:
    """The words as `tokenizer(words, is_split_into_words=True)` must receive them.

    A byte-level BPE tokenizer (RoBERTa, ModernBERT, GPT-2 style) marks a word that follows a space with "Ġ" and
    tokenizes each pre-split word as it is: without its space, "fever" would be split like the inside of a longer
    word ("fe", "ver") instead of as "Ġfever". So each word gets the space it has in running text — the first word
    of a sentence too, so that a word is split into the same pieces wherever it stands (the add_prefix_space=True
    convention). Tokenizers that add the space themselves are unaffected (ByteLevel adds none to a word that starts
    with one); WordPiece and SentencePiece tokenizers get the words unchanged.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre_tokenizer = backend.pre_tokenizer if backend is not None else None
    if pre_tokenizer is not None and "ByteLevel(" in repr(pre_tokenizer):
        return [word if word[:1].isspace() else f" {word}" for word in words]
    return list(words)


def tokenize_words(tokenizer: PreTrainedTokenizerBase, words: Sequence[str], **kwargs: Any) -> BatchEncoding:
    """`tokenizer` on one sentence given as words (`is_split_into_words=True`); `word_ids()` index `words`. Without
    truncation the caller windows a long sentence itself, so transformers' "sequence length is longer than the
    specified maximum" warning is silenced for it (`verbose=False`)."""
    if not kwargs.get("truncation"):
        kwargs.setdefault("verbose", False)
    return tokenizer(words_for_tokenizer(tokenizer, words), is_split_into_words=True, **kwargs)


def _is_first_piece(word_ids: Sequence[int | None], position: int) -> bool:
    return position == 0 or word_ids[position - 1] != word_ids[position]


def align_labels(word_ids: Sequence[int | None], word_label_ids: Sequence[int], policy: LabelPolicy = "first",
                 b_to_i: dict[int, int] | None = None) -> list[int]:
    """One label id per token from one label id per word; special tokens (word id None) get −100.

    "first": only each word's first piece is labelled, other pieces −100. "all": every piece gets its word's
    label, except that continuation pieces map through `b_to_i` (e.g. id of B → id of I) when given.
    """
    if policy not in ("first", "all"):
        raise ValueError(f"label policy must be 'first' or 'all', not {policy!r}")
    labels: list[int] = []
    for position, word in enumerate(word_ids):
        if word is None:
            labels.append(IGNORE_INDEX)
            continue
        if not 0 <= word < len(word_label_ids):
            raise ValueError(f"word id {word} at token {position} has no label ({len(word_label_ids)} words)")
        label = word_label_ids[word]
        if _is_first_piece(word_ids, position):
            labels.append(label)
        elif policy == "first":
            labels.append(IGNORE_INDEX)
        else:
            labels.append(b_to_i.get(label, label) if b_to_i else label)
    return labels


class WordPredictions(list[int]):
    """A list of per-word label ids that also records how many words got the fill label (`num_filled`)."""

    def __init__(self, labels: list[int], num_filled: int) -> None:
        super().__init__(labels)
        self.num_filled = num_filled


def word_predictions(word_ids: Sequence[int | None], token_predictions: Sequence[int], num_words: int,
                     fill_label_id: int = 0) -> WordPredictions:
    """One predicted label id per word, taken from the word's first sub-word token.

    Words with no token (truncated away) get `fill_label_id` (e.g. the id of "O"); their number is in the
    result's `num_filled` and must be reported by the caller. `token_predictions` may be ints, or a numpy
    array / tensor row of the same length as `word_ids`.
    """
    if len(token_predictions) != len(word_ids):
        raise ValueError(f"{len(token_predictions)} token predictions for {len(word_ids)} tokens")
    found: dict[int, int] = {}
    for position, word in enumerate(word_ids):
        if word is None or word in found:
            continue
        if not 0 <= word < num_words:
            raise ValueError(f"word id {word} at token {position} is outside 0..{num_words - 1}")
        found[word] = int(token_predictions[position])
    labels = [found.get(word, fill_label_id) for word in range(num_words)]
    return WordPredictions(labels, num_words - len(found))


def chunk_words(pieces_per_word: Sequence[int], max_pieces: int,
                continues: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """Split words into consecutive [start, end) windows of at most `max_pieces` sub-word pieces.

    For the "split" policy: tokenize each window separately (max_pieces = max_length minus special tokens),
    so no word is lost. A single word longer than `max_pieces` gets a window of its own (and is truncated).
    `continues[i]` (a word tagged I-…: it continues an entity) keeps word i in the window of the word before it:
    a window ends before the entity that would not fit instead, unless the entity alone is longer than a window.
    """
    if max_pieces < 1:
        raise ValueError(f"max_pieces must be at least 1, not {max_pieces}")
    windows: list[tuple[int, int]] = []
    start, used = 0, 0
    for index, pieces in enumerate(pieces_per_word):
        if index > start and used + pieces > max_pieces:
            cut = index
            while continues is not None and cut > start + 1 and continues[cut]:
                cut -= 1  # back to the word that starts the entity
            cut = cut if continues is None or not continues[cut] else index
            windows.append((start, cut))
            start, used = cut, sum(max(p, 0) for p in pieces_per_word[cut:index])
        used += max(pieces, 0)
    if start < len(pieces_per_word):
        windows.append((start, len(pieces_per_word)))
    return windows
