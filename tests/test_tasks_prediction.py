"""Prediction batches features by length and returns the outputs in feature order."""

import numpy as np
from kd_fixtures import save_teacher, write_token_task

from biodistil.models.loading import load_tokenizer
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.encoding import collator_for, encode_split
from biodistil.tasks.prediction import length_batches, predict
from biodistil.tasks.registry import get_task


def test_length_batched_predictions_equal_one_example_at_a_time(teacher_dir, pair_task, tmp_path):
    for task in (pair_task, get_task(str(write_token_task(tmp_path / "ner")))):
        model = build_classifier(save_teacher(teacher_dir, task, tmp_path / task.name), task)
        tokenizer = load_tokenizer(str(tmp_path / task.name))
        examples = task.load_split("test")
        encoded = encode_split(task, examples, tokenizer)
        lengths = [len(f["input_ids"]) for f in encoded.features]
        assert lengths != sorted(lengths), "the split is not already in length order"
        together = predict(model, task, examples, encoded, collator_for(task, tokenizer), batch_size=5)
        alone = predict(model, task, examples, encoded, collator_for(task, tokenizer), batch_size=1)
        padded_less = predict(model, task, examples, encoded, collator_for(task, tokenizer), batch_size=5,
                              max_padding=0.2)
        assert together.labels == alone.labels == padded_less.labels
        if alone.scores:
            assert np.allclose(together.scores, alone.scores, atol=1e-5)
            assert np.allclose(padded_less.scores, alone.scores, atol=1e-5)


def test_length_batches_end_where_the_padding_would_pass_its_share():
    lengths = [10, 30, 11, 12, 29, 50]  # in length order: indices 0, 2, 3, 4, 1, 5
    assert length_batches(lengths, 4) == [[0, 2, 3, 4], [1, 5]]
    # 0.1: [10, 11, 12] pads 3 of 36 positions (8%); adding 29 would pad 54 of 116, so it starts a batch; [29, 30]
    # pads 1 of 60; adding 50 would pad 41 of 150
    assert length_batches(lengths, 4, max_padding=0.1) == [[0, 2, 3], [4, 1], [5]]
    assert length_batches(lengths, 2, max_padding=0.1) == [[0, 2], [3], [4, 1], [5]]
    assert length_batches([5, 5, 6], 8, max_padding=0.0) == [[0, 1], [2]]
    assert length_batches([], 4, max_padding=0.1) == []


def test_degenerate_predictions_are_named(pair_task, tmp_path):
    from biodistil.tasks.prediction import Predictions, degenerate, prediction_notes

    assert degenerate(pair_task, Predictions(["yes"] * 5, [])) == "every example predicted 'yes'"
    assert degenerate(pair_task, Predictions(["yes", "no", "yes"], [])) == ""
    ner = get_task(str(write_token_task(tmp_path / "ner")))
    assert degenerate(ner, Predictions([["O", "O"], ["O"]], [])) == "every word predicted O (no entity)"
    assert degenerate(ner, Predictions([["O", "B"], ["O"]], [])) == ""
    notes = prediction_notes(ner, Predictions([["O", "O"], ["O"]], [], filled_words=2), {"train": 3, "test": 1}, 3)
    assert notes[0].startswith("Long examples cut to") and "3 train, 1 test" in notes[0]
    assert notes[1].startswith("2 of 3 test words were cut off by truncation")
    assert notes[2].startswith("Degenerate test predictions: every word predicted O")


def test_the_negative_class_and_a_single_positive_type_is_flagged():
    from biodistil.tasks.prediction import Predictions, degenerate

    chemprot = get_task("chemprot")
    assert degenerate(chemprot, Predictions(["False", "CPR:3", "False", "CPR:3"], [])) == \
        "only the negative class and one positive type ('CPR:3') predicted"
    assert degenerate(chemprot, Predictions(["False", "CPR:3", "CPR:4"], [])) == ""
    assert degenerate(chemprot, Predictions(["CPR:3", "CPR:4"], [])) == "", "no negative: two positive types"
    gad = get_task("gad")
    assert degenerate(gad, Predictions(["0", "1", "0"], [])) == "", "a binary task has one positive type"


def test_ddi_markers_are_entity_markers_and_split_windows_cut_nothing(teacher_dir, tmp_path):
    from biodistil.data.formats import TokenExample
    from biodistil.tasks.encoding import ENTITY_MARKERS

    assert ENTITY_MARKERS.findall("@DRUG$ interacts with @DRUG-DRUG$ and @GENE$ BC6ENTC") == [
        "@DRUG$", "@DRUG-DRUG$", "@GENE$", "BC6ENTC"]
    ner = get_task(str(write_token_task(tmp_path / "ner")))  # truncation: split, max_length 16
    tokenizer = load_tokenizer(str(teacher_dir))
    long = TokenExample("1", ["protein"] * 40, ["B"] + ["I"] * 39)
    split = encode_split(ner, [long], tokenizer)
    assert len(split.features) > 1 and split.truncated_examples == 0, "windows keep every word"
    cut = encode_split(ner.model_copy(update={"truncation": "truncate"}), [long], tokenizer)
    assert len(cut.features) == 1 and cut.truncated_examples == 1
