"""Run a student on documents: `Predictor` (the Python API) and the readers and writer of `biodistil predict`.

    from biodistil import Predictor
    predictor = Predictor("runs/ner-student/onnx")        # a model folder, an ONNX export folder or one .onnx file
    predictor(["BRCA1 mutations cause breast cancer."])   # -> [{"id": "0", "entities": [{start, end, text, ...}]}]

The same code path as `evaluate --finetuned`: the task is the model's own (its head and labels), documents go through
the task encoding (token tasks: words, windows of whole words for long documents, the label of each word's first
sub-word) and `tasks.prediction.predict`, batched by length; the model's head and labels say how
(`tasks.encoding.EncodingSpec`). Token classifiers return entities with character offsets into the original text
(seqeval's strict IOB2: an entity is a B tag and the I tags of its type that follow; its score is the mean of its
words' tag probabilities); classifiers return the label and every class's probability (multi-label: the
labels over the threshold). Annotated documents (`biodistil.documents`: brat, PubTator, BioC, span JSON lines) go
through `Predictor.predict_documents`: split into sentences and words as a span task's training data is
(`documents.alignment.tag_documents`), and back to spans with character offsets into each document's text;
`write_span_predictions` writes them in the format they came in.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

import torch

from biodistil.data.formats import Example, TextExample, TokenExample
from biodistil.documents.alignment import documents_from_tags, entity_spans, tag_documents
from biodistil.documents.model import SpanDocument
from biodistil.errors import BiodistilError
from biodistil.export.deployed import Deployed, expand_models, load_deployed
from biodistil.models.families import position_limit
from biodistil.tasks.encoding import EncodingSpec, collator_for, encode_inputs
from biodistil.tasks.prediction import Fallback, predict
from biodistil.tasks.registry import TaskKind
from biodistil.training.machine import BF16_FLAGS, bf16_fast

WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)  # a word: a run of letters/digits, or one other visible character
RUNTIMES = ("auto", "pytorch", "pytorch-bf16", "onnx", "onnx-int8")
__all__ = ["Document", "Predictor", "entity_spans", "read_documents", "write_predictions"]


@dataclass(frozen=True)
class Document:
    """One input record: its id, its text and, for pair classifiers, the second text; `words`: a pre-tokenised
    document's words (a task file's sentence), its text their single-space join, used as they are instead of being
    split again."""

    id: str
    text: str
    text_pair: str | None = None
    words: tuple[str, ...] | None = None

    @classmethod
    def of(cls, example: Example) -> Document:
        """A task file's example as a document: a sentence keeps its words, a text (pair) its texts."""
        if isinstance(example, TokenExample):
            return cls(example.id, " ".join(example.tokens), words=tuple(example.tokens))
        return cls(example.id, example.text, example.text_pair)

    def word_spans(self) -> list[tuple[int, int]]:
        """(start, end) of each word in the text."""
        if self.words is None:
            return [(m.start(), m.end()) for m in WORD.finditer(self.text)]
        spans, start = [], 0
        for word in self.words:
            spans.append((start, start + len(word)))
            start += len(word) + 1
        return spans


def choose_variant(path: str | Path, runtime: str = "auto") -> Deployed:
    """The deployed variant of `path` to run: `auto` is the fastest the folder holds (an export's int8 graph, else
    its fp32 graph; a model folder's PyTorch weights, in float32); `pytorch-bf16` runs a model folder's weights
    under bf16 autocast."""
    if runtime not in RUNTIMES:
        raise BiodistilError(f"--runtime {runtime}: expected one of {', '.join(RUNTIMES)}")
    variants = expand_models([(None, str(path))])
    wanted = {"pytorch": ("pytorch", "fp32"), "pytorch-bf16": ("pytorch", "fp32"), "onnx": ("onnxruntime", "fp32"),
              "onnx-int8": ("onnxruntime", "int8")}
    if runtime == "auto":
        order = [("onnxruntime", "int8"), ("onnxruntime", "fp32"), ("pytorch", "fp32")]
        return min(variants, key=lambda v: order.index((v.runtime, v.precision)))
    for variant in variants:
        if (variant.runtime, variant.precision) == wanted[runtime]:
            return replace(variant, precision="bf16") if runtime == "pytorch-bf16" else variant
    held = ", ".join(f"{v.runtime} {v.precision}" for v in variants)
    raise BiodistilError(f"{path} holds no {runtime} model (it holds: {held}); choose --runtime accordingly")


class Predictor:
    """A fine-tuned classifier (PyTorch or ONNX) that labels documents; `predictor(texts)` returns one record each."""

    def __init__(self, model: str | Path, runtime: str = "auto", batch_size: int = 64, threshold: float = 0.5,
                 threads: int | None = None, max_length: int | None = None, device: str = "auto",
                 int8_fallback: float | None = None, max_padding: float | None = None):
        """`device`: where a PyTorch model runs, as `train.device` names one (auto: a CUDA GPU when one is visible);
        ONNX graphs run on the CPU. `runtime="pytorch-bf16"`: a PyTorch model under bf16 autocast, which a CPU
        without native bf16 (`training.machine.cpu_bf16_fast`) only emulates, more slowly than float32: said on
        stderr. `int8_fallback`: with an int8 graph, the windows whose `decision_margin` is under this are predicted
        again by the export's fp32 graph. `max_padding`: a batch of windows (sorted by length) also ends before its
        padding would pass this share of its positions (`tasks.prediction.length_batches`)."""
        if batch_size < 1 or (max_length is not None and max_length < 1):
            raise BiodistilError(f"batch_size {batch_size}, max_length {max_length}: expected whole numbers of 1 or "
                                 "more (max_length None: the model's own)")
        if max_padding is not None and not 0 <= max_padding <= 1:
            raise BiodistilError(f"max_padding {max_padding}: expected a share from 0 to 1 (1: no limit)")
        self.variant = choose_variant(model, runtime)
        self.model, self.tokenizer, head = load_deployed(self.variant, threads, device)
        self.autocast = torch.bfloat16 if self.variant.precision == "bf16" else None
        if self.autocast is not None and not bf16_fast(self.model.device):
            print(f"--runtime pytorch-bf16: {self.model.device.type} has no native bf16 (a CPU needs "
                  f"{' or '.join(BF16_FLAGS)}), so bf16 is emulated and slower than --runtime pytorch",
                  file=sys.stderr, flush=True)
        self.fallback = self._fallback(model, int8_fallback, threads) if int8_fallback is not None else None
        if head not in get_args(TaskKind):
            raise BiodistilError(f"{model}: a {head.replace('_', ' ')} has no task head to predict with; give a model "
                                 "fine-tuned on a task (`biodistil finetune` or `kd`), or its ONNX export")
        config = self.model.config
        labels = [str(config.id2label[i]) for i in range(len(config.id2label))]
        limit = min(int(getattr(self.tokenizer, "model_max_length", 512) or 512), 512,
                    position_limit(config))
        length = min(max_length or recorded_max_length(Path(model)) or limit, limit)
        self.encoding = EncodingSpec(head, tuple(labels), length,
                                     "split" if head == "token_classification" else "truncate")
        self.batch_size, self.threshold, self.max_padding = batch_size, threshold, max_padding

    def _fallback(self, model: str | Path, margin: float, threads: int | None) -> Fallback:
        if self.variant.precision != "int8":
            raise BiodistilError(f"--int8-fallback {margin}: {self.variant.path} is a {self.variant.runtime} "
                                 f"{self.variant.precision} model; the fallback backs an int8 graph (--runtime "
                                 "onnx-int8 or auto on an export folder)")
        if not 0 < margin <= 1:
            raise BiodistilError(f"--int8-fallback {margin}: expected a probability gap in (0, 1], e.g. 0.1")
        try:
            fp32, _, _ = load_deployed(choose_variant(model, "onnx"), threads)
        except BiodistilError as error:
            raise BiodistilError(f"--int8-fallback needs the export's fp32 graph beside its int8 one: {error}") \
                from None
        return Fallback(fp32, margin)

    @property
    def description(self) -> str:
        where = f" on {self.model.device.type}" if self.variant.runtime == "pytorch" else ""
        variant = self.variant
        described = f"{variant.path} ({variant.runtime} {variant.precision}{where}, {self.encoding.kind})"
        if self.fallback is not None:
            share = self.fallback.rerun / max(self.fallback.windows, 1)
            described += (f"; {self.fallback.rerun:,} of {self.fallback.windows:,} windows ({share:.1%}) predicted "
                          f"again by the fp32 graph (decision margin under {self.fallback.margin:g})")
        return described

    def __call__(self, texts: Sequence[str | tuple[str, str] | Document]) -> list[dict[str, Any]]:
        """One record per input: `{"id", "entities": [...]}` for a token classifier, `{"id", "label",
        "probabilities"}` for a classifier (`"labels"` for a multi-label one)."""
        documents = [_document(str(index), text) for index, text in enumerate(texts)]
        if self.encoding.kind == "token_classification":
            return self._entities(documents)
        return self._labels(documents)

    def _entities(self, documents: Sequence[Document]) -> list[dict[str, Any]]:
        spans = [d.word_spans() for d in documents]
        examples: list[Example] = [TokenExample(d.id, [d.text[a:b] for a, b in words], [])
                                   for d, words in zip(documents, spans, strict=True)]  # no tags: unlabelled
        predictions = self._predict(examples)
        records = []
        for document, words, tags, scores in zip(documents, spans, predictions.labels, predictions.word_scores or [],
                                                 strict=True):
            entities = [{"start": words[first][0], "end": words[last][1],
                         "text": document.text[words[first][0]:words[last][1]], "label": label,
                         "score": round(sum(scores[first:last + 1]) / (last - first + 1), 4)}
                        for first, last, label in entity_spans(tags)]
            records.append({"id": document.id, "entities": entities})
        return records

    def predict_documents(self, documents: Sequence[SpanDocument]) -> list[SpanDocument]:
        """Each document with the entities the model finds (its own spans are not read): sentences and words as a
        span task's training data has them, tags back to [start, end) character offsets into the document's text."""
        if self.encoding.kind != "token_classification":
            raise BiodistilError(f"{self.variant.path} is a {self.encoding.kind.replace('_', ' ')} model; annotated "
                                 "documents are predicted by a token classifier")
        bare = [document.with_spans([]) for document in documents]
        examples, _ = tag_documents(bare)
        tags = self._predict(examples).labels if examples else []
        return documents_from_tags(bare, examples, tags)

    def _labels(self, documents: Sequence[Document]) -> list[dict[str, Any]]:
        examples: list[Example] = [TextExample(d.id, d.text, d.text_pair, None) for d in documents]
        predictions = self._predict(examples)
        records = []
        for document, probabilities in zip(documents, predictions.scores, strict=True):
            named = {label: round(p, 6) for label, p in zip(self.encoding.labels, probabilities, strict=True)}
            if self.encoding.kind == "multilabel_classification":  # chosen on the unrounded probabilities
                chosen: dict[str, Any] = {"labels": [label for label, p in zip(self.encoding.labels, probabilities,
                                                                               strict=True) if p > self.threshold]}
            else:
                chosen = {"label": self.encoding.labels[max(range(len(probabilities)), key=probabilities.__getitem__)]}
            records.append({"id": document.id, **chosen, "probabilities": named})
        return records

    def _predict(self, examples: Sequence[Example]):
        encoded = encode_inputs(self.encoding, examples, self.tokenizer)
        return predict(self.model, self.encoding, examples, encoded, collator_for(self.encoding, self.tokenizer),
                       self.batch_size, self.fallback, self.autocast, self.max_padding)


def recorded_max_length(model: Path) -> int | None:
    """The window length the model was fine-tuned and scored with: its run's `task.max_length`, else its task's (from
    the run folder's config.yaml beside model/, or an ONNX export's source model's run); None without a record."""
    from biodistil.export.deployed import recorded_task

    task = recorded_task(model)
    if not task:
        return None
    if task.get("max_length"):
        return int(task["max_length"])
    try:
        from biodistil.tasks.registry import get_task

        return get_task(task["name"]).max_length if task.get("name") else None
    except BiodistilError:
        return None


def _document(default_id: str, value: str | tuple[str, str] | Document) -> Document:
    if isinstance(value, Document):
        return value
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(text, str) for text in value):
        return Document(default_id, value[0], value[1])
    if not isinstance(value, str):
        raise TypeError(f"input {default_id}: expected a text (str), a pair of texts (str, str) or a Document, got "
                        f"{type(value).__name__} {value!r:.60}")
    return Document(default_id, value)


# ------------------------------------------------------------------------------------------ inputs


def read_documents(sources: Sequence[str], text_field: str = "text", pair_field: str | None = None,
                   id_field: str = "id", whole_files: bool = False, stdin: Iterable[str] | None = None,
                   task_format: str | None = None) -> Iterator[Document]:
    """The documents of the inputs, in order: plain text files (a document per non-blank line, or the whole file
    with `whole_files`), folders of .txt files, JSON-lines files (`.jsonl`/`.json`: `text_field`, optionally
    `pair_field` and `id_field`), or `-` for standard input (lines, or JSON lines when they start with `{`); with
    `task_format`, files of a task format biodistil reads (`biobert_ner_tsv`, `blurb_jsonl`, ...: their sentences,
    pre-tokenised ones kept as their words; their labels unused). Ids default to `FILE:LINE` (or the file name for
    whole files; a task file's own example ids). A bad record is an error naming file and line."""
    if task_format is not None:
        yield from _task_documents(sources, task_format)
        return
    for source in sources:
        if source == "-":
            yield from _lines("<stdin>", stdin if stdin is not None else _stdin(), text_field, pair_field, id_field)
            continue
        path = Path(source)
        if path.is_dir():
            files = sorted(path.rglob("*.txt"))
            if not files:
                raise BiodistilError(f"{path}: a folder with no .txt files to predict on")
        elif path.is_file():
            files = [path]
        else:
            raise BiodistilError(f"{path}: no such file or folder")
        for file in files:
            if whole_files and file.suffix not in (".jsonl", ".json"):
                yield Document(str(file), _read(file))
                continue
            with file.open(encoding="utf-8", errors="strict") as handle:
                yield from _lines(str(file), _decoded(handle, file), text_field, pair_field, id_field,
                                  json_lines=file.suffix in (".jsonl", ".json"))


def _task_documents(sources: Sequence[str], task_format: str) -> Iterator[Document]:
    """The sentences of task files (`read_examples`: the format's own reader and its errors, naming file and line)."""
    from biodistil.data.formats import read_examples

    for source in sources:
        if not Path(source).is_file():
            raise BiodistilError(f"{source}: no such file (with --format {task_format}, give the task's files)")
        yield from map(Document.of, read_examples(task_format, source))


def _lines(name: str, lines: Iterable[str], text_field: str, pair_field: str | None, id_field: str,
           json_lines: bool | None = None) -> Iterator[Document]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        is_json = json_lines if json_lines is not None else line.lstrip().startswith("{")
        if not is_json:
            yield Document(f"{name}:{number}", line.rstrip("\r\n"))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise BiodistilError(f"{name}:{number}: not a JSON record ({err.msg}); expected one object per line") \
                from None
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            raise BiodistilError(f"{name}:{number}: no text field '{text_field}' (a string) in this record; choose "
                                 "the field with --text-field")
        pair = None
        if pair_field is not None:
            if not isinstance(record.get(pair_field), str):
                raise BiodistilError(f"{name}:{number}: no pair field '{pair_field}' (a string) in this record")
            pair = record[pair_field]
        yield Document(str(record.get(id_field, f"{name}:{number}")), record[text_field], pair)


def _decoded(handle, path: Path) -> Iterator[str]:
    try:
        yield from handle
    except UnicodeDecodeError as err:
        raise BiodistilError(f"{path}: bytes that are not UTF-8 text (byte {err.start} of a line); convert the "
                             "file to UTF-8") from None


def _read(path: Path) -> str:
    from biodistil.io import read_text

    return read_text(path, "document", "convert the file to UTF-8 text")


def _stdin() -> Iterator[str]:
    yield from sys.stdin


# ------------------------------------------------------------------------------------------ output


def write_predictions(predictor: Predictor, documents: Iterable[Document], out: str, chunk: int = 1024,
                      progress: bool = True) -> str:
    """Predict `documents` a chunk at a time and write one JSON line per record to `out` (`-`: standard output),
    atomically: a crash or Ctrl-C leaves no half-written file. Memory holds one chunk, whatever the input's size.
    Returns the closing line (records, seconds, records/s)."""
    import time
    from contextlib import nullcontext
    from itertools import islice

    from tqdm.auto import tqdm

    from biodistil.io import atomic_open

    target = None if out == "-" else Path(out)
    started, count, iterator = time.perf_counter(), 0, iter(documents)
    with nullcontext(sys.stdout) if target is None else atomic_open(target) as handle, \
            tqdm(unit="rec", disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
        while batch := list(islice(iterator, chunk)):
            for record in predictor(batch):
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += len(batch)
            bar.update(len(batch))
        handle.flush()
    seconds = time.perf_counter() - started
    return (f"Predicted {count:,} records in {seconds:.1f} s ({count / max(seconds, 1e-9):,.1f} records/s) with "
            f"{predictor.description}" + (f"; wrote {target}" if target is not None else ""))
