"""`biodistil predict --format brat|pubtator|bioc|span_jsonl`: annotated documents in, the model's entities out, in
the same format, with character offsets into the original text — so a prediction opens in the tool it came from.

Inputs are files of the format (their own spans are not read); a brat input is a folder of `.txt` files (with or
without their `.ann`). The output is one file (PubTator, BioC XML — `.json`: BioC JSON —, span JSON lines) or, for
brat, a folder with one `.txt` and one `.ann` per document; written atomically, once every document is predicted.
`read_span_body` reads a text held in memory as `read_span_inputs` reads a file (`biodistil serve`'s request bodies).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from itertools import islice
from pathlib import Path

from biodistil.documents.model import SpanDocument
from biodistil.documents.readers import read_span_documents, read_span_text
from biodistil.documents.writers import write_span_documents
from biodistil.errors import BiodistilError
from biodistil.export.predict import Predictor


def read_span_inputs(sources: Sequence[str], format_name: str) -> list[SpanDocument]:
    """The documents of span-format inputs, without their spans; brat: every `.txt` of a folder (or the file)."""
    documents: list[SpanDocument] = []
    for source in sources:
        path = Path(source)
        if format_name == "brat":
            documents.extend(_brat_texts(path))
        else:
            documents.extend(document.with_spans([]) for document in read_span_documents(format_name, path))
    return unique_ids(documents)


def read_span_body(text: str, format_name: str, source: str = "body") -> list[SpanDocument]:
    """The documents of a text in a span format held in memory (`biodistil serve`'s request body), read as
    `read_span_inputs` reads a file of it (their spans checked, then left out); a brat body is one document's `.txt`.
    Errors name `source` and the line (BioC: the document and annotation)."""
    if format_name == "brat":
        return [SpanDocument("0", text, source=source)]
    return unique_ids([document.with_spans([]) for document in read_span_text(format_name, text, source)])


def unique_ids(documents: list[SpanDocument]) -> list[SpanDocument]:
    """The documents, refused when two share an id (predicted documents are written by id)."""
    ids = [document.id for document in documents]
    if len(set(ids)) != len(ids):
        raise BiodistilError(f"two input documents share an id ({sorted({i for i in ids if ids.count(i) > 1})[:3]}); "
                             "predicted documents are written by id")
    return documents


def _brat_texts(path: Path) -> list[SpanDocument]:
    from biodistil.documents.readers import text_file

    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path] if path.suffix == ".txt" else []
    if not files:
        raise BiodistilError(f"{path}: no .txt files (--format brat predicts a folder of NAME.txt documents)")
    return [SpanDocument(file.stem, text_file(file), source=str(file)) for file in files]


def write_span_predictions(predictor: Predictor, documents: Sequence[SpanDocument], out: str, format_name: str,
                           chunk: int = 256) -> str:
    """Predict the documents a chunk at a time, write them in `format_name` to `out`; returns the closing line."""
    if out == "-":
        raise BiodistilError(f"--format {format_name} writes a {'folder' if format_name == 'brat' else 'file'}; give "
                             "--out a path")
    started = time.perf_counter()
    predicted: list[SpanDocument] = []
    iterator = iter(documents)
    while batch := list(islice(iterator, chunk)):
        predicted.extend(predictor.predict_documents(batch))
        print(f"\r{len(predicted):,} documents predicted", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    write_span_documents(format_name, predicted, out)
    seconds = time.perf_counter() - started
    entities = sum(len(document.spans) for document in predicted)
    return (f"Predicted {len(predicted):,} documents ({entities:,} entities) in {seconds:.1f} s "
            f"({len(predicted) / max(seconds, 1e-9):,.1f} records/s) with {predictor.description}; wrote {out} "
            f"({format_name})")
