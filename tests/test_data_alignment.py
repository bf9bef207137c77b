"""Word ↔ sub-word label alignment, with pure word_ids lists and a real (offline) fast WordPiece tokenizer."""

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from biodistil.data.alignment import (
    IGNORE_INDEX,
    align_labels,
    chunk_words,
    word_predictions,
)

O, B, I = 0, 1, 2  # noqa: E741 - tag ids as in the tasks' [O, B, I]
X = IGNORE_INDEX


@pytest.fixture(scope="module")
def fast_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny BERT-style WordPiece tokenizer built in memory; no download."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "adeno", "##matous", "poly", "##posis",
             "coli", "brca", "##1", "gene", "is", "mutated", "."]
    backend = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


WORDS = ["the", "adenomatous", "polyposis", "coli", "BRCA1", "gene", "is", "mutated", "."]
TAGS = [O, B, I, I, B, O, O, O, O]


def test_tokenizer_really_splits_words(fast_tokenizer):
    encoding = fast_tokenizer(WORDS, is_split_into_words=True)
    pieces = fast_tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    assert pieces == ["[CLS]", "the", "adeno", "##matous", "poly", "##posis", "coli", "brca", "##1", "gene",
                      "is", "mutated", ".", "[SEP]"]
    assert encoding.word_ids() == [None, 0, 1, 1, 2, 2, 3, 4, 4, 5, 6, 7, 8, None]


def test_first_policy_with_real_tokenizer(fast_tokenizer):
    word_ids = fast_tokenizer(WORDS, is_split_into_words=True).word_ids()
    labels = align_labels(word_ids, TAGS, "first")
    assert labels == [X, O, B, X, I, X, I, B, X, O, O, O, O, X]


def test_all_policy_maps_b_continuations_to_i(fast_tokenizer):
    word_ids = fast_tokenizer(WORDS, is_split_into_words=True).word_ids()
    assert align_labels(word_ids, TAGS, "all", b_to_i={B: I}) == [X, O, B, I, I, I, I, B, I, O, O, O, O, X]
    # without b_to_i every piece keeps its word's label
    assert align_labels(word_ids, TAGS, "all") == [X, O, B, B, I, I, I, B, B, O, O, O, O, X]


@pytest.mark.parametrize("policy", ["first", "all"])
def test_round_trip_gives_back_word_labels(fast_tokenizer, policy):
    encoding = fast_tokenizer(WORDS, is_split_into_words=True)
    word_ids = encoding.word_ids()
    token_labels = align_labels(word_ids, TAGS, policy, b_to_i={B: I})
    # a "model" predicting exactly the aligned labels (−100 positions predicted as anything, here 0)
    predictions = [max(label, 0) for label in token_labels]
    result = word_predictions(word_ids, predictions, len(WORDS))
    assert list(result) == TAGS
    assert result.num_filled == 0


def test_truncation_fills_and_reports(fast_tokenizer):
    encoding = fast_tokenizer(WORDS, is_split_into_words=True, truncation=True, max_length=6)
    word_ids = encoding.word_ids()
    assert word_ids == [None, 0, 1, 1, 2, None]  # "polyposis" keeps only its first piece
    predictions = [0, O, B, B, I, 0]
    result = word_predictions(word_ids, predictions, len(WORDS), fill_label_id=O)
    assert list(result) == [O, B, I, O, O, O, O, O, O]
    assert result.num_filled == 6  # coli, BRCA1, gene, is, mutated, "."


def test_pure_word_ids():
    word_ids = [None, 0, 0, 0, 1, 2, 2, None]
    assert align_labels(word_ids, [B, O, B], "first") == [X, B, X, X, O, B, X, X]
    assert align_labels(word_ids, [B, O, B], "all", {B: I}) == [X, B, I, I, O, B, I, X]
    result = word_predictions(word_ids, [9, 1, 2, 2, 0, 1, 2, 9], 3)
    assert list(result) == [1, 0, 1] and result.num_filled == 0


def test_word_predictions_accepts_tensor_rows():
    torch = pytest.importorskip("torch")
    result = word_predictions([None, 0, 1, 1, None], torch.tensor([5, 2, 1, 0, 5]), 2)
    assert list(result) == [2, 1] and all(isinstance(v, int) for v in result)


def test_alignment_rejects_inconsistent_inputs():
    with pytest.raises(ValueError, match="policy"):
        align_labels([0], [O], "last")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="word id 3"):
        align_labels([None, 3], [O, O], "first")
    with pytest.raises(ValueError, match="2 token predictions"):
        word_predictions([None, 0, None], [0, 0], 1)


def test_chunk_words_keeps_windows_under_budget():
    assert chunk_words([1, 2, 3, 1, 1], 4) == [(0, 2), (2, 4), (4, 5)]  # 1+2 | 3+1 | 1
    assert chunk_words([5, 1], 3) == [(0, 1), (1, 2)]  # an over-long word gets its own window
    assert chunk_words([], 4) == []
    assert chunk_words([1, 1, 1], 100) == [(0, 3)]
