"""Randomized general-domain transfer data: passages and questions sampled from a unigram model.

Passages are drawn word by word from the unigram distribution of a source corpus; questions are a
starter word ("is", "what", ...) followed by words drawn uniformly from the source vocabulary.
Every output is reproducible for a seed and uses only source words (plus the starter words).
"""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from biodistil.errors import BiodistilError

DEFAULT_STARTERS: tuple[str, ...] = ("is", "does", "do", "are", "can", "was", "did", "what", "how", "which")

Length = int | tuple[int, int]


@dataclass(frozen=True)
class UnigramModel:
    """Vocabulary (in order of first occurrence) and the count of each word in the source passages."""

    words: tuple[str, ...]
    counts: tuple[int, ...]

    @classmethod
    def from_passages(cls, passages: Iterable[str], lowercase: bool = False) -> "UnigramModel":
        """Count whitespace-separated words over `passages` (lowercased first when `lowercase`)."""
        counter: Counter[str] = Counter()
        for passage in passages:
            counter.update((passage.lower() if lowercase else passage).split())
        if not counter:
            raise BiodistilError("the source passages contain no words; cannot build a unigram model")
        return cls(words=tuple(counter), counts=tuple(counter.values()))

    @cached_property
    def probabilities(self) -> np.ndarray:
        """Unigram probabilities p(w) = count(w) / Σ counts, aligned with `words`."""
        counts = np.asarray(self.counts, dtype=np.float64)
        return counts / counts.sum()


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _length_range(length: Length, name: str) -> tuple[int, int]:
    """An int or an inclusive (min, max) pair → (min, max), both >= 1."""
    if _is_int(length):
        bounds = (int(length), int(length))
    elif isinstance(length, tuple | list) and len(length) == 2 and all(_is_int(v) for v in length):
        bounds = (int(length[0]), int(length[1]))
    else:
        bounds = (0, 0)
    if not 1 <= bounds[0] <= bounds[1]:
        raise BiodistilError(f"{name} must be an int >= 1 or a (min, max) range with 1 <= min <= max, got {length!r}")
    return bounds


def _check_n(n: int) -> None:
    if n < 0:
        raise BiodistilError(f"number of samples must be >= 0, got {n}")


def _draw_length(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def _passage(model: UnigramModel, rng: np.random.Generator, bounds: tuple[int, int]) -> str:
    ids = rng.choice(len(model.words), size=_draw_length(rng, bounds), p=model.probabilities)
    return " ".join(model.words[i] for i in ids)


def _question(model: UnigramModel, rng: np.random.Generator, bounds: tuple[int, int], starters: Sequence[str]) -> str:
    starter = starters[int(rng.integers(len(starters)))]
    ids = rng.integers(0, len(model.words), size=_draw_length(rng, bounds))
    return " ".join([starter, *(model.words[i] for i in ids)])


def _check_starters(starters: Sequence[str]) -> tuple[str, ...]:
    if isinstance(starters, str) or not starters:
        raise BiodistilError(f"starters must be a non-empty list of words, got {starters!r}")
    return tuple(starters)


def random_passages(model: UnigramModel, n: int, length: Length, seed: int) -> list[str]:
    """`n` passages of `length` words (an int or an inclusive (min, max) range), each word ~ unigram(p)."""
    _check_n(n)
    bounds = _length_range(length, "length")
    rng = np.random.default_rng(seed)
    return [_passage(model, rng, bounds) for _ in range(n)]


def random_pairs(model: UnigramModel, n: int, question_length: Length, passage_length: Length, seed: int,
                 starters: Sequence[str] = DEFAULT_STARTERS) -> list[tuple[str, str]]:
    """`n` (question, passage) pairs for pair tasks: a question is a uniformly chosen starter, then
    `question_length` words (after the starter) drawn uniformly from the vocabulary; a passage as in
    `random_passages`."""
    _check_n(n)
    q_bounds = _length_range(question_length, "question_length")
    p_bounds = _length_range(passage_length, "passage_length")
    chosen = _check_starters(starters)
    rng = np.random.default_rng(seed)
    return [(_question(model, rng, q_bounds, chosen), _passage(model, rng, p_bounds)) for _ in range(n)]
