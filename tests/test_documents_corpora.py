"""Issue 57 on real corpora and real commands: the shared PubTator and brat corpora read, tagged, written in every
format and read back; a model's predictions written as documents and scored by `biodistil score` give the F1 that
`evaluate --finetuned` reports for the same model and split (on hand-written documents, and on DiMB brat)."""

import json
import random
from pathlib import Path

import pytest
from kd_fixtures import save_teacher
from recipe_fixtures import data_root, needs_data

from biodistil.cli.main import main
from biodistil.documents.alignment import KEPT, documents_from_tags, tag_documents
from biodistil.documents.model import Span, SpanDocument
from biodistil.documents.readers import read_span_documents
from biodistil.documents.scoring import character_scores
from biodistil.documents.writers import write_span_documents
from biodistil.tasks.registry import get_task

FORMATS = [("brat", "brat"), ("pubtator", "x.pubtator"), ("bioc", "x.xml"), ("bioc", "x.json"),
           ("span_jsonl", "x.jsonl")]


def keys(document: SpanDocument, extent: bool = False) -> list[tuple]:
    return sorted((s.type, ((s.start, s.end),)) if extent else s.key() for s in document.spans)


@needs_data
@pytest.mark.slow
def test_bc5cdr_dev_keeps_at_least_99_5_percent_of_its_entities_exactly_through_words_and_tags():
    documents = read_span_documents("pubtator", data_root() / "ner/bc5cdr_pubtator/devel.pubtator")
    examples, alignment = tag_documents(documents)
    print(alignment.summary("bc5cdr_pubtator devel: "))
    assert alignment.total() == 9591 and alignment.total(KEPT) / alignment.total() >= 0.995
    assert alignment.total() == alignment.total(KEPT) + alignment.total("changed") + alignment.total("dropped")
    back = documents_from_tags(documents, examples, [e.tags for e in examples])
    exact = sum(len(set(map(Span.key, g.spans)) & set(map(Span.key, b.spans))) for g, b in zip(documents, back,
                                                                                              strict=True))
    assert exact == len({(d.id, s.key()) for d in documents for s in d.spans})  # every one comes back as it was


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize(("corpus", "format_name"), [("ner/bc5cdr_pubtator/devel.pubtator", "pubtator"),
                                                     ("ner/dimb_brat", "brat")])
def test_both_corpora_read_back_the_same_spans_from_every_format_and_score_1_against_themselves(tmp_path, corpus,
                                                                                              format_name):
    gold = read_span_documents(format_name, data_root() / corpus)
    if format_name == "pubtator":
        gold = gold[:150]  # the round trip of every format on a sample; the whole file is tagged above
    assert character_scores(gold, gold)["strict"]["micro"]["f1"] == 1.0
    for written, name in FORMATS:
        write_span_documents(written, gold, tmp_path / name)
        back = {d.id: d for d in read_span_documents(written, tmp_path / name)}
        assert sorted(back) == sorted(d.id for d in gold)
        # PubTator holds one line of text and no discontinuous span: newlines come back as spaces, fragments as extents
        flat = written == "pubtator"
        for document in gold:
            text = document.text.replace("\n", " ") if flat else document.text
            assert back[document.id].text == text
            assert keys(back[document.id], flat) == keys(document, flat), (written, document.id)


def tiny_corpus(folder: Path, count: int = 12) -> Path:
    """Span JSON lines of short documents with Chemical and Disease entities (a seeded mix of a few sentences)."""
    rng = random.Random(5)
    sentences = [("aspirin", "Chemical", " reduces ", "fever", "Disease", "."),
                 ("the kinase inhibitor", "Chemical", " causes ", "renal failure", "Disease", " in mice."),
                 ("insulin", "Chemical", " treats ", "diabetes", "Disease", ".")]
    records = []
    for index in range(count):
        text, spans = "", []
        for first, first_type, middle, second, second_type, end in rng.sample(sentences, 2):
            for piece, kind in ((first.capitalize(), first_type), (middle, None), (second, second_type), (end, None)):
                if kind:
                    spans.append({"start": len(text), "end": len(text) + len(piece), "label": kind})
                text += piece
            text += " "
        records.append({"id": f"doc{index}", "text": text.strip(), "spans": spans})
    path = folder / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def predicted_and_evaluated(model: Path, task: str, gold: list[SpanDocument], tmp_path: Path,
                            capsys) -> tuple[dict, dict]:
    """The character scores of `predict --format brat` scored by `biodistil score`, and evaluate --finetuned's cell."""
    write_span_documents("brat", gold, tmp_path / "gold")
    assert main(["predict", str(model), str(tmp_path / "gold"), "--format", "brat", "--out",
                 str(tmp_path / "predicted"), "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "predicted").iterdir())[:2] == sorted(
        p.name for p in (tmp_path / "gold").iterdir())[:2]  # one .ann beside each .txt
    assert main(["score", str(tmp_path / "gold"), str(tmp_path / "predicted"), "--out",
                 str(tmp_path / "scores.json")]) == 0
    table = capsys.readouterr().out
    assert "strict P" in table and "macro" in table
    assert main(["evaluate", "--finetuned", str(model), "--task", task, "--out", str(tmp_path / "ev")]) == 0
    cell = json.loads((tmp_path / "ev" / "results.json").read_text())["cells"][0]
    return json.loads((tmp_path / "scores.json").read_text()), cell


@pytest.mark.slow
def test_predictions_written_as_brat_and_scored_give_the_f1_evaluate_finetuned_reports(tmp_path, teacher_dir,
                                                                                       capsys):
    data = tiny_corpus(tmp_path)
    task_file = tmp_path / "tiny_spans.yaml"
    task_file.write_text(f"name: tiny_spans\nkind: token_classification\nformat: span_jsonl\n"
                         f"files: {{train: {data}, test: {data}}}\nspans: {{split: {{train: 0.5, test: 0.5}}}}\n"
                         "metric: entity_f1\nmax_length: 64\ntruncation: split\n")
    task = get_task(str(task_file))
    assert task.labels == ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    model = save_teacher(teacher_dir, task, tmp_path / "model", seed=3)  # random head: arbitrary, fixed entities
    gold = task.span_split("test").documents
    scored, cell = predicted_and_evaluated(model, str(task_file), gold, tmp_path, capsys)
    assert cell["entity_alignment"]["test"]["kept"] == sum(len(d.spans) for d in gold)
    assert scored["strict"]["micro"]["predicted"] == cell["character"]["strict"]["micro"]["predicted"] > 0
    assert scored["strict"]["micro"]["f1"] == pytest.approx(cell["test"]["char_strict_f1"])
    assert scored["overlap"]["micro"]["f1"] == pytest.approx(cell["test"]["char_overlap_f1"])
    assert scored["strict"] == cell["character"]["strict"]
    # the Python API returns the spans the command wrote
    from biodistil import Predictor

    written = {d.id: keys(d) for d in read_span_documents("brat", tmp_path / "predicted")}
    assert {d.id: keys(d) for d in Predictor(model).predict_documents(gold)} == written
    # plain text in, span JSON lines out: the same entities at the same offsets
    (tmp_path / "plain").mkdir()
    for document in gold:
        (tmp_path / "plain" / f"{document.id}.txt").write_text(document.text)
    assert main(["predict", str(model), str(tmp_path / "plain"), "--whole-files", "--out-format", "span_jsonl",
                 "--out", str(tmp_path / "plain.jsonl"), "--quiet"]) == 0
    plain = {Path(d.id).stem: keys(d) for d in read_span_documents("span_jsonl", tmp_path / "plain.jsonl")}
    assert plain == written


@needs_data
@pytest.mark.slow
def test_on_dimb_brat_the_scored_brat_predictions_equal_evaluate_finetuned(tmp_path, teacher_dir, capsys):
    task = get_task("dimb_brat")
    model = save_teacher(teacher_dir, task, tmp_path / "model", seed=3)
    gold = read_span_documents("brat", data_root() / "ner/dimb_brat")
    test_ids = {d.id for d in task.span_split("test").documents}
    scored, cell = predicted_and_evaluated(model, "dimb_brat", [d for d in gold if d.id in test_ids], tmp_path,
                                           capsys)
    assert cell["character"]["strict"]["micro"]["gold"] == scored["strict"]["micro"]["gold"]
    assert scored["strict"]["micro"]["f1"] == pytest.approx(cell["test"]["char_strict_f1"])
    assert scored["overlap"]["micro"]["f1"] == pytest.approx(cell["test"]["char_overlap_f1"])
