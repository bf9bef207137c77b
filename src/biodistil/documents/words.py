"""Sentences and words of a document, with their character offsets: syntok's sentences, its tokens cut finer.

syntok (a maintained rule-based segmenter and tokeniser) splits each passage into sentences and tokens and gives
each token's offset into the text it read. Biomedical entities often end inside one of its tokens ("Li/DVP",
"5-HT6", "2Cl", "saline+DMSO"), so each token is cut further into runs of letters, runs of digits (a decimal
number whole) and single other characters: "Li", "/", "DVP"; "HT", "6". A passage is segmented on its own, so no
sentence crosses a passage (title and abstract). Words are [start, end) pairs into the document's text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from syntok import segmenter

from biodistil.documents.model import Fragment, Passage

PIECE = re.compile(r"[^\W\d_]+|\d+(?:[.,]\d+)*|\S")  # letters, a number, or one other visible character


def sentences(text: str, passages: Sequence[Passage]) -> list[list[Fragment]]:
    """The document's sentences, each a list of its words' [start, end) offsets into `text`."""
    found: list[list[Fragment]] = []
    for passage in passages:
        found.extend(_passage_sentences(text, passage))
    return found


def _passage_sentences(text: str, passage: Passage) -> list[list[Fragment]]:
    result = []
    for paragraph in segmenter.analyze(passage.text):
        for sentence in paragraph:
            words = [piece for token in sentence
                     for piece in _pieces(text, passage.offset + token.offset, token.value)]
            if words:
                result.append(words)
    return result


def _pieces(text: str, start: int, value: str) -> list[Fragment]:
    """The word pieces of one syntok token that starts at `start` in `text` (syntok keeps the text's offsets)."""
    if text[start:start + len(value)] != value:  # a token syntok rewrote: kept whole
        return [(start, start + len(value))] if value and start + len(value) <= len(text) else []
    return [(start + m.start(), start + m.end()) for m in PIECE.finditer(value)]
