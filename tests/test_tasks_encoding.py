"""Encoding long relation examples: the window keeps the entity markers the label is about."""

import pytest

from biodistil.data.formats import TextExample
from biodistil.tasks.encoding import encode_split, window_around_markers


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
