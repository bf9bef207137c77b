"""One spec per term kind (issue 32): config, the cross-tokenizer table, task KD and the dispatch all read
`biodistil.term_specs`, and the forms of `biodistil.methods.terms` are checked against it when imported."""

import pytest
from pydantic import ValidationError

from biodistil.config import ObjectiveConfig, TermConfig
from biodistil.kd.recipe import KDOptions
from biodistil.methods import terms
from biodistil.methods.cross_tokenizer import pair_support
from biodistil.term_specs import KD_SOFT_TERMS, MASKED_LM_TERMS, TASK_TERMS, TERM_SPECS, TermSpec, terms_with


def test_every_spec_has_a_token_form_and_a_word_form_exactly_when_it_says_so():
    assert set(terms.FORMS) == set(TERM_SPECS)
    for name, spec in TERM_SPECS.items():
        assert callable(terms.FORMS[name].tokens), name
        assert (terms.FORMS[name].words is not None) == spec.has_words, name


def test_the_import_check_fails_for_a_spec_without_a_form_and_a_form_that_disagrees(monkeypatch):
    monkeypatch.setattr(terms, "FORMS", {k: v for k, v in terms.FORMS.items() if k != "uld"})
    with pytest.raises(ImportError, match=r"term kinds without a form: \['uld'\]"):
        terms._check_forms()
    monkeypatch.setattr(terms, "FORMS", {**terms.FORMS, "uld": terms.TermForms(terms.logits.uld_tokens)})
    with pytest.raises(ImportError, match=r"word form disagrees with their spec: \['uld'\]"):
        terms._check_forms()


def test_a_spec_must_say_how_it_crosses_tokenizers_or_why_not():
    with pytest.raises(ValueError, match="exactly one of words"):
        TermSpec("new_term", "hidden", "L = 0")
    with pytest.raises(ValueError, match="exactly one of words"):
        TermSpec("new_term", "hidden", "L = 0", words="pooled", no_words="none")
    with pytest.raises(ValueError, match="a task term neither"):
        TermSpec("new_task_term", "logits", "L = 0", scope="task", words="pooled")
    with pytest.raises(ValueError, match="unknown options"):
        TermSpec("new_term", "hidden", "L = 0", words="pooled", options=frozenset({"no_such_option"}))


def test_config_reads_the_term_names_and_option_rules_from_the_specs():
    assert set(TermConfig.model_fields["loss"].annotation.__args__) == set(TERM_SPECS)
    assert terms_with("layer_map") == ("hidden_cosine", "hidden_mse", "attention_mse", "attention_kl")
    TermConfig(loss="attention_kl", token_reduction="sum", layer_map="uniform")
    wrong = "token_reduction applies to attention_kl; not to loss=attention_mse"
    for term, needle in (({"loss": "attention_mse", "token_reduction": "sum"}, wrong),
                         ({"loss": "hidden_mse", "relations": ["q"]}, "relations applies to minilm_relations"),
                         ({"loss": "minilm_relations", "layer_reduction": "mean"}, "layer_reduction applies to")):
        with pytest.raises(ValidationError, match=needle):
            TermConfig(**term)
    with pytest.raises(ValidationError, match="sigmoid_kd compares classifier outputs"):
        ObjectiveConfig(terms=[{"loss": "sigmoid_kd"}])


def test_task_kd_and_the_cross_tokenizer_table_are_derived_from_the_specs():
    assert KD_SOFT_TERMS == {"hinton": "logit_kl", "logit_mse": "logit_mse", "sigmoid": "sigmoid_kd"}
    assert set(KDOptions.model_fields["soft_loss"].annotation.__args__) == {*KD_SOFT_TERMS, "none"}
    assert set(TASK_TERMS) == {"ce", "sigmoid_kd", "patient_kd"} and not set(TASK_TERMS) & set(MASKED_LM_TERMS)
    rows = {row.term: row for row in pair_support("different", MASKED_LM_TERMS)}
    for name in MASKED_LM_TERMS:
        spec = TERM_SPECS[name]
        assert rows[name].ok == spec.has_words, name
        assert rows[name].reason == (spec.words or spec.no_words), name
