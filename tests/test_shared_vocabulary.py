"""The strings two vocabularies share across WordPiece and byte-level BPE conventions and case, checked by hand on
tiny tokenizers built here (offline)."""

from tokenizers import pre_tokenizers
from transformers import BertTokenizerFast, RobertaTokenizerFast

from biodistil.data.shared_vocabulary import NO_KEY, shared_vocabulary, token_keys

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece(tokens: list[str], lowercase: bool) -> BertTokenizerFast:
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(SPECIAL + tokens)}, do_lower_case=lowercase)


def byte_level(merges: list[tuple[str, str]]) -> RobertaTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>", *alphabet,
                                         *(a + b for a, b in merges)])}
    return RobertaTokenizerFast(vocab=vocab, merges=merges)


def test_cased_and_uncased_wordpiece_share_strings_without_prefix_case_or_accents() -> None:
    cased = wordpiece(["Müller", "The", "the", "##53", "p53", "cell", "##s", "[unused1]"], lowercase=False)
    uncased = wordpiece(["muller", "the", "53", "p53", "cells", "s"], lowercase=True)
    shared = shared_vocabulary(cased, uncased)
    assert shared.keys == ("53", "muller", "p53", "s", "the")
    key = {k: i for i, k in enumerate(shared.keys)}
    # cased ids 5.. : Müller, The, the, ##53, p53, cell, ##s, [unused1]
    assert shared.student_index.tolist() == [NO_KEY] * 5 + [key["muller"], key["the"], key["the"], key["53"],
                                                            key["p53"], NO_KEY, key["s"], NO_KEY]
    assert shared.teacher_index.tolist() == [NO_KEY] * 5 + [key["muller"], key["the"], key["53"], key["p53"], NO_KEY,
                                                            key["s"]]


def test_byte_level_tokens_are_decoded_and_lose_their_space_mark() -> None:
    bpe = byte_level([("Ġ", "p"), ("Ã", "©"), ("c", "a")])
    keys = token_keys(bpe)
    vocab = bpe.get_vocab()
    assert keys[vocab["Ġp"]] == keys[vocab["p"]] == "p"  # word start or not: one string
    assert keys[vocab["Ã©"]] == "é"  # two bytes, one character
    assert vocab["Ã"] not in keys and vocab["Ġ"] not in keys  # half a character; a space
    assert vocab["<s>"] not in keys and vocab["<mask>"] not in keys
    cased = wordpiece(["p", "##p", "é", "ca"], lowercase=False)
    shared = shared_vocabulary(cased, bpe)
    assert {"p", "é", "ca"} <= set(shared.keys)
    index = {k: i for i, k in enumerate(shared.keys)}
    # both WordPiece "p" and "##p" and both byte-level "p" and "Ġp" name the key "p"
    assert shared.student_index[[5, 6]].tolist() == [index["p"], index["p"]]
    assert shared.teacher_index[[vocab["p"], vocab["Ġp"]]].tolist() == [index["p"], index["p"]]


def test_an_uncased_side_folds_the_byte_level_sides_case_and_accents() -> None:
    bpe = byte_level([("Ã", "©"), ("c", "a")])
    uncased = wordpiece(["e", "ca"], lowercase=True)
    shared = shared_vocabulary(uncased, bpe)
    vocab = bpe.get_vocab()
    e = shared.keys.index("e")
    assert shared.teacher_index[[vocab["Ã©"], vocab["E"], vocab["e"]]].tolist() == [e, e, e]


def test_logit_rows_longer_than_the_tokenizer_get_no_key() -> None:
    shared = shared_vocabulary(wordpiece(["the"], lowercase=True), wordpiece(["the"], lowercase=True), student_size=8)
    assert shared.student_index.tolist() == [NO_KEY] * 5 + [0, NO_KEY, NO_KEY]
    assert len(shared.teacher_index) == 6
