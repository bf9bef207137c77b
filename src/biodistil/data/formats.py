"""Readers for biomedical task files, returning plain records.

Two record types cover every task:

* `TokenExample` — one sentence of a token-classification task (NER, PICO): words and their tags.
* `TextExample` — one sentence, sentence pair or document of a classification task; `label` is a string
  (single label), a list of 0/1 ints (multi-label, e.g. HoC) or None (unlabelled file).

Every reader works on any file of its format, and every malformed line raises `BiodistilError` with
`file:line: what was wrong (expected ...)`. `read_examples(format_name, path, **options)` dispatches on the
format names in `READERS`.
"""

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError

Label = str | list[int] | None

# BLURB NER files on the hub store tags as class ids of ["O", "B", "I"].
DEFAULT_TAG_NAMES: tuple[str, ...] = ("O", "B", "I")
# IOB/IOBES tags, bare ("B") or typed ("B-Disease").
_TAG_RE = re.compile(r"^(O|[BIES](-\S+)?)$")


@dataclass
class TokenExample:
    """A sentence of a token-classification task: `tokens[i]` carries tag `tags[i]`."""

    id: str
    tokens: list[str]
    tags: list[str]


@dataclass
class TextExample:
    """A text (or text pair) with a class label, a multi-label 0/1 vector, or None when unlabelled."""

    id: str
    text: str
    text_pair: str | None
    label: Label


Example = TokenExample | TextExample


# ----------------------------------------------------------------------------------------------- helpers


def _error(path: Path | str, line: int | None, message: str) -> BiodistilError:
    where = f"{path}:{line}" if line is not None else str(path)
    return BiodistilError(f"{where}: {message}")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) pairs; only '\\n' ends a line, a trailing '\\r' (CRLF) and a BOM are dropped."""
    path = Path(path)
    if not path.is_file():
        raise BiodistilError(f"{path}: file not found (expected a task data file)")
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise _error(
                    path, number, f"not valid UTF-8 ({err.reason}); expected a UTF-8 text file"
                ) from None
            if number == 1:
                text = text.removeprefix("\ufeff")
            yield number, text.rstrip("\n").removesuffix("\r")


def text_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) pairs of a text held in memory (a request's body), as `_lines` reads a file's: only '\\n'
    ends a line, a trailing '\\r' and a BOM are dropped."""
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":  # a final newline ends the last line; it starts none
        lines.pop()
    for number, line in enumerate(lines, start=1):
        yield number, line.removesuffix("\r")


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file."""
    return json_objects(_lines(path), path)


def json_objects(lines: Iterator[tuple[int, str]], path: Path | str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of `lines`, a JSON-lines text that `path` names in errors."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise _error(
                path, number, f"invalid JSON ({err.msg}); expected one JSON object per line"
            ) from None
        if not isinstance(obj, dict):
            raise _error(path, number, f"expected a JSON object per line, got {type(obj).__name__}")
        yield number, obj


numbered_lines = _lines  # for the span readers of `biodistil.documents`
numbered_json_lines = _json_lines


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], path: Path, line: int) -> Any:
    """obj[name], checked to be of `kind`."""
    if name not in obj:
        raise _error(path, line, f"missing field '{name}' (fields present: {sorted(obj)})")
    value = obj[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        names = " or ".join(k.__name__ for k in _as_tuple(kind))
        raise _error(
            path, line, f"field '{name}' should be {names}, got {type(value).__name__}: {value!r:.60}"
        )
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _check_tag(tag: str, path: Path, line: int) -> str:
    if not _TAG_RE.match(tag):
        raise _error(
            path, line, f"unknown tag format {tag!r}; expected O, B, I or B-TYPE / I-TYPE (IOB tags)"
        )
    return tag


def _example_id(obj: dict[str, Any], index: int) -> str:
    value = obj.get("id")
    return str(index) if value is None else str(value)


def _tsv_fields(line: str, count: int, path: Path, number: int, expected: str) -> list[str]:
    fields = line.split("\t")
    if len(fields) != count:
        raise _error(
            path, number, f"found {len(fields)} tab-separated field(s); expected {count}: {expected}"
        )
    return fields


# ------------------------------------------------------------------------------------------ NER readers


def read_biobert_ner_tsv(path: str | Path, validate_tags: bool = True) -> list[TokenExample]:
    """BioBERT NER TSV: `token<TAB>tag` lines, a blank line between sentences (CRLF, trailing blanks ok)."""
    path = Path(path)
    examples: list[TokenExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    for number, line in _lines(path):
        if not line.strip():
            if tokens:
                examples.append(TokenExample(str(len(examples)), tokens, tags))
                tokens, tags = [], []
            continue
        token, tag = _tsv_fields(line, 2, path, number, "token<TAB>tag, or a blank line between sentences")
        tag = tag.strip()
        if not token.strip() or not tag:
            raise _error(path, number, "empty token or tag; expected token<TAB>tag")
        tokens.append(token)
        tags.append(_check_tag(tag, path, number) if validate_tags else tag)
    if tokens:
        examples.append(TokenExample(str(len(examples)), tokens, tags))
    return examples


def _tag_string(tag: Any, tag_names: tuple[str, ...] | list[str], path: Path, line: int) -> str:
    if isinstance(tag, bool) or not isinstance(tag, str | int):
        raise _error(path, line, f"tag {tag!r} should be a string or an int class id")
    if isinstance(tag, int):
        if not 0 <= tag < len(tag_names):
            raise _error(
                path, line, f"tag id {tag} out of range; expected 0..{len(tag_names) - 1} {list(tag_names)}"
            )
        return tag_names[tag]
    return tag


def parse_ner_record(
    obj: dict[str, Any],
    index: int,
    path: Path,
    line: int,
    tag_names: tuple[str, ...] | list[str] = DEFAULT_TAG_NAMES,
    validate_tags: bool = True,
) -> TokenExample:
    """One BLURB NER object `{"tokens": [...], "ner_tags": [...], "id"?}` → TokenExample."""
    tokens = _field(obj, "tokens", list, path, line)
    raw_tags = _field(obj, "ner_tags", list, path, line)
    if len(tokens) != len(raw_tags):
        raise _error(
            path, line, f"{len(tokens)} tokens but {len(raw_tags)} ner_tags; expected one tag per token"
        )
    if not all(isinstance(t, str) for t in tokens):
        raise _error(path, line, "field 'tokens' should be a list of strings")
    tags = [_tag_string(t, tag_names, path, line) for t in raw_tags]
    if validate_tags:
        tags = [_check_tag(t, path, line) for t in tags]
    return TokenExample(_example_id(obj, index), list(tokens), tags)


def read_blurb_ner_jsonl(
    path: str | Path,
    tag_names: tuple[str, ...] | list[str] = DEFAULT_TAG_NAMES,
    validate_tags: bool = True,
) -> list[TokenExample]:
    """BLURB NER JSON lines; tags are strings or int ids into `tag_names` (default O, B, I); ids optional."""
    path = Path(path)
    return [
        parse_ner_record(obj, index, path, number, tag_names, validate_tags)
        for index, (number, obj) in enumerate(_json_lines(path))
    ]


# ---------------------------------------------------------------------------------------- text readers


def _label_value(value: Any, path: Path, line: int) -> Label:
    """str/int → str, bool → "yes"/"no", list of 0/1 (or bools) → list[int]."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str | int):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, int | bool) and int(v) in (0, 1) for v in value):
        return [int(v) for v in value]
    raise _error(path, line, f"label {value!r:.60} should be a string, an int or a list of 0/1 values")


def _text(obj: dict[str, Any], name: str, path: Path, line: int) -> str:
    return _field(obj, name, str, path, line)


def parse_text_record(
    obj: dict[str, Any],
    index: int,
    path: Path,
    line: int,
    text_field: str | None = None,
    pair_field: str | None = None,
    label_field: str = "label",
    require_label: bool = True,
) -> TextExample:
    """One BLURB object → TextExample; by default `sentence`, or `sentence1` + `sentence2` for pairs."""
    if text_field is None:
        text_field, pair_field = (
            ("sentence1", "sentence2") if "sentence1" in obj else ("sentence", pair_field)
        )
    text = _text(obj, text_field, path, line)
    pair = _text(obj, pair_field, path, line) if pair_field else None
    label: Label = None
    if label_field in obj:
        label = _label_value(obj[label_field], path, line)
    elif require_label:
        raise _error(path, line, f"missing field '{label_field}' (fields present: {sorted(obj)})")
    return TextExample(_example_id(obj, index), text, pair, label)


def read_blurb_jsonl(
    path: str | Path,
    text_field: str | None = None,
    pair_field: str | None = None,
    label_field: str = "label",
    require_label: bool = True,
) -> list[TextExample]:
    """BLURB sentence / sentence-pair JSON lines (`sentence` or `sentence1`/`sentence2`, `label`, `id`)."""
    path = Path(path)
    return [
        parse_text_record(obj, index, path, number, text_field, pair_field, label_field, require_label)
        for index, (number, obj) in enumerate(_json_lines(path))
    ]


_RE_HEADERS = {("index", "sentence", "label"): True, ("index", "sentence"): False}


def read_biobert_re_tsv(path: str | Path) -> list[TextExample]:
    """BioBERT RE TSV: `sentence<TAB>label` (train, no header) or `index<TAB>sentence<TAB>label` (test).

    The header is detected on the first line; a file with header `index<TAB>sentence` is read unlabelled.
    """
    path = Path(path)
    examples: list[TextExample] = []
    header: tuple[str, ...] | None = None
    for number, line in _lines(path):
        if not line.strip():
            continue
        if number == 1 and tuple(f.strip().lower() for f in line.split("\t")) in _RE_HEADERS:
            header = tuple(f.strip().lower() for f in line.split("\t"))
            continue
        examples.append(_re_row(line, header, path, number, len(examples)))
    return examples


def _re_row(line: str, header: tuple[str, ...] | None, path: Path, number: int, index: int) -> TextExample:
    if header is None:
        sentence, label = _tsv_fields(line, 2, path, number, "sentence<TAB>label (no header)")
        return TextExample(str(index), sentence, None, _nonempty_label(label, path, number))
    fields = _tsv_fields(line, len(header), path, number, "<TAB>".join(header) + " (as in the header)")
    label = _nonempty_label(fields[2], path, number) if len(fields) == 3 else None
    return TextExample(fields[0].strip(), fields[1], None, label)


def _nonempty_label(label: str, path: Path, number: int) -> str:
    label = label.strip()
    if not label:
        raise _error(path, number, "empty label; expected a class label in the last column")
    return label


def read_blue_tsv(
    path: str | Path,
    text_column: str = "sentence",
    pair_column: str | None = None,
    label_column: str | None = "label",
    id_column: str | None = None,
) -> list[TextExample]:
    """BLUE-style TSV whose first row names the columns; which column is text / pair / label is configurable.

    Ids come from `id_column`, else an `index` column when present, else the row number (0-based).
    """
    path = Path(path)
    lines = _lines(path)
    header = _blue_header(path, lines)
    wanted = {"text_column": text_column, "pair_column": pair_column, "label_column": label_column}
    if id_column is None and "index" in header:
        id_column = "index"
    wanted["id_column"] = id_column
    for option, name in wanted.items():
        if name is not None and name not in header:
            raise _error(path, 1, f"header has no column '{name}' ({option}); columns are {header}")
    position = {name: header.index(name) for name in wanted.values() if name is not None}
    examples: list[TextExample] = []
    for number, line in lines:
        if line.strip():
            fields = _tsv_fields(
                line, len(header), path, number, "one field per header column " + str(header)
            )
            examples.append(_blue_row(fields, position, wanted, path, number, len(examples)))
    return examples


def _blue_header(path: Path, lines: Iterator[tuple[int, str]]) -> list[str]:
    for number, line in lines:
        if line.strip():
            if number != 1:
                raise _error(path, number, "blank line before the header; expected a header row on line 1")
            return [f.strip() for f in line.split("\t")]
    raise _error(path, None, "empty file; expected a header row naming the columns, then one row per example")


def _blue_row(
    fields: list[str],
    position: dict[str, int],
    wanted: dict[str, str | None],
    path: Path,
    number: int,
    index: int,
) -> TextExample:
    def get(option: str) -> str | None:
        name = wanted[option]
        return None if name is None else fields[position[name]]

    label = get("label_column")
    return TextExample(
        id=(get("id_column") or str(index)).strip(),
        text=get("text_column") or "",
        text_pair=get("pair_column"),
        label=None if label is None else _nonempty_label(label, path, number),
    )


# ------------------------------------------------------------------------------------------ QA readers


def _line_of(text: str, needle: str) -> int | None:
    """1-based line of the first occurrence of needle in text, or None."""
    at = text.find(needle)
    return None if at < 0 else text.count("\n", 0, at) + 1


def read_pubmedqa_json(path: str | Path, join_contexts: str = " ") -> list[TextExample]:
    """PubMedQA `ori_pqal.json`: {PMID: {QUESTION, CONTEXTS: [...], final_decision}} → question/context.

    Errors inside an item name the line where that PMID's entry starts.
    """
    path = Path(path)
    text = "\n".join(line for _, line in _lines(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise _error(
            path, err.lineno, f"invalid JSON ({err.msg}); expected one JSON object keyed by PMID"
        ) from None
    if not isinstance(data, dict):
        raise _error(path, 1, f"expected a JSON object keyed by PMID, got {type(data).__name__}")
    return [
        _pubmedqa_item(pmid, item, path, _line_of(text, f'"{pmid}"'), join_contexts)
        for pmid, item in data.items()
    ]


def _pubmedqa_item(pmid: str, item: Any, path: Path, line: int | None, join_contexts: str) -> TextExample:
    if not isinstance(item, dict):
        raise _error(path, line, f"entry {pmid} should be an object with QUESTION, CONTEXTS, final_decision")
    question = _field(item, "QUESTION", str, path, line)
    contexts = _field(item, "CONTEXTS", list, path, line)
    if not all(isinstance(c, str) for c in contexts):
        raise _error(path, line, f"entry {pmid}: CONTEXTS should be a list of strings")
    decision = _field(item, "final_decision", str, path, line)
    if decision not in ("yes", "no", "maybe"):
        raise _error(path, line, f"entry {pmid}: final_decision {decision!r}; expected yes, no or maybe")
    return TextExample(str(pmid), question, join_contexts.join(contexts), decision)


def read_boolq_jsonl(
    path: str | Path, require_passage: bool = True, prepend_title: bool = False
) -> list[TextExample]:
    """BoolQ JSON lines `{question, passage, answer: bool, title?}` → (question, passage, "yes"/"no").

    `require_passage=False` reads question-only files (text_pair None); `prepend_title`: "title: passage".
    """
    path = Path(path)
    examples = []
    for index, (number, obj) in enumerate(_json_lines(path)):
        question = _text(obj, "question", path, number)
        answer = _field(obj, "answer", bool, path, number)
        passage = _text(obj, "passage", path, number) if require_passage or "passage" in obj else None
        if passage is not None and prepend_title and obj.get("title"):
            passage = f"{obj['title']}: {passage}"
        examples.append(TextExample(_example_id(obj, index), question, passage, "yes" if answer else "no"))
    return examples


# ------------------------------------------------------------------------------------------- dispatcher

READERS: dict[str, Callable[..., list[Any]]] = {
    "biobert_ner_tsv": read_biobert_ner_tsv,
    "blurb_ner_jsonl": read_blurb_ner_jsonl,
    "blurb_jsonl": read_blurb_jsonl,
    "biobert_re_tsv": read_biobert_re_tsv,
    "blue_tsv": read_blue_tsv,
    "pubmedqa_json": read_pubmedqa_json,
    "boolq_jsonl": read_boolq_jsonl,
}

TOKEN_FORMATS = frozenset({"biobert_ner_tsv", "blurb_ner_jsonl"})


def reader_options(format_name: str) -> list[str]:
    """The keyword options a format's reader accepts."""
    return list(inspect.signature(_reader(format_name)).parameters)[1:]


def _reader(format_name: str) -> Callable[..., list[Any]]:
    if format_name not in READERS:
        raise BiodistilError(
            f"Unknown data format '{format_name}'; known formats: {', '.join(sorted(READERS))}"
        )
    return READERS[format_name]


def read_examples(
    format_name: str, path: str | Path, **options: Any
) -> list[TokenExample] | list[TextExample]:
    """Read a task file of the named format; options go to that format's reader (see `reader_options`)."""
    reader = _reader(format_name)
    unknown = sorted(set(options) - set(reader_options(format_name)))
    if unknown:
        raise BiodistilError(
            f"Format '{format_name}' has no option(s) {unknown}; it accepts {reader_options(format_name)}"
        )
    key = tuple(sorted((name, tuple(v) if isinstance(v, list) else v) for name, v in options.items()))
    try:
        hash(key)
    except TypeError:
        return reader(Path(path), **options)
    return list(_read_cached(format_name, Path(path).resolve(), _file_stamp(path), key))


def _file_stamp(path: str | Path) -> tuple[int, int]:
    """(modification time, size) of a task file: a file written again is read again."""
    try:
        stat = Path(path).stat()
    except OSError:
        return (-1, -1)  # the reader names the missing file
    return (stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_cached(format_name: str, path: Path, stamp: tuple[int, int],
                 options: tuple[tuple[str, Any], ...]) -> tuple[TokenExample | TextExample, ...]:
    """One parse per file version and process: a study or an evaluation reads the same splits for every model, seed
    and arm. The examples are shared between callers, which only read them (`read_examples` hands out new lists)."""
    return tuple(_reader(format_name)(path, **dict(options)))


EXAMPLES_FINGERPRINT_VERSION = 1


def fingerprint_examples(examples: Sequence[Example], labels: bool = True) -> str:
    """sha256 of the examples' content (inputs and labels, in order): a transfer set's identity. Without
    `labels`, of the inputs alone (what a teacher's outputs depend on)."""
    digest = hashlib.sha256(f"transfer-v{EXAMPLES_FINGERPRINT_VERSION}{'' if labels else '-inputs'}".encode())
    for example in examples:
        fields = (example.tokens, example.tags if labels else None) if isinstance(example, TokenExample) else (
            example.text, example.text_pair, example.label if labels else None)
        digest.update(json.dumps(fields, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()
