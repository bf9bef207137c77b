"""Encoding examples into features: long relation examples keep their entity markers; unlabelled texts encode from
a model's `EncodingSpec` as their task encodes them; a window of words carries its own words' tags."""

import pytest
from kd_fixtures import write_token_task

from biodistil.data.alignment import IGNORE_INDEX
from biodistil.data.formats import TextExample, TokenExample
from biodistil.tasks.encoding import EncodingSpec, encode_inputs, encode_split, window_around_markers
from biodistil.tasks.registry import get_task


@pytest.mark.parametrize(("first", "second"), [("@GENE$", "@DISEASE$"), ("@DRUG$", "@DRUG$"),
                                               ("BC6ENTC", "BC6ENTG")])
def test_a_long_relation_example_keeps_its_markers(tokenizer, first, second):
    text = "the protein kinase " * 30 + f"{first} binding " + "cell tumour " * 5 + f"{second} ." + " gene" * 40
    window, kept = window_around_markers(text, tokenizer, 32)
    assert kept and first in window and second in window
    assert len(tokenizer(window)["input_ids"]) <= 32


def test_markers_too_far_apart_are_counted(pair_task, tokenizer):
    task = pair_task.model_copy(update={"max_length": 24})
    near = "the cell " * 20 + "@GENE$ binds @DISEASE$ ." + " the cell" * 20
    far = "@GENE$ " + "cell " * 60 + "@DISEASE$"
    encoded = encode_split(task, [TextExample("a", near, None, "yes"), TextExample("b", far, None, "no")], tokenizer)
    assert encoded.truncated_examples == 2 and encoded.markers_cut == 1
    assert len(encoded.features[0]["input_ids"]) <= 24



def test_unlabelled_texts_encode_from_a_spec_as_their_task_encodes_them(tmp_path, tokenizer, pair_task):
    """`encode_inputs` with an `EncodingSpec` (what a fine-tuned model knows: kind, labels, length) gives the features
    `encode_split` gives the labelled examples, without targets."""
    ner = get_task(str(write_token_task(tmp_path / "ner"))).model_copy(update={"max_length": 8, "truncation": "split"})
    cases = [(ner, ner.load_split("train"), lambda e: TokenExample(e.id, e.tokens, [])),
             (pair_task, pair_task.load_split("test"), lambda e: TextExample(e.id, e.text, e.text_pair, None))]
    for task, examples, unlabelled in cases:
        spec = EncodingSpec(task.kind, tuple(task.labels), task.max_length, task.truncation)
        labelled = encode_split(task, examples, tokenizer)
        inputs = encode_inputs(spec, [unlabelled(e) for e in examples], tokenizer)
        assert [{k: v for k, v in f.items() if k != "labels"} for f in labelled.features] == inputs.features
        assert labelled.origins == inputs.origins and labelled.word_ids == inputs.word_ids
        assert all("labels" in f for f in labelled.features) and not any("labels" in f for f in inputs.features)


def test_a_windows_labels_are_the_tags_of_its_own_words(tmp_path, tokenizer):
    """Each window of a long sentence (`truncation: split`) labels its words' first sub-words with the tags of the
    words it holds (from its start on), and nothing else."""
    ner = get_task(str(write_token_task(tmp_path / "ner"))).model_copy(update={"max_length": 8, "truncation": "split"})
    examples = ner.load_split("train")
    encoded = encode_split(ner, examples, tokenizer)
    later = [(examples[index], start, feature["labels"], word_ids) for feature, (index, start), word_ids
             in zip(encoded.features, encoded.origins, encoded.word_ids, strict=True) if start > 0]
    assert later, "some sentence is cut into windows"
    for example, start, labels, word_ids in later:
        first = [p for p, w in enumerate(word_ids) if w is not None and (p == 0 or word_ids[p - 1] != w)]
        assert [labels[p] for p in first] == [ner.label_to_id[example.tags[start + word_ids[p]]] for p in first]
        assert all(label == IGNORE_INDEX for p, label in enumerate(labels) if p not in first)
