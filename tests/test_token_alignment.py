"""Token alignment across tokenizers, checked by hand on tiny tokenizers built here (offline): cased and uncased
WordPiece, byte-level BPE with and without trimmed offsets (RoBERTa) and with ModernBERT's template post-processor;
accents, punctuation, tokens straddling two words, truncation at different places; then batches, pooling matrices
and whole-word masking of the same words on both sides."""

import unicodedata

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import BertTokenizerFast, PreTrainedTokenizerFast, RobertaTokenizerFast

from biodistil.config import MaskingConfig
from biodistil.data.masking import IGNORE_INDEX, MaskingVocabulary
from biodistil.data.token_alignment import (
    NO_UNIT,
    align_texts,
    first_tokens,
    mask_same_words,
    membership,
    pooling_matrix,
    tokens_of_units,
    word_spans,
)
from biodistil.data.vocab import train_wordpiece

BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
MERGES = [("Ġ", "I"), ("ĠI", "L"), ("Ġ", "p"), ("5", "3"), ("d", "e"), ("Ã", "©"), ("1", "2"), (")", ".")]


def wordpiece(tokens: list[str], lowercase: bool) -> BertTokenizerFast:
    """A BERT tokenizer over exactly these tokens (uncased: lowercase and strip accents, as BERT does)."""
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(BERT_SPECIAL + tokens)}, do_lower_case=lowercase)


def _byte_level_vocab(special: list[str]) -> dict[str, int]:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    return {t: i for i, t in enumerate(special + alphabet + [a + b for a, b in MERGES])}


def roberta(trim_offsets: bool = True) -> RobertaTokenizerFast:
    """A RoBERTa tokenizer (byte-level BPE, <s> A </s>) with the few merges of MERGES."""
    return RobertaTokenizerFast(vocab=_byte_level_vocab(ROBERTA_SPECIAL), merges=MERGES, trim_offsets=trim_offsets)


def modernbert_style() -> PreTrainedTokenizerFast:
    """ModernBERT's convention: byte-level BPE and a template post-processor [CLS] A [SEP], which does not trim
    offsets: a token's span includes the space its "Ġ" stands for."""
    vocab = _byte_level_vocab(BERT_SPECIAL)
    backend = Tokenizer(models.BPE(vocab, MERGES))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def tokens(tokenizer, text: str, **kwargs) -> list[tuple[str, str]]:
    """(token, the text its offsets point to): what the tests align, written out."""
    encoded = tokenizer(text, return_offsets_mapping=True, **kwargs)
    pieces = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    return [(piece, text[a:b]) for piece, (a, b) in zip(pieces, encoded["offset_mapping"], strict=True)]


def units(batch, side: str, row: int = 0) -> list[int]:
    ids = getattr(batch, f"{side}_units")[row]
    mask = getattr(batch, f"{side}_inputs")["attention_mask"][row].bool()
    return ids[mask].tolist()


# ------------------------------------------------------------------------------------------ words
def test_words_follow_bert_pre_tokenizer_or_whitespace() -> None:
    text = "IL-2 p53-deficient (n=12)."
    assert [text[a:b] for a, b in word_spans(text)] == \
        ["IL", "-", "2", "p53", "-", "deficient", "(", "n", "=", "12", ")", "."]
    assert word_spans(text)[:4] == [(0, 2), (2, 3), (3, 4), (5, 8)]
    assert word_spans(text, "whitespace") == [(0, 4), (5, 18), (19, 26)]
    with pytest.raises(ValueError, match="words must be"):
        word_spans(text, "sentencepiece")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ WordPiece pairs
def test_cased_and_uncased_wordpiece_align_through_accents_and_case() -> None:
    text = "Müller café IL-2"
    cased = wordpiece(["Müller", "caf", "##é", "IL", "-", "2"], lowercase=False)
    uncased = wordpiece(["muller", "cafe", "il", "-", "2"], lowercase=True)
    assert tokens(cased, text) == [("[CLS]", ""), ("Müller", "Müller"), ("caf", "caf"), ("##é", "é"), ("IL", "IL"),
                                   ("-", "-"), ("2", "2"), ("[SEP]", "")]
    # the uncased side lowercases and strips accents, yet its offsets index the original text
    assert tokens(uncased, text) == [("[CLS]", ""), ("muller", "Müller"), ("cafe", "café"), ("il", "IL"), ("-", "-"),
                                     ("2", "2"), ("[SEP]", "")]
    batch = align_texts([text], cased, uncased)
    # units: 0 [CLS], 1 Müller, 2 café, 3 IL, 4 -, 5 2, 6 [SEP]
    assert units(batch, "student") == [0, 1, 2, 2, 3, 4, 5, 6]
    assert units(batch, "teacher") == [0, 1, 2, 3, 4, 5, 6]
    assert batch.alignments[0].spans == (None, (0, 6), (7, 11), (12, 14), (14, 15), (15, 16), None)
    assert batch.word_mask.tolist() == [[False, True, True, True, True, True, False]]


def test_without_sequence_units_special_tokens_belong_to_nothing() -> None:
    text = "Müller café"
    cased = wordpiece(["Müller", "caf", "##é"], lowercase=False)
    uncased = wordpiece(["muller", "cafe"], lowercase=True)
    batch = align_texts([text], cased, uncased, sequence_units=False)
    assert units(batch, "student") == [NO_UNIT, 0, 1, 1, NO_UNIT]
    assert units(batch, "teacher") == [NO_UNIT, 0, 1, NO_UNIT]
    assert batch.word_mask.tolist() == [[True, True]]


def test_word_missing_from_one_vocabulary_is_still_aligned_through_unk() -> None:
    # the uncased side has no "cafe": [UNK] stands for the whole word, and its offsets still name it
    text = "café IL"
    cased = wordpiece(["caf", "##é", "IL"], lowercase=False)
    uncased = wordpiece(["il"], lowercase=True)
    assert tokens(uncased, text)[1] == ("[UNK]", "café")
    batch = align_texts([text], cased, uncased)
    assert units(batch, "student") == [0, 1, 1, 2, 3]
    assert units(batch, "teacher") == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------ byte-level BPE
@pytest.mark.parametrize(("teacher", "p_text", "space_text"), [
    (roberta(trim_offsets=True), "p", ""), (roberta(trim_offsets=False), " p", " "), (modernbert_style(), " p", " ")],
    ids=["roberta-trimmed", "roberta-untrimmed", "modernbert-template"])
def test_byte_level_bpe_leading_space_gives_the_same_words(teacher, p_text: str, space_text: str) -> None:
    text = "IL-2 p53-de café"
    student = wordpiece(["IL", "-", "2", "p53", "de", "café"], lowercase=False)
    # RoBERTa trims the space off "Ġp" by default (a lone "Ġ" becomes empty); untrimmed offsets and ModernBERT's
    # template keep it
    assert tokens(teacher, text)[1:-1] == [
        ("I", "I"), ("L", "L"), ("-", "-"), ("2", "2"), ("Ġp", p_text), ("53", "53"), ("-", "-"), ("de", "de"),
        ("Ġ", space_text), ("c", "c"), ("a", "a"), ("f", "f"), ("Ã©", "é")]
    batch = align_texts([text], student, teacher)
    # units: 0 start, 1 IL, 2 -, 3 2, 4 p53, 5 -, 6 de, 7 café, 8 end; the lone "Ġ" (whitespace only) has no word
    assert units(batch, "teacher") == [0, 1, 1, 2, 3, 4, 4, 5, 6, NO_UNIT, 7, 7, 7, 7, 8]
    assert units(batch, "student") == [0, 1, 2, 3, 4, 5, 6, 7, 8]


def test_token_straddling_two_words_makes_neither_shared() -> None:
    text = "(n=12)."
    student = wordpiece(["(", "n", "=", "12", ")", "."], lowercase=True)
    teacher = roberta()
    assert tokens(teacher, text)[1:-1] == [("(", "("), ("n", "n"), ("=", "="), ("12", "12"), (").", ").")]
    batch = align_texts([text], student, teacher)
    # ")." covers ")" and ".": neither is a word of its own on the teacher side, so neither is shared
    assert batch.alignments[0].spans == (None, (0, 1), (1, 2), (2, 3), (3, 5), None)
    assert units(batch, "teacher") == [0, 1, 2, 3, 4, NO_UNIT, 5]
    assert units(batch, "student") == [0, 1, 2, 3, 4, NO_UNIT, NO_UNIT, 5]
    # whitespace words: the whole "(n=12)." is one word, every token of both sides in it
    coarse = align_texts([text], student, teacher, words="whitespace")
    assert units(coarse, "teacher") == [0, 1, 1, 1, 1, 1, 2]
    assert units(coarse, "student") == [0, 1, 1, 1, 1, 1, 1, 2]


def test_bytes_of_one_character_split_across_tokens_stay_in_its_word() -> None:
    # "ü" is two bytes; without a merge for them, BPE writes "Ã", "¼" and both point into "Müller"
    text = "Müller"
    teacher = roberta()
    assert tokens(teacher, text)[1:4] == [("M", "M"), ("Ã", "ü"), ("¼", "ü")]
    student = wordpiece(["Müller"], lowercase=False)
    batch = align_texts([text], student, teacher)
    assert units(batch, "teacher") == [0, 1, 1, 1, 1, 1, 1, 1, 2]
    assert units(batch, "student") == [0, 1, 2]


# ------------------------------------------------------------------------------------------ truncation
def test_truncation_at_different_places_keeps_only_words_complete_on_both_sides() -> None:
    text = "p53-deficient cells"
    student = wordpiece(["p53", "-", "de", "##ficient", "cells"], lowercase=False)
    teacher = wordpiece(["p53", "-", "deficient", "cells"], lowercase=True)
    # student: [CLS] p53 - de [SEP] ("deficient" cut after "de"); teacher: [CLS] p53 - deficient [SEP]
    batch = align_texts([text], student, teacher, student_max_length=5, teacher_max_length=5)
    assert [p for p, _ in tokens(student, text, truncation=True, max_length=5)] == ["[CLS]", "p53", "-", "de", "[SEP]"]
    # shared: [CLS], p53, -; "deficient" is whole on the teacher side only; the [SEP]s close different text: unpaired
    assert units(batch, "student") == [0, 1, 2, NO_UNIT, NO_UNIT]
    assert units(batch, "teacher") == [0, 1, 2, NO_UNIT, NO_UNIT]
    assert batch.alignments[0].spans == (None, (0, 3), (3, 4))
    # the other way round: the teacher cut shorter
    swapped = align_texts([text], student, teacher, student_max_length=6, teacher_max_length=4)
    assert units(swapped, "student") == [0, 1, 2, NO_UNIT, NO_UNIT, NO_UNIT]
    assert units(swapped, "teacher") == [0, 1, 2, NO_UNIT]
    # both cut after the same word: the [SEP]s close the same text and pair again
    same = align_texts([text], student, teacher, student_max_length=6, teacher_max_length=5)
    assert units(same, "student") == [0, 1, 2, 3, 3, 4]
    assert units(same, "teacher") == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------------------ four defects found by
# an independent re-implementation: each test masks every shared word and checks that the masked tokens of every
# word spell the same text on both sides (up to case and accents, which an uncased side drops)
def _canonical(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text)
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn" and not c.isspace()).lower()


def masked_words(batch, student, teacher) -> list[list[str]]:
    """Mask every shared word on both sides; per text, each masked word as both sides' masked tokens spell it (they
    must agree) — the decoded bytes, so that half a character reads as U+FFFD."""
    cfg = MaskingConfig.model_construct(probability=1.0, mask_ratio=1.0, random_ratio=0.0)  # every word: no draw
    chosen, *sides = mask_same_words(batch, MaskingVocabulary.from_tokenizer(student),
                                     MaskingVocabulary.from_tokenizer(teacher), cfg, torch.Generator().manual_seed(0))
    spelled = []
    for row in range(chosen.size(0)):
        words = []
        for unit in chosen[row].nonzero().flatten().tolist():
            pair = []
            for side, tokenizer, unit_ids in ((sides[0], student, batch.student_units),
                                              (sides[1], teacher, batch.teacher_units)):
                masked = (side.labels[row] != IGNORE_INDEX) & (unit_ids[row] == unit)
                pair.append(_canonical(tokenizer.decode(side.labels[row][masked].tolist())))
            assert pair[0] == pair[1], f"text {row}, unit {unit}: the student masks {pair[0]!r}, the teacher " \
                f"{pair[1]!r}"
            words.append(pair[0])
        spelled.append(words)
    return spelled


def test_a_symbol_run_over_two_words_shares_neither() -> None:
    """Defect A: a byte-level BPE keeps "(±" in one token anchored in "(" — "±SD" still has its own token ("SD")."""
    merges = [*MERGES, ("Ġ", "("), ("Ġ(", "Â"), ("Ġ(Â", "±"), ("S", "D")]
    vocab = _byte_level_vocab(ROBERTA_SPECIAL)
    vocab.update({a + b: len(vocab) + i for i, (a, b) in enumerate(merges[len(MERGES):])})
    teacher = RobertaTokenizerFast(vocab=vocab, merges=merges)
    text = "mean (±SD) was"
    assert ("Ġ(Â±", " (±") in tokens(teacher, text, add_special_tokens=False) or \
        ("Ġ(Â±", "(±") in tokens(teacher, text, add_special_tokens=False)
    student = wordpiece(["mean", "(", "±", "##S", "##D", ")", "was"], lowercase=False)
    batch = align_texts([text], student, teacher)
    assert masked_words(batch, student, teacher) == [["mean", ")", "was"]]
    assert batch.alignments[0].spans == (None, (0, 4), (9, 10), (11, 14), None)


def test_a_cut_between_the_bytes_of_one_character_leaves_its_word_out() -> None:
    """Defect B: truncation keeps "Î" of "α" and drops its "±"."""
    text = "the α chain"
    teacher, student = roberta(), wordpiece(["the", "α", "chain"], lowercase=False)
    assert [p for p, _ in tokens(teacher, text, truncation=True, max_length=7)][-3:] == ["Ġ", "Î", "</s>"]
    batch = align_texts([text], student, teacher, teacher_max_length=7)
    assert masked_words(batch, student, teacher) == [["the"]]
    whole = align_texts([text], student, teacher, teacher_max_length=8)  # both bytes kept: "α" is whole
    assert masked_words(whole, student, teacher) == [["the", "α"]]


def test_a_decomposed_accent_ending_the_text_keeps_the_word_and_the_end_tokens() -> None:
    """Defect C: an uncased side drops the U+0301 of "cafe\u0301" — its tokens end one character early."""
    text = "the cafe\u0301"
    student, teacher = wordpiece(["the", "cafe"], lowercase=True), roberta()
    assert tokens(student, text)[-2:] == [("cafe", "cafe"), ("[SEP]", "")]
    batch = align_texts([text], student, teacher)
    assert masked_words(batch, student, teacher) == [["the", "cafe"]]
    assert units(batch, "student") == [0, 1, 2, 3]
    assert units(batch, "teacher")[0] == 0 and units(batch, "teacher")[-1] == 3, "the end tokens pair"


def test_leading_whitespace_with_untrimmed_offsets_pairs_the_start_tokens() -> None:
    """Defect D: ModernBERT's template keeps "Ġp"'s space in its span, so that side's text starts one character
    earlier than the WordPiece side's."""
    text = " p53 cells"
    student, teacher = wordpiece(["p53", "cells"], lowercase=False), modernbert_style()
    assert tokens(teacher, text)[1] == ("Ġp", " p")
    batch = align_texts([text], student, teacher)
    assert masked_words(batch, student, teacher) == [["p53", "cells"]]
    assert units(batch, "student") == [0, 1, 2, 3] and units(batch, "teacher")[0] == 0
    assert units(batch, "teacher")[-1] == 3


# ------------------------------------------------------------------------------------------ batches, pooling
def test_batch_pads_units_and_keeps_model_inputs() -> None:
    student = wordpiece(["IL", "-", "2", "cells"], lowercase=False)
    teacher = roberta()
    batch = align_texts(["IL-2 cells", "IL"], student, teacher)
    assert set(batch.student_inputs) >= {"input_ids", "attention_mask"}
    assert "offset_mapping" not in batch.student_inputs and "special_tokens_mask" not in batch.teacher_inputs
    assert batch.unit_mask.tolist() == [[True] * 6, [True] * 3 + [False] * 3]
    assert batch.word_mask.tolist() == [[False, True, True, True, True, False], [False, True] + [False] * 4]
    # padding belongs to no unit
    assert batch.student_units[1].tolist() == [0, 1, 2, NO_UNIT, NO_UNIT, NO_UNIT]
    assert batch.student_units.shape == batch.student_inputs["input_ids"].shape
    assert batch.teacher_units.shape == batch.teacher_inputs["input_ids"].shape


def test_empty_text_has_only_the_sequence_units() -> None:
    batch = align_texts([""], wordpiece([], lowercase=False), roberta())
    assert batch.unit_mask.tolist() == [[True, True]] and batch.word_mask.tolist() == [[False, False]]


def test_pooling_matrices_by_hand() -> None:
    unit_ids = torch.tensor([[0, 1, 1, NO_UNIT, 2]])
    assert membership(unit_ids, 4)[0, 1].tolist() == [False, True, True, False, False]
    mean = pooling_matrix(unit_ids, 4)
    assert mean[0].tolist() == [[1, 0, 0, 0, 0], [0, 0.5, 0.5, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    first = pooling_matrix(unit_ids, 4, "first")
    assert first[0].tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match="pooling"):
        pooling_matrix(unit_ids, 4, "max")  # type: ignore[arg-type]


def test_first_tokens_pair_the_same_words_on_both_sides() -> None:
    student_units = torch.tensor([[0, 1, 1, 2, 3], [0, 1, 2, NO_UNIT, NO_UNIT]])
    teacher_units = torch.tensor([[0, 1, 2, 2, 2, 3], [0, 1, 1, 1, 2, NO_UNIT]])
    chosen = torch.tensor([[False, True, True, False], [False, True, False, False]])
    assert tokens_of_units(teacher_units, chosen).tolist() == [
        [False, True, True, True, True, False], [False, True, True, True, False, False]]
    assert not tokens_of_units(teacher_units, chosen[:, :0]).any()
    # as a mask: its positions in row-major order are the same (row, unit) order on both sides
    student_first, teacher_first = first_tokens(student_units, chosen), first_tokens(teacher_units, chosen)
    assert student_first.nonzero().tolist() == [[0, 1], [0, 3], [1, 1]]
    assert teacher_first.nonzero().tolist() == [[0, 1], [0, 2], [1, 1]]


# ------------------------------------------------------------------------------------------ whole-word masking
def _masking_pair():
    student = wordpiece(["IL", "-", "2", "p53", "de", "##ficient", "cells", "in", "mice"], lowercase=False)
    teacher = roberta()
    texts = ["IL-2 p53-deficient cells in mice", "p53 in IL-2 cells"]
    return align_texts(texts, student, teacher), MaskingVocabulary.from_tokenizer(student), \
        MaskingVocabulary.from_tokenizer(teacher)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mask_same_words_masks_every_token_of_the_chosen_words_on_both_sides(seed: int) -> None:
    batch, student_vocab, teacher_vocab = _masking_pair()
    cfg = MaskingConfig(probability=0.5, mask_ratio=1.0, random_ratio=0.0)
    chosen, student, teacher = mask_same_words(batch, student_vocab, teacher_vocab, cfg,
                                               torch.Generator().manual_seed(seed))
    assert not (chosen & ~batch.word_mask).any()  # sequence units and padding units are never chosen
    sides = ((student, batch.student_inputs, batch.student_units, student_vocab.mask_id),
             (teacher, batch.teacher_inputs, batch.teacher_units, teacher_vocab.mask_id))
    for side, inputs, unit_ids, mask_id in sides:
        expected = tokens_of_units(unit_ids, chosen)
        assert torch.equal(side.labels != IGNORE_INDEX, expected)
        assert torch.equal(side.labels[expected], inputs["input_ids"][expected])
        assert (side.input_ids[expected] == mask_id).all()  # mask_ratio 1: every chosen token is [MASK]
        assert torch.equal(side.input_ids[~expected], inputs["input_ids"][~expected])


def test_mask_same_words_corrupts_a_word_the_same_way_on_both_sides() -> None:
    batch, student_vocab, teacher_vocab = _masking_pair()
    cfg = MaskingConfig(probability=0.9, mask_ratio=0.0, random_ratio=1.0)
    generator = torch.Generator().manual_seed(3)
    chosen, student, teacher = mask_same_words(batch, student_vocab, teacher_vocab, cfg, generator)
    assert chosen.any()
    for side, vocab in ((student, student_vocab), (teacher, teacher_vocab)):
        replaced = side.labels != IGNORE_INDEX
        assert not (side.input_ids[replaced] == vocab.mask_id).any()  # random_ratio 1: never [MASK] ...
        assert not vocab.special[side.input_ids[replaced]].any()  # ... and never a special token


# ------------------------------------------------------------------------------------------ trained tokenizers
CORPUS = ["IL-2 induced p53-deficient cells in Müller glia (n=12).", "The café patients' TNF-α levels rose.",
          "BRCA1 mutation carriers; p53 and IL-2 pathways."] * 20


def _trained_bpe() -> RobertaTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=320, min_frequency=2, special_tokens=ROBERTA_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS, trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", cls_token="<s>",
                                   sep_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")


@pytest.mark.parametrize("pair", ["cased-uncased", "wordpiece-bpe"])
def test_trained_tokenizers_put_every_token_of_a_word_inside_it(pair: str) -> None:
    student = train_wordpiece(CORPUS, 120, lowercase=False, min_frequency=2)
    teacher = train_wordpiece(CORPUS, 120, lowercase=True, min_frequency=2) if pair == "cased-uncased" \
        else _trained_bpe()
    texts = CORPUS[:3]
    batch = align_texts(texts, student, teacher)
    for row, (text, alignment) in enumerate(zip(texts, batch.alignments, strict=True)):
        # untruncated WordPiece pairs share every word; byte-level BPE keeps punctuation runs (").") in one token
        shared, words = sum(alignment.is_word), len(word_spans(text))
        assert shared == words if pair == "cased-uncased" else words - 3 <= shared <= words
        for side in ("student", "teacher"):
            tokenizer = student if side == "student" else teacher
            offsets = tokenizer(texts, padding=True, return_offsets_mapping=True)["offset_mapping"][row]
            for unit, span in enumerate(alignment.spans):
                if span is None:
                    continue
                starts = [a + len(text[a:b]) - len(text[a:b].lstrip())
                          for (a, b), u in zip(offsets, getattr(alignment, f"{side}_units"), strict=True) if u == unit]
                # ... each token's anchor lies in its word, and the first starts the word
                assert starts and min(starts) == span[0] and all(span[0] <= s < span[1] for s in starts), (side, row)
