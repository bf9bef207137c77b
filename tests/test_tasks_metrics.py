"""Task metrics on hand-worked examples (expected numbers worked out in the comments)."""

import math

import pytest

from biodistil.errors import BiodistilError
from biodistil.tasks.metrics import (
    METRICS,
    accuracy_auroc,
    accuracy_macro_f1,
    aggregate_folds,
    binary_prf,
    entity_f1,
    get_metric,
    headline_key,
    hoc_example_f1,
    micro_f1_excluding,
    summarize_seeds,
    token_macro_f1,
)

# ------------------------------------------------------------------------------------------- entity F1


def test_entity_f1_strict_ignores_b_less_i_span():
    gold = [["B", "I", "O", "B", "O"]]  # entities: [0,2) and [3,4)
    pred = [["O", "I", "O", "B", "O"]]  # "I" without B is no entity in strict mode; only [3,4)
    # tp 1, pred 1, gold 2 → P 1, R 0.5, F1 2/3
    result = entity_f1(gold, pred)
    assert result["precision"] == 1.0
    assert result["recall"] == 0.5
    assert result["f1"] == pytest.approx(2 / 3)
    assert (result["n_true"], result["n_pred"], result["n_correct"]) == (2, 1, 1)


def test_entity_f1_gold_b_less_i_is_not_an_entity_either():
    # gold I I (no B) is no entity; prediction B I there is a false positive: P 0 (0/1), R 0 (no gold)
    assert entity_f1([["I", "I", "O"]], [["B", "I", "O"]]) == {
        "precision": 0.0, "recall": 0.0, "f1": 0.0, "n_true": 0.0, "n_pred": 1.0, "n_correct": 0.0}


def test_entity_f1_adjacent_entities_are_two():
    gold = [["B", "I", "B", "O"]]  # two entities: [0,2) and [2,3)
    pred = [["B", "I", "I", "O"]]  # one entity [0,3): matches neither boundary
    result = entity_f1(gold, pred)
    assert (result["n_true"], result["n_pred"], result["n_correct"]) == (2, 1, 0)
    assert result["f1"] == 0.0
    assert entity_f1(gold, gold)["f1"] == 1.0


def test_entity_f1_equals_seqevals_strict_micro_scores_on_random_tags():
    """The counts-based scores are seqeval's own (`mode="strict"`, IOB2, zero_division 0) on messy random tags:
    two types, stray I tags, type changes inside spans, empty predictions."""
    import random

    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    rng = random.Random(0)
    tags = ["O", "O", "O", "B-Gene", "I-Gene", "B-Chem", "I-Chem", "I-Gene"]
    for trial in range(40):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 8))]
        pred = [[rng.choice(tags) if rng.random() < 0.7 else tag for tag in sentence] for sentence in gold]
        if trial % 10 == 0:
            pred = [["O"] * len(sentence) for sentence in gold]
        ours = entity_f1(gold, pred)
        options = {"mode": "strict", "scheme": IOB2, "zero_division": 0}
        assert ours["precision"] == pytest.approx(precision_score(gold, pred, **options), abs=1e-12), trial
        assert ours["recall"] == pytest.approx(recall_score(gold, pred, **options), abs=1e-12), trial
        assert ours["f1"] == pytest.approx(f1_score(gold, pred, **options), abs=1e-12), trial


def test_entity_f1_micro_over_sentences_and_typed_tags():
    gold = [["B-Gene", "I-Gene", "O"], ["B-Chem", "O", "B-Gene"]]
    pred = [["B-Gene", "I-Gene", "O"], ["B-Gene", "O", "B-Gene"]]  # wrong type on the Chem entity
    # gold 3, pred 3, correct 2 → P = R = F1 = 2/3
    result = entity_f1(gold, pred)
    assert result["f1"] == pytest.approx(2 / 3)
    assert result["precision"] == pytest.approx(2 / 3)


def test_entity_f1_length_mismatch_is_an_error():
    with pytest.raises(BiodistilError, match="sentence 0"):
        entity_f1([["O", "B"]], [["O"]])


# ------------------------------------------------------------------------------------ token macro F1


def test_token_macro_f1_pico():
    gold = [["O", "I-PAR", "I-PAR", "I-INT", "O"]]
    pred = [["O", "I-PAR", "O", "I-INT", "I-INT"]]
    # PAR: tp 1, fp 0, fn 1 → P 1, R 0.5, F1 2/3.  INT: tp 1, fp 1, fn 0 → P 0.5, R 1, F1 2/3.
    # macro = 2/3; micro: tp 2, fp 1, fn 1 → 2/3.  O is not a class.
    result = token_macro_f1(gold, pred)
    assert result["macro_f1"] == pytest.approx(2 / 3)
    assert result["micro_f1"] == pytest.approx(2 / 3)
    # B-/I- prefixes are merged into the entity type
    assert token_macro_f1([["B-OUT", "I-OUT"]], [["I-OUT", "I-OUT"]])["macro_f1"] == 1.0


# ------------------------------------------------------------------------------------- classification


def test_binary_prf_gad():
    y_true = ["1", "1", "1", "0", "0", "0"]
    y_pred = ["1", "1", "0", "1", "0", "0"]
    # tp 2, fp 1, fn 1 → P 2/3, R 2/3, F1 2/3; accuracy 4/6
    result = binary_prf(y_true, y_pred, positive="1")
    assert result["precision"] == pytest.approx(2 / 3)
    assert result["recall"] == pytest.approx(2 / 3)
    assert result["f1"] == pytest.approx(2 / 3)
    assert result["accuracy"] == pytest.approx(4 / 6)
    # ints and strings are the same class; no positive prediction → precision 0, F1 0
    assert binary_prf([1, 0], [0, 0], positive="1") == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                                         "accuracy": 0.5}


def test_binary_prf_adds_auroc_from_the_positive_scores():
    # positives score 0.9 and 0.4, negatives 0.1 and 0.6: 3 of the 4 (positive, negative) pairs are ranked right
    result = binary_prf(["1", "0", "1", "0"], ["0", "0", "0", "0"], positive="1", positive_scores=[0.9, 0.1, 0.4, 0.6])
    assert result["auroc"] == pytest.approx(0.75) and result["f1"] == 0.0, "one predicted class still ranks"
    assert math.isnan(binary_prf(["1", "1"], ["1", "1"], positive_scores=[0.2, 0.3])["auroc"])


def test_micro_f1_excluding_chemprot_false():
    y_true = ["CPR:3", "CPR:4", "False", "False", "CPR:9"]
    y_pred = ["CPR:3", "CPR:9", "CPR:4", "False", "False"]
    # positives (not False): tp = 1 (CPR:3); predicted positives = 3 (CPR:3, CPR:9, CPR:4); gold positives = 3
    # P 1/3, R 1/3, F1 1/3.  The correct "False" (index 3) earns nothing.
    result = micro_f1_excluding(y_true, y_pred, negative_labels=["False"])
    assert result["precision"] == pytest.approx(1 / 3)
    assert result["recall"] == pytest.approx(1 / 3)
    assert result["f1"] == pytest.approx(1 / 3)
    # counting False as a class would instead give accuracy-like micro F1 2/5
    assert micro_f1_excluding(y_true, y_pred, negative_labels=[])["f1"] == pytest.approx(2 / 5)


def test_micro_f1_excluding_ddi_negatives():
    y_true = ["DDI-false", "DDI-effect", "DDI-advise", "DDI-false", "DDI-mechanism", "DDI-int"]
    y_pred = ["DDI-false", "DDI-effect", "DDI-false", "DDI-effect", "DDI-mechanism", "DDI-int"]
    # gold positives 4, predicted positives 4 (effect, effect, mechanism, int), tp 3 → P = R = F1 = 3/4
    result = micro_f1_excluding(y_true, y_pred, negative_labels=["DDI-false", "false"])
    assert result == pytest.approx({"precision": 0.75, "recall": 0.75, "f1": 0.75})
    # nothing but negatives → 0, not a division error
    assert micro_f1_excluding(["DDI-false"], ["DDI-false"], ["DDI-false"])["f1"] == 0.0


def test_accuracy_macro_f1_pubmedqa():
    y_true = ["yes", "yes", "no", "maybe"]
    y_pred = ["yes", "no", "no", "yes"]
    # accuracy 2/4. yes: tp1 fp1 fn1 → 1/2; no: tp1 fp1 fn0 → 2/3; maybe: 0 → macro (1/2+2/3+0)/3 = 7/18
    result = accuracy_macro_f1(y_true, y_pred, labels=["yes", "no", "maybe"])
    assert result["accuracy"] == 0.5
    assert result["macro_f1"] == pytest.approx(7 / 18)


def test_accuracy_auroc_bioasq():
    y_true = ["yes", "yes", "no", "no"]
    scores = [0.9, 0.4, 0.6, 0.1]
    y_pred = ["yes" if s > 0.5 else "no" for s in scores]  # yes, no, yes, no → accuracy 2/4
    # pairs (pos, neg): (0.9,0.6)✓ (0.9,0.1)✓ (0.4,0.6)✗ (0.4,0.1)✓ → AUROC 3/4
    result = accuracy_auroc(y_true, y_pred, scores, positive="yes")
    assert result == pytest.approx({"accuracy": 0.5, "auroc": 0.75})
    assert math.isnan(accuracy_auroc(["yes"], ["yes"], [0.8])["auroc"])  # one class: undefined


# -------------------------------------------------------------------------------------------- HoC


def test_hoc_example_f1():
    gold = [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    pred = [[1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]]
    # doc1 G={0,1} P={0}: F1 = 2*1/(2+1) = 2/3, P 1, R 1/2
    # doc2 both empty: F1 = P = R = 1 (our convention)
    # doc3 G={2} P={1}: 0, 0, 0
    # doc4 G={3} P={3}: 1, 1, 1
    # example_f1 = (2/3 + 1 + 0 + 1)/4 = 2/3; mean P = 3/4, mean R = 5/8; blue_f1 = 2PR/(P+R) = 15/22
    result = hoc_example_f1(gold, pred)
    assert result["example_f1"] == pytest.approx(2 / 3)
    assert result["example_precision"] == pytest.approx(3 / 4)
    assert result["example_recall"] == pytest.approx(5 / 8)
    assert result["blue_f1"] == pytest.approx(15 / 22)
    # micro over cells: tp 2 (0 in doc1, 3 in doc4), fp 1 (1 in doc3), fn 2 → P 2/3, R 1/2, F1 4/7
    assert result["micro_f1"] == pytest.approx(4 / 7)
    # macro over 4 label columns: col0 1, col1 0 (tp0 fp1 fn1), col2 0, col3 1 → 1/2
    assert result["macro_f1"] == pytest.approx(0.5)


def test_hoc_rejects_ragged_rows():
    with pytest.raises(BiodistilError, match="different lengths"):
        hoc_example_f1([[1, 0], [0, 1]], [[1, 0], [0]])


# ------------------------------------------------------------------------------------ folds and seeds


def test_aggregate_folds_mean_and_sample_std():
    folds = [{"f1": 0.8, "precision": 0.7}, {"f1": 0.9, "precision": 0.9}, {"f1": 0.7, "precision": 0.8}]
    # f1 mean 0.8, sample std sqrt(((0)^2 + 0.1^2 + 0.1^2)/2) = 0.1; precision mean 0.8, std 0.1
    result = aggregate_folds(folds)
    assert result["f1"] == pytest.approx(0.8)
    assert result["f1_std"] == pytest.approx(0.1)
    assert result["precision_std"] == pytest.approx(0.1)
    assert result["n_folds"] == 3
    assert aggregate_folds([{"f1": 0.5}]) == {"f1": 0.5, "f1_std": 0.0, "n_folds": 1.0}
    with pytest.raises(BiodistilError, match="fold 1"):
        aggregate_folds([{"f1": 0.5}, {"acc": 0.5}])


def test_summarize_seeds():
    # values 1, 2, 4, 9: mean 4, median 3, sample variance (9+4+0+25)/3 = 38/3
    result = summarize_seeds([1, 2, 4, 9])
    assert result == pytest.approx({"mean": 4.0, "median": 3.0, "std": math.sqrt(38 / 3), "n": 4.0})
    with pytest.raises(BiodistilError):
        summarize_seeds([])


# ------------------------------------------------------------------------------------------- registry


def test_registry_headlines():
    assert headline_key("entity_f1") == "f1"
    assert headline_key("hoc_example_f1") == "example_f1"
    assert headline_key("accuracy_auroc") == "accuracy"
    for name, spec in METRICS.items():
        assert spec.headline, name
    result = get_metric("binary_prf")(["1", "0"], ["1", "0"], positive="1")
    assert result[get_metric("binary_prf").headline] == 1.0
    with pytest.raises(BiodistilError, match=r"Unknown metric 'bleu'.*entity_f1"):
        get_metric("bleu")
