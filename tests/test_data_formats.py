"""Task-file readers: each on a small well-formed file and on a malformed one (error names file and line)."""

import json
import re
from pathlib import Path

import pytest

from biodistil.data.formats import TextExample, TokenExample, read_examples, reader_options
from biodistil.errors import BiodistilError


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def jsonl(*objects: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objects)


def assert_error_at(format_name: str, path: Path, line: int, expected: str, **options: object) -> None:
    with pytest.raises(BiodistilError) as info:
        read_examples(format_name, path, **options)
    message = str(info.value)
    assert f"{path}:{line}:" in message, message
    assert re.search(expected, message), message


# ------------------------------------------------------------------------------------ biobert_ner_tsv


def test_biobert_ner_tsv_reads_sentences_with_crlf_and_trailing_blanks(tmp_path):
    text = "Familial\tB\r\nataxia\tI\r\n.\tO\r\n\r\nNo\tO\r\nrisk\tO\r\n\r\n\r\n"
    path = write(tmp_path, "train.tsv", text)
    examples = read_examples("biobert_ner_tsv", path)
    assert examples == [TokenExample("0", ["Familial", "ataxia", "."], ["B", "I", "O"]),
                        TokenExample("1", ["No", "risk"], ["O", "O"])]


def test_biobert_ner_tsv_last_sentence_without_blank_line_and_typed_tags(tmp_path):
    path = write(tmp_path, "t.tsv", "BRCA1\tB-Gene\nis\tO\n\n\nTP53\tB-Gene")
    examples = read_examples("biobert_ner_tsv", path)
    assert [e.tags for e in examples] == [["B-Gene", "O"], ["B-Gene"]]


@pytest.mark.parametrize(("text", "line", "expected"), [
    ("a\tO\nb O\n", 2, "found 1 tab-separated field.*expected 2"),
    ("a\tO\n\nb\tO\textra\n", 3, "found 3 tab-separated"),
    ("a\tO\nb\tDisease\n", 2, "unknown tag format 'Disease'"),
    ("a\tO\n \tO\n", 2, "empty token or tag"),
])
def test_biobert_ner_tsv_malformed(tmp_path, text, line, expected):
    assert_error_at("biobert_ner_tsv", write(tmp_path, "bad.tsv", text), line, expected)


def test_biobert_ner_tsv_invalid_utf8(tmp_path):
    path = tmp_path / "bin.tsv"
    path.write_bytes(b"a\tO\n\xff\xfe\tO\n")
    assert_error_at("biobert_ner_tsv", path, 2, "not valid UTF-8")


# ------------------------------------------------------------------------------------ blurb_ner_jsonl


def test_blurb_ner_jsonl_string_and_int_tags(tmp_path):
    path = write(tmp_path, "train.json", jsonl(
        {"tokens": ["Renal", "failure", "."], "ner_tags": ["B", "I", "O"], "id": "7"},
        {"tokens": ["Liver", "injury"], "ner_tags": [1, 2]},
    ) + "\n")
    examples = read_examples("blurb_ner_jsonl", path)
    assert examples[0] == TokenExample("7", ["Renal", "failure", "."], ["B", "I", "O"])
    assert examples[1] == TokenExample("1", ["Liver", "injury"], ["B", "I"])  # id defaults to the index
    custom = read_examples("blurb_ner_jsonl", path, tag_names=["O", "I-PAR", "I-INT"])
    assert custom[1].tags == ["I-PAR", "I-INT"]


@pytest.mark.parametrize(("line2", "expected"), [
    ('{"tokens": ["a"], "ner_tags": ["O"]', "invalid JSON"),
    ('{"tokens": ["a", "b"]}', "missing field 'ner_tags'"),
    ('{"tokens": ["a", "b"], "ner_tags": ["O"]}', "2 tokens but 1 ner_tags"),
    ('{"tokens": ["a"], "ner_tags": [7]}', "tag id 7 out of range"),
    ('{"tokens": ["a"], "ner_tags": ["Gene"]}', "unknown tag format"),
    ('{"tokens": "a b", "ner_tags": ["O"]}', "field 'tokens' should be list"),
    ('["a", "O"]', "expected a JSON object"),
])
def test_blurb_ner_jsonl_malformed(tmp_path, line2, expected):
    path = write(tmp_path, "bad.json", jsonl({"tokens": ["x"], "ner_tags": ["O"]}) + line2 + "\n")
    assert_error_at("blurb_ner_jsonl", path, 2, expected)


# ---------------------------------------------------------------------------------------- blurb_jsonl


def test_blurb_jsonl_sentence_pair_and_multilabel(tmp_path):
    path = write(tmp_path, "mix.json", jsonl(
        {"id": "a", "sentence": "@GENE$ causes @DISEASE$.", "label": "1"},
        {"id": "b", "sentence1": "Is it?", "sentence2": "It is.", "label": "yes"},
        {"id": "c", "sentence": "An abstract.", "label": [0, 1, 0]},
        {"id": "d", "sentence": "Int label.", "label": 0},
    ))
    examples = read_examples("blurb_jsonl", path)
    assert examples == [
        TextExample("a", "@GENE$ causes @DISEASE$.", None, "1"),
        TextExample("b", "Is it?", "It is.", "yes"),
        TextExample("c", "An abstract.", None, [0, 1, 0]),
        TextExample("d", "Int label.", None, "0"),
    ]


@pytest.mark.parametrize(("line2", "expected"), [
    ('{"id": "x", "label": "1"}', "missing field 'sentence'"),
    ('{"id": "x", "sentence1": "q?", "label": "yes"}', "missing field 'sentence2'"),
    ('{"id": "x", "sentence": "s"}', "missing field 'label'"),
    ('{"id": "x", "sentence": "s", "label": [0, 2]}', "list of 0/1"),
    ('{"id": "x", "sentence": 5, "label": "1"}', "should be str"),
    ("not json", "invalid JSON"),
])
def test_blurb_jsonl_malformed(tmp_path, line2, expected):
    path = write(tmp_path, "bad.json", jsonl({"sentence": "ok", "label": "0"}) + line2 + "\n")
    assert_error_at("blurb_jsonl", path, 2, expected)


def test_blurb_jsonl_unlabelled_when_allowed(tmp_path):
    path = write(tmp_path, "test.json", jsonl({"sentence": "s"}))
    assert read_examples("blurb_jsonl", path, require_label=False)[0].label is None


# ------------------------------------------------------------------------------------- biobert_re_tsv


def test_biobert_re_tsv_train_without_header(tmp_path):
    path = write(tmp_path, "train.tsv", "@GENE$ in @DISEASE$.\t1\nNo link of @GENE$ and @DISEASE$.\t0\n")
    assert read_examples("biobert_re_tsv", path) == [
        TextExample("0", "@GENE$ in @DISEASE$.", None, "1"),
        TextExample("1", "No link of @GENE$ and @DISEASE$.", None, "0"),
    ]


def test_biobert_re_tsv_test_with_header(tmp_path):
    text = "index\tsentence\tlabel\r\n0\t@GENE$ and @DISEASE$.\t1\r\n1\tOther.\t0\r\n"
    path = write(tmp_path, "test.tsv", text)
    examples = read_examples("biobert_re_tsv", path)
    assert examples == [
        TextExample("0", "@GENE$ and @DISEASE$.", None, "1"),
        TextExample("1", "Other.", None, "0"),
    ]


@pytest.mark.parametrize(("text", "line", "expected"), [
    ("ok\t1\nno label here\n", 2, "found 1 tab-separated.*sentence<TAB>label"),
    ("index\tsentence\tlabel\n0\tok\t1\n1\tmissing label\n", 3, "found 2 .*index<TAB>sentence<TAB>label"),
    ("ok\t1\nempty\t \n", 2, "empty label"),
])
def test_biobert_re_tsv_malformed(tmp_path, text, line, expected):
    assert_error_at("biobert_re_tsv", write(tmp_path, "bad.tsv", text), line, expected)


# -------------------------------------------------------------------------------------------- blue_tsv


def test_blue_tsv_default_and_configured_columns(tmp_path):
    text = "sentence\tlabel\r\nBC6ENTC inhibits BC6ENTG.\tCPR:4\r\nNone.\tFalse\r\n"
    path = write(tmp_path, "train.tsv", text)
    assert read_examples("blue_tsv", path) == [
        TextExample("0", "BC6ENTC inhibits BC6ENTG.", None, "CPR:4"),
        TextExample("1", "None.", None, "False"),
    ]
    pairs = write(tmp_path, "pairs.tsv", "index\tgenre\ts1\ts2\tscore\nx1\tclin\tA\tB\t3.5\n")
    examples = read_examples("blue_tsv", pairs, text_column="s1", pair_column="s2", label_column="score")
    assert examples == [TextExample("x1", "A", "B", "3.5")]


def test_blue_tsv_malformed(tmp_path):
    path = write(tmp_path, "bad.tsv", "sentence\tlabel\nfine\tFalse\ntoo\tmany\tfields\n")
    assert_error_at("blue_tsv", path, 3, r"found 3 .*\['sentence', 'label'\]")
    assert_error_at("blue_tsv", path, 1, "no column 'text'", text_column="text")
    empty = write(tmp_path, "empty.tsv", "")
    with pytest.raises(BiodistilError, match=re.escape(str(empty)) + ".*empty file"):
        read_examples("blue_tsv", empty)


# --------------------------------------------------------------------------------------- pubmedqa_json


PQA = {
    "111": {"QUESTION": "Does X help?", "CONTEXTS": ["First.", "Second."], "final_decision": "yes"},
    "222": {"QUESTION": "Is Y safe?", "CONTEXTS": ["Only."], "final_decision": "maybe"},
}


def test_pubmedqa_json(tmp_path):
    path = write(tmp_path, "ori_pqal.json", json.dumps(PQA, indent=1))
    assert read_examples("pubmedqa_json", path) == [
        TextExample("111", "Does X help?", "First. Second.", "yes"),
        TextExample("222", "Is Y safe?", "Only.", "maybe"),
    ]


def test_pubmedqa_json_malformed(tmp_path):
    bad = {**PQA, "333": {"QUESTION": "Q?", "CONTEXTS": ["c"], "final_decision": "perhaps"}}
    text = json.dumps(bad, indent=1)
    line = text[: text.index('"333"')].count("\n") + 1
    assert_error_at("pubmedqa_json", write(tmp_path, "bad.json", text), line, "final_decision 'perhaps'")
    missing = {"444": {"QUESTION": "Q?", "final_decision": "no"}}
    assert_error_at("pubmedqa_json", write(tmp_path, "miss.json", json.dumps(missing, indent=1)), 2,
                    "missing field 'CONTEXTS'")
    assert_error_at("pubmedqa_json", write(tmp_path, "broken.json", '{\n "1": {\n}'), 3, "invalid JSON")


# ----------------------------------------------------------------------------------------- boolq_jsonl


def test_boolq_jsonl(tmp_path):
    path = write(tmp_path, "val.jsonl", jsonl(
        {"question": "is it", "title": "T", "passage": "P.", "answer": True},
        {"question": "is it not", "passage": "Q.", "answer": False},
    ))
    assert read_examples("boolq_jsonl", path) == [
        TextExample("0", "is it", "P.", "yes"), TextExample("1", "is it not", "Q.", "no"),
    ]
    assert read_examples("boolq_jsonl", path, prepend_title=True)[0].text_pair == "T: P."
    questions = write(tmp_path, "q.jsonl", jsonl({"question": "q", "answer": True}))
    assert read_examples("boolq_jsonl", questions, require_passage=False)[0].text_pair is None


@pytest.mark.parametrize(("line2", "expected"), [
    ('{"question": "q", "passage": "p", "answer": "true"}', "field 'answer' should be bool"),
    ('{"question": "q", "answer": true}', "missing field 'passage'"),
    ('{"passage": "p", "answer": true}', "missing field 'question'"),
])
def test_boolq_jsonl_malformed(tmp_path, line2, expected):
    good = jsonl({"question": "q", "passage": "p", "answer": True})
    path = write(tmp_path, "bad.jsonl", good + line2 + "\n")
    assert_error_at("boolq_jsonl", path, 2, expected)


# ------------------------------------------------------------------------------------------ dispatcher


def test_dispatcher_errors(tmp_path):
    with pytest.raises(BiodistilError, match=r"Unknown data format 'conll'.*biobert_ner_tsv"):
        read_examples("conll", tmp_path / "x")
    with pytest.raises(BiodistilError, match="has no option"):
        read_examples("biobert_ner_tsv", tmp_path / "x", delimiter=",")
    with pytest.raises(BiodistilError, match="file not found"):
        read_examples("biobert_ner_tsv", tmp_path / "absent.tsv")
    assert "text_column" in reader_options("blue_tsv")
