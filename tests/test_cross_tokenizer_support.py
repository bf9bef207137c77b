"""The pre-flight table across tokenizers: which objective terms hold for a tokenizer pair, at which level, and what
to change for those that do not; checked on tiny tokenizers built here (offline)."""

import pytest
from tokenizers import pre_tokenizers
from transformers import BertTokenizerFast, RobertaTokenizerFast

from biodistil.config import TermConfig
from biodistil.errors import BiodistilError
from biodistil.methods.cross_tokenizer import pair_support, refuse_unsupported, term_support, tokenizer_pair
from biodistil.term_specs import TERM_SPECS as TERM_KINDS

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cell", "##s", "p53", "il", "-", "2"]
MASKED_LM_TERMS = ["mlm", "logit_kl", "uld", "soft_ce", "logit_mse", "hidden_cosine", "hidden_mse", "attention_mse",
                   "attention_kl", "minilm_relations"]


def wordpiece(tokens: list[str], lowercase: bool = True) -> BertTokenizerFast:
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(SPECIAL + tokens)}, do_lower_case=lowercase)


def byte_level() -> RobertaTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>", *alphabet, "Ġc"])}
    return RobertaTokenizerFast(vocab=vocab, merges=[("Ġ", "c")])


def table(student, teacher, terms=MASKED_LM_TERMS, head="masked_lm") -> dict[str, tuple[bool, str]]:
    return {row.term: (row.ok, row.level) for row in term_support(student, teacher, terms, head)}


def test_pairs_are_told_apart() -> None:
    teacher = wordpiece(WORDS)
    assert tokenizer_pair(wordpiece(WORDS), teacher) == "same"
    assert tokenizer_pair(wordpiece([*WORDS, "##53", "brca1"]), teacher) == "extended"
    assert tokenizer_pair(wordpiece(["cell", "the"]), teacher) == "different"  # same tokens, other ids
    assert tokenizer_pair(wordpiece(WORDS, lowercase=False), teacher) == "different"  # same ids, cased input
    assert tokenizer_pair(byte_level(), teacher) == "different"


def test_one_tokenizer_supports_every_term_token_by_token() -> None:
    rows = table(wordpiece(WORDS), wordpiece(WORDS), list(TERM_KINDS), head="sequence")
    assert rows == {kind: (True, "tokens") for kind in TERM_KINDS}


def test_an_extended_vocabulary_keeps_every_masked_lm_term_as_ve_kd() -> None:
    rows = term_support(wordpiece([*WORDS, "brca1"]), wordpiece(WORDS), MASKED_LM_TERMS)
    assert all(row.ok and row.level == "tokens" and "VE-KD" in row.reason for row in rows)
    assert "positions: known" in next(row.reason for row in rows if row.term == "logit_kl")


@pytest.mark.parametrize("student", [wordpiece(["cell", "##s", "p53"], lowercase=False), byte_level()],
                         ids=["other-wordpiece", "byte-level-bpe"])
def test_different_vocabularies_keep_word_level_terms_and_refuse_token_level_logits(student) -> None:
    rows = table(student, wordpiece(WORDS))
    assert rows == {
        "mlm": (True, "words"), "logit_kl": (True, "words"), "uld": (True, "words"), "hidden_cosine": (True, "words"),
        "hidden_mse": (True, "words"), "attention_mse": (True, "words"), "attention_kl": (True, "words"),
        "minilm_relations": (True, "words"), "soft_ce": (False, ""), "logit_mse": (False, ""),
    }
    terms = ["logit_kl", "uld", "logit_mse"]
    reasons = {row.term: row.reason for row in term_support(student, wordpiece(WORDS), terms)}
    assert "shared_vocab_kl_loss" in reasons["logit_kl"] and "uld_loss" in reasons["uld"]
    assert "use logit_kl" in reasons["logit_mse"]


def test_recipe_term_options_are_checked_across_tokenizers() -> None:
    student, teacher = byte_level(), wordpiece(WORDS)
    terms = [TermConfig(loss="attention_mse", attention_map="scores"), TermConfig(loss="attention_mse"),
             TermConfig(loss="logit_kl"), TermConfig(loss="logit_kl", positions="masked"), TermConfig(loss="uld"),
             TermConfig(loss="uld", positions="masked")]
    rows = term_support(student, teacher, terms)
    assert [row.ok for row in rows] == [False, True, False, True, False, True]
    assert "attention_map: probabilities" in rows[0].reason and "positions: masked" in rows[2].reason


def test_classifier_terms_depend_on_the_head() -> None:
    student, teacher = byte_level(), wordpiece(WORDS)
    terms = ["ce", "logit_kl", "logit_mse", "sigmoid_kd", "patient_kd", "hidden_mse"]
    assert table(student, teacher, terms, "masked_lm")["patient_kd"] == (False, "")
    assert table(student, teacher, terms, "sequence") == {
        "ce": (True, "tokens"), "logit_kl": (True, "sequence"), "logit_mse": (True, "sequence"),
        "sigmoid_kd": (True, "sequence"), "patient_kd": (True, "sequence"), "hidden_mse": (True, "words")}
    token = table(student, teacher, terms, "token")
    assert token["logit_kl"] == (True, "words") and token["sigmoid_kd"] == (True, "words")


def test_unknown_terms_and_refusals_are_named() -> None:
    with pytest.raises(BiodistilError, match="unknown objective term 'kl'"):
        term_support(wordpiece(WORDS), wordpiece(WORDS), ["kl"])
    rows = term_support(byte_level(), wordpiece(WORDS), ["hidden_mse", "soft_ce", "logit_mse"])
    with pytest.raises(BiodistilError, match=r"soft_ce: .*use logit_kl.*; logit_mse: ") as error:
        refuse_unsupported(rows)
    assert "hidden_mse" not in str(error.value)
    refuse_unsupported(rows[:1])  # nothing refused: no error


def test_a_pair_known_without_its_tokenizers_gets_the_same_verdicts() -> None:
    terms = ["mlm", "logit_kl", "soft_ce", "hidden_mse"]
    assert pair_support("different", terms) == term_support(byte_level(), wordpiece(WORDS), terms)
    assert all(row.ok for row in pair_support("same", ["soft_ce", "logit_mse"]))
