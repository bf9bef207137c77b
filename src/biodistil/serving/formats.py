"""The formats `biodistil serve` answers in: `predict`'s JSON records (`jsonl`, the default) and the document formats
of `predict --format` (brat, PubTator, BioC, span JSON lines) — written by the writers `predict` writes its files with
(`documents.writers`), on the documents of `Predictor.predict_documents`, so that an answer is, byte for byte, what
`predict --format F` writes for the same documents.

A request's documents arrive as JSON (`{"documents": [{"id", "text"}]}`, as `predict` reads JSON lines) or as a body
in the format itself (a PubTator file, a BioC XML collection, span JSON lines, one brat `.txt`), read by the readers
`predict --format F` reads its inputs with; the answer is then in that format. No web framework here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from biodistil.documents.model import SpanDocument
from biodistil.documents.writers import SPAN_TEXTS, brat_files
from biodistil.export.predict import Document

FORMATS = ("jsonl", "brat", "pubtator", "bioc", "span_jsonl")  # all but jsonl need a token classifier
MEDIA_TYPES = {
    "jsonl": "application/json",  # {"records": [...]}
    "brat": "application/json",  # {"documents": [{"id", "name", "ann"}]}; a brat body (.txt) is answered its .ann
    "pubtator": "text/plain; charset=utf-8",
    "bioc": "application/xml; charset=utf-8",
    "span_jsonl": "application/x-ndjson; charset=utf-8",
}
BRAT_ANN_MEDIA_TYPE = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Rendered:
    """An answer's body and media type."""

    body: bytes
    media_type: str


def span_documents(documents: Sequence[Document]) -> list[SpanDocument]:
    """A JSON request's documents as `predict --out-format F` makes them of JSON lines: the id and the text."""
    return [SpanDocument(document.id, document.text) for document in documents]


def render(format_name: str, predicted: Sequence[SpanDocument], brat_body: bool = False) -> Rendered:
    """The answer in a document format: the text `predict --format F` writes (brat: each document's NAME and `.ann`
    text as JSON, or the one `.ann` text when the request's body was a brat `.txt`)."""
    if format_name == "brat":
        files = brat_files(predicted, "the request")
        if brat_body:
            return Rendered(files[0][2].encode("utf-8"), BRAT_ANN_MEDIA_TYPE)
        answer = {"documents": [{"id": document.id, "name": name, "ann": ann}
                                for document, (name, _, ann) in zip(predicted, files, strict=True)]}
        return Rendered(json.dumps(answer, ensure_ascii=False).encode("utf-8"), MEDIA_TYPES["brat"])
    return Rendered(SPAN_TEXTS[format_name](predicted).encode("utf-8"), MEDIA_TYPES[format_name])
