"""Issue 57: the users' own annotated documents — brat, PubTator, BioC and span JSON lines read into one document
model, turned into tagged sentences by one counted policy, written back in every format, scored at the character
level. Hand-written files here; the shared corpora in test_documents_corpora.py."""

import json
from pathlib import Path

import pytest

from biodistil.data.alignment import chunk_words
from biodistil.documents.alignment import (
    KEPT,
    SpanPolicy,
    documents_from_tags,
    spans_from_tags,
    tag_documents,
)
from biodistil.documents.model import Passage, Span, SpanDocument
from biodistil.documents.readers import guess_format, read_span_documents
from biodistil.documents.scoring import character_scores
from biodistil.documents.words import sentences
from biodistil.documents.writers import write_span_documents
from biodistil.errors import BiodistilError
from biodistil.tasks.registry import get_task

TEXT = "Lithium carbonate toxicity in a newborn. It had 5-FU/DVP and renal failure."
#       0         1         2         3         4         5         6         7
#       0123456789012345678901234567890123456789012345678901234567890123456789012345


def spans(document: SpanDocument) -> list[tuple[str, tuple]]:
    return sorted(span.key() for span in document.spans)


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


# ------------------------------------------------------------------------------------------------ readers


def test_brat_reads_entities_fragments_in_text_order_and_counts_what_it_leaves_out(tmp_path):
    write(tmp_path / "d1.txt", "fresh but not heated yogurt\nimproves status")
    write(tmp_path / "d1.ann", "T1\tFood 14 27\theated yogurt\n"
                               "T2\tFood 21 27;0 5\tyogurt fresh\n"  # discontinuous, fragments out of text order
                               "T3\tIMPROVES 28 36\timproves\n"
                               "E1\tIMPROVES:T3 Arg:T1\n"
                               "R1\tHas Arg1:T1 Arg2:T2\n"
                               "A1\tNegated E1\n")
    [document] = read_span_documents("brat", tmp_path)
    assert document.id == "d1" and document.text.startswith("fresh")
    assert spans(document) == [("Food", ((0, 5), (21, 27))), ("Food", ((14, 27),))]  # the trigger T3 left out
    assert document.notes["event triggers (T lines an E line names: ignored)"] == 1
    assert sum(n for note, n in document.notes.items() if note.startswith("brat")) == 3


def test_pubtator_reads_title_plus_abstract_offsets_moves_a_shifted_mention_and_skips_relations(tmp_path):
    path = write(tmp_path / "x.pubtator",
                 "7|t|Lithium toxicity.\n7|a|Renal failure followed.\n"
                 "7\t0\t7\tLithium\tChemical\tD008094\n"
                 "7\t19\t32\tRenal failure\tDisease\t-1\n"   # "Renal failure" starts at 18: moved by one
                 "7\tCID\tD008094\tD007674\n\n")
    [document] = read_span_documents("pubtator", path)
    assert document.text == "Lithium toxicity. Renal failure followed."
    assert [p.offset for p in document.passages] == [0, 18]
    assert spans(document) == [("Chemical", ((0, 7),)), ("Disease", ((18, 31),))]
    assert document.spans[0].identifier == "D008094"
    assert document.notes["mention text found a few characters away (span moved)"] == 1
    assert document.notes["PubTator relation lines (ignored)"] == 1


BIOC_BYTES = """<?xml version='1.0' encoding='utf-8'?>
<collection><source>x</source><date>d</date><key>k</key>
<document><id>9</id>
<passage><offset>0</offset><text>Café and aspirin.</text>
<annotation id="A1"><infon key="type">Chemical</infon><location offset="10" length="7"/><text>aspirin</text>
</annotation>
</passage>
<passage><offset>19</offset><text>Aspirin helps.</text>
<annotation id="A2"><infon key="type">Chemical</infon><location offset="19" length="7"/><text>Aspirin</text>
</annotation>
</passage></document></collection>
"""


def test_bioc_byte_offsets_are_found_converted_to_characters_and_reported(tmp_path):
    # "é" is 2 bytes: "aspirin" starts at byte 10, character 9; the second passage at byte 19, character 18
    [document] = read_span_documents("bioc", write(tmp_path / "x.xml", BIOC_BYTES))
    assert document.text == "Café and aspirin. Aspirin helps."
    assert spans(document) == [("Chemical", ((9, 16),)), ("Chemical", ((18, 25),))]
    assert document.notes["BioC offsets counted in bytes (converted to characters)"] == 1
    as_characters = BIOC_BYTES.replace('offset="10"', 'offset="9"').replace('offset="19"', 'offset="18"').replace(
        "<offset>19</offset>", "<offset>18</offset>")
    [same] = read_span_documents("bioc", write(tmp_path / "y.xml", as_characters))
    assert spans(same) == spans(document) and same.text == document.text and not same.notes


def test_span_jsonl_reads_prodigy_doccano_and_label_studio_field_names(tmp_path):
    prodigy = write(tmp_path / "p.jsonl", json.dumps({"id": "a", "text": TEXT, "spans": [
        {"start": 0, "end": 17, "label": "Chemical"}]}) + "\n")
    doccano = write(tmp_path / "d.jsonl", json.dumps({"id": "a", "text": TEXT, "label": [[0, 17, "Chemical"]]}) + "\n")
    studio = write(tmp_path / "s.jsonl", json.dumps({"id": "a", "text": TEXT, "label": [
        {"start": 0, "end": 17, "labels": ["Chemical"]}]}) + "\n")
    expected = [("Chemical", ((0, 17),))]
    assert spans(read_span_documents("span_jsonl", prodigy)[0]) == expected
    assert spans(read_span_documents("span_jsonl", doccano, spans_field="label")[0]) == expected
    assert spans(read_span_documents("span_jsonl", studio, spans_field="label", label_field="labels")[0]) == expected


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("content", "message"), [
    ("T1\tFood 0 99\tfresh\n", "d.ann:1: offsets 0-99 of a Food mention lie outside the text"),
    ("T1\tFood 0 5\tfresh\nT2\tFood 6 9\tyogurt\n", "d.ann:2: the Food mention text 'yogurt' does not match"),
    ("T1\tFood zero 5\tfresh\n", "d.ann:1: expected `T<n><TAB>Type start end"),
])
def test_bad_brat_lines_are_errors_naming_file_and_line(tmp_path, content, message):
    write(tmp_path / "d.txt", "fresh but not heated")
    write(tmp_path / "d.ann", content)
    with pytest.raises(BiodistilError, match=message.replace("(", r"\(").replace("`", ".")):
        read_span_documents("brat", tmp_path)


def test_an_ann_without_its_txt_and_mixed_encodings_name_the_file_and_line(tmp_path):
    write(tmp_path / "a" / "d.ann", "T1\tFood 0 5\tfresh\n")
    with pytest.raises(BiodistilError, match=r"d.ann:1: no d.txt beside this .ann file"):
        read_span_documents("brat", tmp_path / "a")
    write(tmp_path / "b" / "d.txt", "first line\nCafé latin-1", encoding="latin-1")
    write(tmp_path / "b" / "d.ann", "T1\tFood 0 5\tfirst\n")
    with pytest.raises(BiodistilError, match=r"d.txt:2: not valid UTF-8"):
        read_span_documents("brat", tmp_path / "b")
    pubtator = write(tmp_path / "x.pubtator", "1|t|Aspirin.\n1|a|Good.\n1\t0\t7\tAspirine\tChemical\t-1\n")
    with pytest.raises(BiodistilError, match=r"x.pubtator:3: the Chemical mention text 'Aspirine' does not match"):
        read_span_documents("pubtator", pubtator)
    with pytest.raises(BiodistilError, match="cannot tell its format"):
        guess_format(tmp_path / "x.tsv")


def test_a_type_outside_the_tasks_labels_is_an_error_naming_file_and_line(tmp_path):
    data = write(tmp_path / "docs.jsonl", json.dumps({"id": "a", "text": TEXT, "spans": [
        {"start": 0, "end": 17, "label": "Chemical"}, {"start": 61, "end": 74, "label": "Disease"}]}) + "\n")
    task = write(tmp_path / "t.yaml", f"name: t\nkind: token_classification\nformat: span_jsonl\n"
                                      f"files: {{test: {data}}}\nlabels: [Chemical]\nmetric: entity_f1\n")
    with pytest.raises(BiodistilError, match=r"docs.jsonl:1: entity type 'Disease' is not among the task's types"):
        get_task(str(task)).load_split("test")


# ------------------------------------------------------------------------------------------------ words and tags


def test_sentences_and_words_keep_offsets_and_split_biomedical_names():
    found = sentences(TEXT, [Passage(0, TEXT)])
    words = [[TEXT[a:b] for a, b in sentence] for sentence in found]
    assert words[0] == ["Lithium", "carbonate", "toxicity", "in", "a", "newborn", "."]
    assert words[1] == ["It", "had", "5", "FU", "/", "DVP", "and", "renal", "failure", "."]


def document_with(*entities: tuple[str, tuple]) -> SpanDocument:
    return SpanDocument("d", TEXT, [Span(kind, fragments) for kind, fragments in entities])


def test_tags_keep_exact_entities_and_give_them_back_as_the_same_spans():
    document = document_with(("Chemical", ((0, 17),)), ("Disease", ((18, 26),)), ("Chemical", ((48, 52),)),
                             ("Chemical", ((53, 56),)), ("Disease", ((61, 74),)))
    examples, alignment = tag_documents([document])
    assert [e.tags for e in examples] == [
        ["B-Chemical", "I-Chemical", "B-Disease", "O", "O", "O", "O"],
        ["O", "O", "B-Chemical", "I-Chemical", "O", "B-Chemical", "O", "B-Disease", "I-Disease", "O"]]
    assert alignment.total(KEPT) == 5 and alignment.total() == 5
    [back] = documents_from_tags([document], examples, [e.tags for e in examples])
    assert spans(back) == spans(document)


def test_the_policy_for_what_does_not_fit_bio_is_applied_and_counted():
    document = document_with(
        ("Chemical", ((2, 17),)),              # starts inside "Lithium": expanded to 0-17
        ("Disease", ((0, 7), (18, 26))),       # discontinuous: its extent 0-26 (then the longest, kept)
        ("Disease", ((61, 66),)),              # nested in "renal failure" below: dropped
        ("Disease", ((61, 74),)),
        ("Disease", ((61, 74),)),              # the same annotation twice: one entity, kept
        ("Chemical", ((32, 43),)),             # "newborn. It" crosses the sentence end: sentences joined
    )
    examples, alignment = tag_documents([document], SpanPolicy("expand", "extent"))
    record = alignment.record()
    assert record["by_reason"] == {KEPT: 3, "changed: discontinuous (extent)": 1,
                                   "dropped: overlaps or nests in a longer entity": 2}
    # the expanded Chemical 0-17 overlaps the Disease extent 0-26 (longer): dropped, counted
    assert record["sentences_joined"] == 1 and len(examples) == 1
    assert record["by_type"] == {"Chemical": {"kept": 1, "changed": 0, "dropped": 1},
                                 "Disease": {"kept": 2, "changed": 1, "dropped": 1}}
    contract, counted = tag_documents([document_with(("Chemical", ((2, 17),)))], SpanPolicy("contract"))
    assert contract[0].tags[:2] == ["O", "B-Chemical"]
    assert counted.record()["by_reason"] == {"changed: boundary inside a word (contract)": 1}
    _, dropped = tag_documents([document_with(("Chemical", ((2, 5),)), ("D", ((0, 7), (18, 26))))],
                               SpanPolicy("contract", "drop"))
    assert dropped.record()["by_reason"] == {"dropped: discontinuous": 1, "dropped: no whole word inside it": 1}
    assert "2 gold entities: 0 kept exactly (0.00%), 0 changed, 2 dropped" in dropped.summary()


def test_spans_from_tags_read_strict_iob2_into_character_offsets():
    offsets = [(0, 3), (4, 9), (10, 12), (13, 20)]
    assert spans_from_tags(["B-X", "I-X", "I-Y", "B-Y"], offsets) == [Span("X", ((0, 9),)), Span("Y", ((13, 20),))]
    assert spans_from_tags(["I-X", "O", "B", "I"], offsets) == [Span("entity", ((10, 20),))]


def test_training_windows_end_before_an_entity_rather_than_inside_it():
    assert chunk_words([1] * 6, 3) == [(0, 3), (3, 6)]
    assert chunk_words([1] * 6, 3, [False, False, True, True, False, False]) == [(0, 1), (1, 4), (4, 6)]
    assert chunk_words([1] * 6, 3, [False, True, True, True, True, False]) == [(0, 3), (3, 6)]  # longer than a window


# ------------------------------------------------------------------------------------------------ writers


def rich_documents() -> list[SpanDocument]:
    title, abstract = "Café toxicity.", "Renal failure after 5-FU/DVP."
    text = f"{title} {abstract}"
    return [SpanDocument("p1", text, [Span("Disease", ((5, 13),), identifier="D1"), Span("Disease", ((15, 28),)),
                                      Span("Chemical", ((35, 39),)), Span("Chemical", ((40, 43),))],
                         [Passage(0, title, "title"), Passage(len(title) + 1, abstract, "abstract")]),
            SpanDocument("p2", "No entity here.")]


@pytest.mark.parametrize(("format_name", "name"), [("brat", "out"), ("pubtator", "x.pubtator"), ("bioc", "x.xml"),
                                                   ("bioc", "x.json"), ("span_jsonl", "x.jsonl")])
def test_every_format_reads_back_what_it_wrote(tmp_path, format_name, name):
    documents = rich_documents()
    write_span_documents(format_name, documents, tmp_path / name)
    back = {d.id: d for d in read_span_documents(format_name, tmp_path / name)}
    assert sorted(back) == ["p1", "p2"]
    for document in documents:
        assert back[document.id].text == document.text
        assert spans(back[document.id]) == spans(document)
    assert guess_format(tmp_path / name) == format_name


def test_discontinuous_spans_survive_brat_bioc_and_span_jsonl(tmp_path):
    document = SpanDocument("d", "fresh but not heated yogurt", [Span("Food", ((0, 5), (21, 27)))])
    for format_name, name in [("brat", "b"), ("bioc", "x.xml"), ("span_jsonl", "x.jsonl")]:
        write_span_documents(format_name, [document], tmp_path / name)
        assert spans(read_span_documents(format_name, tmp_path / name)[0]) == spans(document)
    assert (tmp_path / "b" / "d.ann").read_text() == "T1\tFood 0 5;21 27\tfresh yogurt\n"


# ------------------------------------------------------------------------------------------------ scores


def test_character_scores_by_hand_strict_overlap_per_type_micro_and_macro():
    text = "aaaa bbbb cccc dddd"
    gold = [SpanDocument("1", text, [Span("X", ((0, 4),)), Span("Y", ((5, 9),)), Span("X", ((15, 19),))])]
    predicted = [SpanDocument("1", text, [Span("X", ((0, 3),)),      # overlaps gold X 0-4: overlap only
                                          Span("Y", ((9, 14),)),     # touches gold Y at 9 (ends exclusive): none
                                          Span("X", ((15, 19),))])]  # exact
    scores = character_scores(gold, predicted)
    assert scores["strict"]["micro"]["correct"] == 1
    assert scores["strict"]["micro"]["f1"] == pytest.approx(1 / 3)
    assert scores["overlap"]["micro"]["f1"] == pytest.approx(2 / 3)
    assert scores["strict"]["per_type"]["X"]["f1"] == pytest.approx(0.5)
    assert scores["overlap"]["per_type"]["X"]["f1"] == 1.0 and scores["overlap"]["per_type"]["Y"]["f1"] == 0.0
    assert scores["strict"]["macro_f1"] == pytest.approx(0.25) and scores["overlap"]["macro_f1"] == 0.5
    assert character_scores(gold, gold)["strict"]["micro"]["f1"] == 1.0


def test_scoring_other_documents_is_an_error():
    with pytest.raises(BiodistilError, match="1 gold document"):
        character_scores([SpanDocument("1", "a")], [SpanDocument("2", "a")])
    with pytest.raises(BiodistilError, match="text differs"):
        character_scores([SpanDocument("1", "a")], [SpanDocument("1", "b")])


# ------------------------------------------------------------------------------------------------ tasks


def test_a_span_task_reads_its_labels_from_the_data_and_splits_one_file_by_documents(tmp_path):
    records = [{"id": f"d{i}", "text": TEXT, "spans": [{"start": 0, "end": 17, "label": "Chemical"},
                                                       {"start": 61, "end": 74, "label": "Disease"}]}
               for i in range(20)]
    data = write(tmp_path / "docs.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    task_file = write(tmp_path / "t.yaml", f"name: t\nkind: token_classification\nformat: span_jsonl\n"
                                           f"files: {{train: {data}, dev: {data}, test: {data}}}\n"
                                           "spans: {split: {train: 0.6, dev: 0.2, test: 0.2}, seed: 3}\n"
                                           "metric: entity_f1\n")
    task = get_task(str(task_file))
    assert task.labels == ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    documents = {split: {e.document for e in task.load_split(split)} for split in ("train", "dev", "test")}
    assert [len(documents[s]) for s in ("train", "dev", "test")] == [12, 4, 4]
    assert set.union(*documents.values()) == {f"d{i}" for i in range(20)}
    assert documents == {split: {e.document for e in get_task(str(task_file)).load_split(split)}
                         for split in ("train", "dev", "test")}  # the same documents every time
    unsplit = write(tmp_path / "u.yaml", task_file.read_text().replace("spans: {split: {train: 0.6, dev: 0.2, "
                                                                       "test: 0.2}, seed: 3}\n", ""))
    with pytest.raises(BiodistilError, match=r"name the same file; give `spans\.split`"):
        get_task(str(unsplit))


def test_a_long_training_sentence_is_cut_into_windows_before_an_entity_never_inside(tokenizer):
    from biodistil.data.formats import TokenExample
    from biodistil.tasks.encoding import encode_split
    from biodistil.tasks.registry import TaskSpec

    task = TaskSpec(name="t", kind="token_classification", format="biobert_ner_tsv", files={"test": "x.tsv"},
                    labels=["O", "B", "I"], metric="entity_f1", max_length=8, truncation="split")
    # 1, 1, 1, 3, 1, ... sub-words; 6 fit a window: cut by sub-words alone, the second window starts at "cell"
    words = ["the", "protein", "kinase", "gene", "cell", "tumour", "patients", "mutation", "the", "protein"]
    tags = ["O", "O", "B", "I", "I", "O", "O", "O", "O", "O"]  # "kinase gene cell": one entity
    example = TokenExample("0", words, tags)
    plain = encode_split(task, [example], tokenizer)
    whole = encode_split(task, [example], tokenizer, whole_entities=True)

    def windows(encoded):
        return [(start, start + max(w for w in ids if w is not None) + 1)
                for (_, start), ids in zip(encoded.origins, encoded.word_ids, strict=True)]

    assert windows(plain) == [(0, 4), (4, 10)]  # a window starts inside the entity
    assert windows(whole) == [(0, 2), (2, 6), (6, 10)]  # training windows start before it instead


def test_score_compares_two_formats_and_predict_refuses_to_write_over_its_input_folder(tmp_path, capsys):
    from biodistil.cli.main import main

    documents = rich_documents()
    write_span_documents("pubtator", documents, tmp_path / "gold.pubtator")
    predicted = [documents[0].with_spans(documents[0].spans[:2]), documents[1]]  # 2 of the 4 entities found
    write_span_documents("brat", predicted, tmp_path / "predicted")
    assert main(["score", str(tmp_path / "gold.pubtator"), str(tmp_path / "predicted"), "--out",
                 str(tmp_path / "s.json")]) == 0
    scores = json.loads((tmp_path / "s.json").read_text())
    assert scores["strict"]["micro"]["precision"] == 1.0 and scores["strict"]["micro"]["recall"] == 0.5
    assert scores["strict"]["per_type"]["Chemical"]["f1"] == 0.0 and scores["strict"]["macro_f1"] == 0.5
    assert "Disease" in capsys.readouterr().out
    assert main(["predict", str(tmp_path / "no-model"), str(tmp_path / "predicted"), "--format", "brat", "--out",
                 str(tmp_path / "predicted")]) == 2
    assert "is the input folder" in capsys.readouterr().err


def test_kd_transfer_windows_never_cut_a_gold_entity(tokenizer):
    """The kd student's features of a long labelled transfer sentence: windows start before the entity (as
    fine-tuning's), and an unlabelled sentence (placeholder tags) is cut by sub-words alone."""
    from biodistil.data.formats import TokenExample
    from biodistil.kd.module import kd_features
    from biodistil.tasks.registry import TaskSpec

    task = TaskSpec(name="t", kind="token_classification", format="biobert_ner_tsv", files={"test": "x.tsv"},
                    labels=["O", "B", "I"], metric="entity_f1", max_length=8, truncation="split")
    words = ["the", "protein", "kinase", "gene", "cell", "tumour", "patients", "mutation", "the", "protein"]
    labelled = TokenExample("0", words, ["O", "O", "B", "I", "I", "O", "O", "O", "O", "O"])
    unlabelled = TokenExample("1", words, [])
    features = kd_features(task, [labelled, unlabelled], tokenizer)
    starts = [tuple(feature["origin"]) for feature in features]
    assert starts == [(0, 0), (0, 2), (0, 6), (1, 0), (1, 4)]
    assert features[1]["labels"][1] == task.label_to_id["B"], "the second window opens on the entity's first word"
