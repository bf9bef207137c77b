"""Writers of span-annotated documents, the inverse of `readers`: brat, PubTator, BioC (XML or JSON), span JSON lines.

Every writer reads the same `SpanDocument`s and writes character offsets into the original text, atomically (a file
through a temporary file and a rename; a brat folder built aside and renamed into place). What a format cannot hold
is said in the writer's docstring: PubTator and span JSON lines hold one line of text per field (a newline is
written as a space, the offsets are unchanged); PubTator holds no discontinuous span (its extent is written). The
text of each file comes from one function (`SPAN_TEXTS`, `brat_files`), which `biodistil serve` answers with too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from biodistil.documents.model import Span, SpanDocument
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory, atomic_write_text

SAFE_NAME = re.compile(r"[^\w.-]+")


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")


def write_brat(documents: Sequence[SpanDocument], folder: str | Path) -> None:
    """One `NAME.txt` (the text) beside one `NAME.ann` per document (`T<n><TAB>Type start end[;start end]<TAB>text`);
    NAME is the document's id with characters outside letters, digits, `.`, `-` and `_` replaced by `_`."""
    files = brat_files(documents, str(folder))

    def fill(target: Path) -> None:
        for name, text, ann in files:
            (target / f"{name}.txt").write_text(text, encoding="utf-8", newline="")
            (target / f"{name}.ann").write_text(ann, encoding="utf-8", newline="")

    atomic_directory(Path(folder), fill)


def brat_files(documents: Sequence[SpanDocument], where: str) -> list[tuple[str, str, str]]:
    """(NAME, .txt text, .ann text) of each document, as `write_brat` writes them; two documents whose ids make the
    same NAME are an error (`where`: the folder, or the request, for the message)."""
    names = [SAFE_NAME.sub("_", document.id) or "document" for document in documents]
    if len(set(names)) != len(names):
        raise BiodistilError(f"{where}: two documents would share a brat file name (ids "
                             f"{sorted(n for n in names if names.count(n) > 1)[:3]}); give the documents unique ids")
    return [(name, document.text, brat_annotations(document)) for name, document in zip(names, documents,
                                                                                          strict=True)]


def brat_annotations(document: SpanDocument) -> str:
    """The .ann text of one document."""
    lines = []
    for number, span in enumerate(document.spans, 1):
        places = ";".join(f"{a} {b}" for a, b in span.fragments)
        lines.append(f"T{number}\t{span.type} {places}\t{_one_line(span.text(document.text))}\n")
    return "".join(lines)


def pubtator_text(document: SpanDocument) -> str:
    """One document in PubTator: title and abstract lines (the first passage is the title when a second starts one
    character after it; otherwise the whole text is the title), then one line per mention, then a blank line."""
    title, abstract = _title_and_abstract(document)
    lines = [f"{document.id}|t|{_one_line(title)}\n", f"{document.id}|a|{_one_line(abstract)}\n"]
    for span in sorted(document.spans, key=lambda s: (s.start, s.end)):
        fields = [document.id, str(span.start), str(span.end), _one_line(document.text[span.start:span.end]),
                  span.type, span.identifier or "-1"]
        lines.append("\t".join(fields) + "\n")
    return "".join(lines) + "\n"


def _title_and_abstract(document: SpanDocument) -> tuple[str, str]:
    passages = document.passages
    if len(passages) >= 2 and passages[0].offset == 0 and passages[1].offset == len(passages[0].text) + 1:
        title = passages[0].text
        return title, document.text[len(title) + 1:]
    return document.text, ""


def write_pubtator(documents: Sequence[SpanDocument], path: str | Path) -> None:
    """A PubTator file of the documents (discontinuous spans written as their extent)."""
    atomic_write_text(Path(path), pubtator_file_text(documents))


def pubtator_file_text(documents: Sequence[SpanDocument]) -> str:
    """The text of a PubTator file of the documents."""
    return "".join(pubtator_text(document) for document in documents)


def span_records(documents: Sequence[SpanDocument], text_field: str = "text", spans_field: str = "spans",
                 start_field: str = "start", end_field: str = "end", label_field: str = "label",
                 id_field: str = "id") -> list[dict[str, Any]]:
    """The documents as span JSON records, with the field names a reader of `read_span_jsonl` is given; a
    discontinuous span carries its `fragments` too."""
    return [{id_field: document.id, text_field: document.text,
             spans_field: [_span_record(span, document.text, start_field, end_field, label_field)
                           for span in document.spans]} for document in documents]


def _span_record(span: Span, text: str, start: str, end: str, label: str) -> dict[str, Any]:
    record: dict[str, Any] = {start: span.start, end: span.end, label: span.type, "text": span.text(text)}
    if span.discontinuous:
        record["fragments"] = [list(fragment) for fragment in span.fragments]
    return record


def write_span_jsonl(documents: Sequence[SpanDocument], path: str | Path, **fields: str) -> None:
    """Span JSON lines, one document a line (`span_records`' field names)."""
    atomic_write_text(Path(path), span_jsonl_text(documents, **fields))


def span_jsonl_text(documents: Sequence[SpanDocument], **fields: str) -> str:
    """The text of a span JSON-lines file of the documents."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in span_records(documents, **fields))


def bioc_collection(documents: Sequence[SpanDocument]) -> Any:
    """The documents as a `bioc.BioCCollection`: each passage at its offset, each span an annotation of the passage
    that holds its start (one location per fragment, `type` and `identifier` infons)."""
    import bioc

    collection = bioc.BioCCollection()
    collection.source = "biodistil"
    for document in documents:
        item = bioc.BioCDocument()
        item.id = document.id
        passages = []
        for passage in document.passages:
            part = bioc.BioCPassage.of_text(passage.text, passage.offset)
            if passage.kind:
                part.infons["type"] = passage.kind
            item.add_passage(part)
            passages.append((passage, part))
        for number, span in enumerate(document.spans, 1):
            _, part = next(((p, b) for p, b in reversed(passages) if p.offset <= span.start), passages[0])
            part.add_annotation(_bioc_annotation(span, document.text, number))
        collection.add_document(item)
    return collection


def _bioc_annotation(span: Span, text: str, number: int) -> Any:
    import bioc

    annotation = bioc.BioCAnnotation()
    annotation.id = span.id or f"T{number}"
    annotation.infons["type"] = span.type
    if span.identifier:
        annotation.infons["identifier"] = span.identifier
    for start, end in span.fragments:
        annotation.add_location(bioc.BioCLocation(start, end - start))
    annotation.text = span.text(text)
    return annotation


def write_bioc(documents: Sequence[SpanDocument], path: str | Path) -> None:
    """BioC XML, or BioC JSON when `path` ends in `.json`."""
    atomic_write_text(Path(path), bioc_text(documents, json_file=Path(path).suffix == ".json"))


def bioc_text(documents: Sequence[SpanDocument], json_file: bool = False) -> str:
    """The text of a BioC XML file of the documents (BioC JSON with `json_file`)."""
    from bioc import biocjson, biocxml

    collection = bioc_collection(documents)
    return biocjson.dumps(collection, indent=1) if json_file else biocxml.dumps(collection)


SPAN_TEXTS: dict[str, Callable[[Sequence[SpanDocument]], str]] = {  # the formats that are one text
    "pubtator": pubtator_file_text,
    "bioc": bioc_text,
    "span_jsonl": span_jsonl_text,
}
SPAN_WRITERS: dict[str, Callable[..., None]] = {
    "brat": write_brat,
    "pubtator": write_pubtator,
    "bioc": write_bioc,
    "span_jsonl": write_span_jsonl,
}


def write_span_documents(format_name: str, documents: Sequence[SpanDocument], path: str | Path,
                         **options: Any) -> None:
    """Write documents in a span format (brat: `path` is a folder)."""
    if format_name not in SPAN_WRITERS:
        raise BiodistilError(f"Unknown span format '{format_name}'; known: {', '.join(sorted(SPAN_WRITERS))}")
    SPAN_WRITERS[format_name](documents, path, **options)
