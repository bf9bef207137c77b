"""Readers of span-annotated documents: brat standoff, PubTator, BioC (XML and JSON) and span JSON lines.

Each returns `SpanDocument`s with character offsets into the document's text. Every reader checks each span
(offsets inside the text, fragments in order, the stated mention text against the text's slice) and names the
file and line (or document and annotation, for BioC) of whatever is wrong. A stated mention text that differs from
the slice is looked for nearby (`mention_text="relocate"`, the default: found within `NEARBY` characters, the span
moves there and the move is counted in the document's notes; not found, an error), trusted as offsets
(`"offsets"`: counted) or refused (`"error"`). Relation and event lines are left out and counted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

from biodistil.data.formats import json_objects, numbered_json_lines, numbered_lines, text_lines
from biodistil.documents.model import Passage, Span, SpanDocument
from biodistil.errors import BiodistilError

MentionPolicy = Literal["relocate", "offsets", "error"]
NEARBY = 50  # characters either side where a mention text that does not match its offsets is looked for


# ------------------------------------------------------------------------------------------------ checks


def checked_span(document: SpanDocument, span: Span, stated: str | None, policy: MentionPolicy) -> Span:
    """The span, its offsets checked against the text; a stated text that differs is handled by `policy`."""
    for start, end in span.fragments:
        if not 0 <= start < end <= len(document.text):
            raise BiodistilError(
                f"{document.where(span)}: offsets {start}-{end} of a {span.type} mention lie outside the text "
                f"(0-{len(document.text)}) or end before they start; expected [start, end) character offsets")
    ordered = sorted(span.fragments)
    if any(a[1] > b[0] for a, b in pairwise(ordered)):
        raise BiodistilError(f"{document.where(span)}: the fragments {span.fragments} of a {span.type} mention "
                             "overlap; expected separate pieces of text")
    given, span = span, Span(span.type, tuple(ordered), span.id, span.line, span.identifier)
    if stated is None or _same_text(given.text(document.text), stated):
        return span
    if policy == "offsets":
        document.notes["mention text differs from its offsets (offsets kept)"] += 1
        return span
    moved = _relocated(document.text, span, stated) if policy == "relocate" else None
    if moved is None:
        raise BiodistilError(
            f"{document.where(span)}: the {span.type} mention text {stated!r:.60} does not match the document's "
            f"text at {span.start}-{span.end} ({span.text(document.text)!r:.60})"
            + (f" nor anywhere within {NEARBY} characters" if policy == "relocate" else "")
            + "; check the offsets and the text file's encoding (reader option mention_text: offsets keeps them)")
    document.notes["mention text found a few characters away (span moved)"] += 1
    return moved


def _same_text(found: str, stated: str) -> bool:
    return found == stated or " ".join(found.split()) == " ".join(stated.split())


def _relocated(text: str, span: Span, stated: str) -> Span | None:
    """The span moved to the nearest place within NEARBY characters where its stated text stands (contiguous)."""
    if span.discontinuous:
        return None
    low = max(0, span.start - NEARBY)
    found = [m.start() for m in re.finditer(re.escape(stated), text[low:span.end + NEARBY + len(stated)])]
    if not found:
        return None
    start = low + min(found, key=lambda at: abs(low + at - span.start))
    return Span(span.type, ((start, start + len(stated)),), span.id, span.line, span.identifier)


def text_file(path: Path) -> str:
    """A whole UTF-8 text file as it is (newlines kept for offsets; a BOM dropped); bad bytes name their line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise BiodistilError(f"{path}:{line}: not valid UTF-8 ({err.reason}); expected a UTF-8 text file (a file "
                             "of mixed encodings: convert it to UTF-8)") from None


# ------------------------------------------------------------------------------------------------ brat

BRAT_KINDS = {"R": "relations", "E": "events", "A": "attributes", "M": "attributes", "N": "normalisations",
              "#": "notes", "*": "equivalences"}


def read_brat(path: str | Path, mention_text: MentionPolicy = "relocate") -> list[SpanDocument]:
    """A brat standoff folder (or one .ann file): `NAME.txt` beside `NAME.ann`; text-bound `T` lines are entities
    (`Type start end[;start end...]<TAB>text`); the triggers of events (`E` lines) and relation, event, attribute,
    normalisation and note lines are left out and counted."""
    path = Path(path)
    if path.is_file() and path.suffix == ".ann":
        files = [path]
    elif path.is_dir():
        files = sorted(path.rglob("*.ann"))
        if not files:
            raise BiodistilError(f"{path}: no .ann files (expected a brat folder of NAME.txt + NAME.ann)")
    else:
        raise BiodistilError(f"{path}: no such folder (expected a brat folder of NAME.txt + NAME.ann)")
    return [_brat_document(ann, mention_text) for ann in files]


def _brat_document(ann: Path, policy: MentionPolicy) -> SpanDocument:
    txt = ann.with_suffix(".txt")
    if not txt.is_file():
        raise BiodistilError(f"{ann}:1: no {txt.name} beside this .ann file (brat keeps each document's text in "
                             "NAME.txt next to NAME.ann)")
    document = SpanDocument(ann.stem, text_file(txt), source=str(ann))
    entities: list[tuple[Span, str]] = []
    triggers: set[str] = set()
    for number, line in numbered_lines(ann):
        if not line.strip():
            continue
        if line[0] != "T":
            document.notes[f"brat {BRAT_KINDS.get(line[0], line[0] + ' lines')} (ignored)"] += 1
            if line[0] == "E":
                triggers.add(line.split("\t")[1].split()[0].split(":")[-1] if "\t" in line else "")
            continue
        entities.append(_brat_entity(line, ann, number))
    for span, stated in entities:
        if span.id in triggers:
            document.notes["event triggers (T lines an E line names: ignored)"] += 1
            continue
        document.spans.append(checked_span(document, span, stated, policy))
    return document


def _brat_entity(line: str, ann: Path, number: int) -> tuple[Span, str]:
    fields = line.split("\t")
    try:
        kind, *places = fields[1].replace(";", " ").split(" ")
        bounds = [int(value) for value in places]
        if not bounds or len(bounds) % 2:
            raise ValueError
    except (IndexError, ValueError):
        raise BiodistilError(f"{ann}:{number}: expected `T<n><TAB>Type start end[;start end...]<TAB>text`, got "
                             f"{line!r:.80}") from None
    fragments = tuple(zip(bounds[::2], bounds[1::2], strict=True))
    return Span(kind, fragments, fields[0], number), fields[2] if len(fields) > 2 else None


# ------------------------------------------------------------------------------------------------ PubTator

_TITLE = re.compile(r"^([^|\t]+)\|([ta])\|(.*)$")


def read_pubtator(path: str | Path, mention_text: MentionPolicy = "relocate") -> list[SpanDocument]:
    """PubTator: `ID|t|title`, `ID|a|abstract`, then `ID<TAB>start<TAB>end<TAB>text<TAB>type[<TAB>identifier...]`
    lines (offsets into title + " " + abstract), a blank line between documents; relation lines
    (`ID<TAB>CID<TAB>...`) are left out and counted."""
    return pubtator_documents(numbered_lines(Path(path)), str(path), mention_text)


def pubtator_documents(lines: Iterable[tuple[int, str]], path: str, mention_text: MentionPolicy = "relocate"
                       ) -> list[SpanDocument]:
    """The documents of PubTator `lines` ((number, text) pairs); `path` names their source in errors."""
    documents: list[SpanDocument] = []
    parts: dict[str, str] = {}
    pending: list[tuple[int, list[str]]] = []
    for number, line in [*lines, (-1, "")]:
        if not line.strip():
            if parts:
                documents.append(_pubtator_document(parts, pending, path, mention_text))
            parts, pending = {}, []
            continue
        header = _TITLE.match(line)
        if header and "\t" not in line.split("|", 1)[0]:
            if pending:
                raise BiodistilError(f"{path}:{number}: a title or abstract line after mention lines; expected a "
                                     "blank line between documents")
            parts.setdefault("id", header.group(1))
            parts[header.group(2)] = header.group(3)
            continue
        if not parts:
            raise BiodistilError(f"{path}:{number}: a mention line before its document's `ID|t|title` line")
        pending.append((number, line.split("\t")))
    return documents


def _pubtator_document(parts: dict[str, str], pending: list[tuple[int, list[str]]], path: str,
                       policy: MentionPolicy) -> SpanDocument:
    title, abstract = parts.get("t", ""), parts.get("a", "")
    text = f"{title} {abstract}" if abstract else title
    passages = [Passage(0, title, "title")] + ([Passage(len(title) + 1, abstract, "abstract")] if abstract else [])
    document = SpanDocument(parts["id"], text, passages=passages, source=str(path))
    for number, fields in pending:
        if len(fields) >= 2 and not fields[1].isdigit():
            document.notes["PubTator relation lines (ignored)"] += 1
            continue
        if len(fields) < 5 or not fields[2].isdigit():
            raise BiodistilError(f"{path}:{number}: expected ID<TAB>start<TAB>end<TAB>text<TAB>type[<TAB>identifier]"
                                 f", got {len(fields)} field(s): {'<TAB>'.join(fields)!r:.80}")
        if fields[0] != document.id:
            raise BiodistilError(f"{path}:{number}: mention of document {fields[0]} inside document {document.id}")
        span = Span(fields[4], ((int(fields[1]), int(fields[2])),), "", number, fields[5] if len(fields) > 5 else "")
        document.spans.append(checked_span(document, span, fields[3], policy))
    return document


# ------------------------------------------------------------------------------------------------ BioC

OffsetUnit = Literal["auto", "characters", "bytes"]


def read_bioc(path: str | Path, offsets: OffsetUnit = "auto", mention_text: MentionPolicy = "relocate"
              ) -> list[SpanDocument]:
    """BioC XML (`.xml`) or JSON (`.json`), through the `bioc` package. A document's text is its passages placed at
    their offsets (gaps filled with spaces). `offsets="auto"` reads them as characters unless the mention texts match
    only when they are read as UTF-8 bytes (some BioC tools count bytes): then they are converted, and counted."""
    return bioc_documents(text_file(Path(path)), str(path), offsets, mention_text, Path(path).suffix == ".json")


def bioc_documents(raw: str, path: str, offsets: OffsetUnit = "auto", mention_text: MentionPolicy = "relocate",
                   json_file: bool = False) -> list[SpanDocument]:
    """The documents of a BioC collection's text (XML, or JSON when `json_file` or it starts with `{`); `path` names
    its source in errors."""
    from bioc import biocjson, biocxml

    try:
        is_json = json_file or raw.lstrip().startswith("{")
        collection = biocjson.loads(raw) if is_json else biocxml.loads(raw)
    except Exception as err:  # the bioc package raises lxml, JSON and key errors alike
        raise BiodistilError(f"{path}: not a BioC {'JSON' if is_json else 'XML'} collection ({type(err).__name__}: "
                             f"{str(err)[:160]})") from None
    return [_bioc_document(document, path, offsets, mention_text) for document in collection.documents]


def _bioc_document(item: Any, path: str, offsets: OffsetUnit, policy: MentionPolicy) -> SpanDocument:
    unit = offsets if offsets != "auto" else _bioc_unit(item)
    places = [(p.offset, p.text or "", p.infons.get("type", "")) for p in item.passages]
    if unit == "bytes":
        places = _char_places(places)
    text = ""
    passages = []
    for offset, passage_text, kind in places:
        if offset < len(text):
            raise BiodistilError(f"{path} (document {item.id}): passage at offset {offset} overlaps the one before "
                                 f"(which ends at {len(text)})")
        text += " " * (offset - len(text)) + passage_text
        passages.append(Passage(offset, passage_text, kind))
    document = SpanDocument(str(item.id), text, passages=passages, source=str(path))
    if unit == "bytes":
        document.notes["BioC offsets counted in bytes (converted to characters)"] += 1
    to_char = _byte_to_char(item) if unit == "bytes" else None
    for passage in item.passages:
        document.notes["BioC relations (ignored)"] += len(passage.relations)
        for annotation in passage.annotations:
            document.spans.append(checked_span(document, _bioc_span(annotation, to_char), annotation.text, policy))
    document.notes["BioC relations (ignored)"] += len(item.relations)
    document.notes = +document.notes
    return document


def _bioc_span(annotation: Any, to_char: Callable[[int], int] | None) -> Span:
    fragments = sorted((loc.offset, loc.offset + loc.length) for loc in annotation.locations)
    if to_char is not None:
        fragments = [(to_char(a), to_char(b)) for a, b in fragments]
    infons = annotation.infons
    kind = infons.get("type") or infons.get("Type") or ""
    identifier = infons.get("identifier") or infons.get("MESH") or ""
    return Span(kind, tuple(fragments), str(annotation.id or ""), None, identifier)


def _bioc_unit(item: Any) -> str:
    """characters, unless the annotations' texts match their offsets only when read as UTF-8 bytes."""
    chars = _matches(item, None)
    return "bytes" if chars < _matches(item, _byte_to_char(item)) else "characters"


def _matches(item: Any, to_char: Callable[[int], int] | None) -> int:
    places = [(p.offset, p.text or "", "") for p in item.passages]
    if to_char is not None:
        places = _char_places(places)
    text = ""
    for offset, passage_text, _ in places:
        text += " " * max(0, offset - len(text)) + passage_text
    count = 0
    for passage in item.passages:
        for annotation in passage.annotations:
            span = _bioc_span(annotation, to_char)
            count += span.text(text) == (annotation.text or "")
    return count


def _char_places(places: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """Passages whose offsets count UTF-8 bytes, with offsets counting characters."""
    result, chars, bytes_end = [], 0, 0
    for offset, passage_text, kind in places:
        chars += max(0, offset - bytes_end)  # the gap before a passage holds spaces: one byte, one character
        result.append((chars, passage_text, kind))
        chars += len(passage_text)
        bytes_end = offset + len(passage_text.encode("utf-8"))
    return result


def _byte_to_char(item: Any) -> Callable[[int], int]:
    """Byte offset → character offset over the document's passages (a byte inside a character maps to it)."""
    table: list[tuple[int, int]] = []  # (first byte, character) of each character
    chars = 0
    for (offset, passage_text, _), passage in zip(_char_places([(p.offset, p.text or "", "") for p in item.passages]),
                                                  item.passages, strict=True):
        chars, position = offset, passage.offset
        for character in passage_text:
            table.append((position, chars))
            position += len(character.encode("utf-8"))
            chars += 1
        table.append((position, chars))
    lookup = dict(table)
    return lambda byte: lookup.get(byte, byte)


# ------------------------------------------------------------------------------------------------ span JSON lines


def read_span_jsonl(path: str | Path, text_field: str = "text", spans_field: str = "spans",
                    start_field: str = "start", end_field: str = "end", label_field: str = "label",
                    id_field: str = "id", mention_text: MentionPolicy = "relocate") -> list[SpanDocument]:
    """Span JSON lines, `{"id", "text", "spans": [{"start", "end", "label"}]}` (Prodigy's form; doccano:
    `spans_field="entities", start_field="start_offset", end_field="end_offset"`, or spans as `[start, end, label]`
    triples with `spans_field="label"`; Label Studio's JSON-MIN: `spans_field="label", label_field="labels"`). A span
    with `fragments` ([[start, end], ...]) is discontinuous; one with `text` has it checked."""
    fields = (text_field, spans_field, start_field, end_field, label_field, id_field)
    return span_jsonl_documents(numbered_json_lines(Path(path)), str(path), fields, mention_text)


def span_jsonl_documents(records: Iterable[tuple[int, dict[str, Any]]], path: str,
                         fields: tuple[str, str, str, str, str, str] = ("text", "spans", "start", "end", "label", "id"),
                         mention_text: MentionPolicy = "relocate") -> list[SpanDocument]:
    """The documents of span JSON `records` ((line number, object) pairs); `fields`: the text, spans, start, end,
    label and id fields' names; `path` names their source in errors."""
    text_field, spans_field, start_field, end_field, label_field, id_field = fields
    documents = []
    for number, record in records:
        text = record.get(text_field)
        if not isinstance(text, str):
            raise BiodistilError(f"{path}:{number}: no text field '{text_field}' (a string); fields: {sorted(record)}")
        document = SpanDocument(str(record.get(id_field, f"{Path(path).stem}:{number}")), text, source=path)
        spans = record.get(spans_field) or []
        if not isinstance(spans, list):
            raise BiodistilError(f"{path}:{number}: field '{spans_field}' should be a list of spans")
        for value in spans:
            span, stated = _json_span(value, (start_field, end_field, label_field), path, number)
            document.spans.append(checked_span(document, span, stated, mention_text))
        documents.append(document)
    return documents


def _json_span(value: Any, fields: tuple[str, str, str], path: str, number: int) -> tuple[Span, str | None]:
    start_field, end_field, label_field = fields
    if isinstance(value, list) and len(value) == 3:
        value = dict(zip(fields, value, strict=True))
    label = value.get(label_field) if isinstance(value, dict) else None
    if isinstance(label, list) and len(label) == 1:
        label = label[0]
    start, end = (value.get(start_field), value.get(end_field)) if isinstance(value, dict) else (None, None)
    if not isinstance(label, str) or not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        raise BiodistilError(f"{path}:{number}: a span {json.dumps(value)[:80]} should hold '{start_field}' and "
                             f"'{end_field}' (whole numbers) and '{label_field}' (a type)")
    fragments = value.get("fragments") or [[start, end]]
    return Span(label, tuple((int(a), int(b)) for a, b in fragments), str(value.get("id", "")), number), \
        value.get("text")


# ------------------------------------------------------------------------------------------------ dispatch

SPAN_READERS: dict[str, Callable[..., list[SpanDocument]]] = {
    "brat": read_brat,
    "pubtator": read_pubtator,
    "bioc": read_bioc,
    "span_jsonl": read_span_jsonl,
}
SPAN_FORMATS = frozenset(SPAN_READERS)


def read_span_documents(format_name: str, path: str | Path, **options: Any) -> list[SpanDocument]:
    """The documents of a span-format file (or brat folder); options go to the format's reader."""
    if format_name not in SPAN_READERS:
        raise BiodistilError(f"Unknown span format '{format_name}'; known: {', '.join(sorted(SPAN_READERS))}")
    path = Path(path)
    if not path.exists():
        raise BiodistilError(f"{path}: no such {'folder' if format_name == 'brat' else 'file'} ({format_name})")
    return SPAN_READERS[format_name](path, **options)


def read_span_text(format_name: str, text: str, source: str) -> list[SpanDocument]:
    """The documents of a text in a span format held in memory (a request's body: PubTator, BioC XML or JSON, span
    JSON lines), read as its file would be; `source` names it in errors (`source:line: ...`). brat has no such text
    (a brat document is a `.txt` and an `.ann`)."""
    readers: dict[str, Callable[[], list[SpanDocument]]] = {
        "pubtator": lambda: pubtator_documents(text_lines(text), source),
        "bioc": lambda: bioc_documents(text, source),
        "span_jsonl": lambda: span_jsonl_documents(json_objects(text_lines(text), source), source),
    }
    if format_name not in readers:
        raise BiodistilError(f"Unknown span format '{format_name}'; known: {', '.join(sorted(readers))}")
    return readers[format_name]()


def guess_format(path: str | Path) -> str:
    """The span format a path is most likely in: a folder is brat; `.pubtator`, `.xml`/`.json` (BioC), `.jsonl`."""
    path = Path(path)
    if path.is_dir() or path.suffix == ".ann":
        return "brat"
    by_suffix = {".pubtator": "pubtator", ".xml": "bioc", ".json": "bioc", ".jsonl": "span_jsonl"}
    if path.suffix.lower() in by_suffix:
        return by_suffix[path.suffix.lower()]
    raise BiodistilError(f"{path}: cannot tell its format from its name; give --format (brat, pubtator, bioc, "
                         "span_jsonl)")
