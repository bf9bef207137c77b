"""Randomized transfer data: reproducible, seed-dependent, and built only from source words."""

import pytest

from biodistil.errors import BiodistilError
from biodistil.kd.random_text import (
    DEFAULT_STARTERS,
    UnigramModel,
    random_pairs,
    random_passages,
)

SOURCE = [
    "The cat sat on the mat",
    "the dog ate the bone and the cat slept",
    "A bird sang",
]


def random_questions(model: UnigramModel, n: int, length: object, seed: int, **starters: object) -> list[str]:
    """The questions of `random_pairs` (one-word passages)."""
    return [question for question, _ in random_pairs(model, n, length, 1, seed, **starters)]  # type: ignore[arg-type]


@pytest.fixture
def model() -> UnigramModel:
    return UnigramModel.from_passages(SOURCE)


def test_unigram_counts_and_probabilities(model: UnigramModel) -> None:
    counts = dict(zip(model.words, model.counts, strict=True))
    # "the" ×4 (case kept), "The" ×1, "cat" ×2, 18 words in all
    assert counts["the"] == 4 and counts["The"] == 1 and counts["cat"] == 2
    assert sum(model.counts) == 18
    probs = dict(zip(model.words, model.probabilities, strict=True))
    assert probs["the"] == pytest.approx(4 / 18)
    lowered = UnigramModel.from_passages(SOURCE, lowercase=True)
    assert dict(zip(lowered.words, lowered.counts, strict=True))["the"] == 5
    assert "The" not in lowered.words


def test_empty_source_is_an_error() -> None:
    with pytest.raises(BiodistilError, match="no words"):
        UnigramModel.from_passages(["", "   "])


def test_passages_are_reproducible_and_seed_dependent(model: UnigramModel) -> None:
    first = random_passages(model, 20, (3, 8), seed=1)
    assert first == random_passages(model, 20, (3, 8), seed=1)
    assert first != random_passages(model, 20, (3, 8), seed=2)
    vocabulary = set(model.words)
    for passage in first:
        words = passage.split()
        assert 3 <= len(words) <= 8
        assert set(words) <= vocabulary
    assert {len(p.split()) for p in random_passages(model, 5, 4, seed=0)} == {4}


def test_questions_start_with_a_starter_and_use_source_words(model: UnigramModel) -> None:
    questions = random_questions(model, 30, (2, 5), seed=3)
    assert questions == random_questions(model, 30, (2, 5), seed=3)
    assert questions != random_questions(model, 30, (2, 5), seed=4)
    for question in questions:
        starter, *rest = question.split()
        assert starter in DEFAULT_STARTERS
        assert 2 <= len(rest) <= 5
        assert set(rest) <= set(model.words)
    custom = random_questions(model, 10, 3, seed=3, starters=["why"])
    assert all(q.split()[0] == "why" for q in custom)


def test_passages_follow_unigram_but_questions_sample_uniformly() -> None:
    skewed = UnigramModel.from_passages(["a " * 99 + "b"])  # p(a) = .99, p(b) = .01
    passage_words = " ".join(random_passages(skewed, 20, 100, seed=0)).split()
    assert passage_words.count("a") / len(passage_words) > 0.95
    question_words = [w for q in random_questions(skewed, 200, 10, seed=0) for w in q.split()[1:]]
    share_b = question_words.count("b") / len(question_words)
    assert 0.4 < share_b < 0.6


def test_pairs_are_reproducible(model: UnigramModel) -> None:
    pairs = random_pairs(model, 10, question_length=(2, 4), passage_length=(5, 9), seed=7)
    assert pairs == random_pairs(model, 10, question_length=(2, 4), passage_length=(5, 9), seed=7)
    assert pairs != random_pairs(model, 10, question_length=(2, 4), passage_length=(5, 9), seed=8)
    for question, passage in pairs:
        assert question.split()[0] in DEFAULT_STARTERS
        assert 5 <= len(passage.split()) <= 9
        assert set(passage.split()) <= set(model.words)


@pytest.mark.parametrize("length", [0, (5, 2), (0, 3), "7", (1, 2, 3)])
def test_bad_lengths_are_errors(model: UnigramModel, length: object) -> None:
    with pytest.raises(BiodistilError, match="length"):
        random_passages(model, 3, length, seed=0)  # type: ignore[arg-type]


def test_empty_starters_are_an_error(model: UnigramModel) -> None:
    with pytest.raises(BiodistilError, match="starters"):
        random_questions(model, 3, 2, seed=0, starters=[])
