"""A fine-tuned teacher's outputs over a transfer set, computed once and kept in the teacher store for every epoch,
arm and seed that reads them; and the teacher's test scores, kept beside them.

An entry of the teacher store (`biodistil.teachers.store`), `<root>/task-<key>/`, the key a hash of the teacher
(`teacher_fingerprint`), the transfer set's inputs (not its labels), the task encoding and the requested layers. Its
table `outputs.arrow` has one row per *teacher feature* (an example, or one window of a long token sequence):
`example`, `start` (first word of the window), `logits` (C values per example, or W×C for the W words of a token
window, taken at each word's first sub-word), `words` (token tasks: the window's word offsets) and, for PatientKD,
`cls` (K×D: the [CLS] vector of each requested teacher layer).

`TaskOutputs` memory-maps the table and indexes it once by example (sequence tasks) or by word (token tasks); `attach`
gives each *student* feature the row numbers it reads (the tokenizers may differ: rows are matched per example, or
per word at the student's first sub-word), and `gather` builds a batch's `teacher_logits`, `teacher_cls` and masks
straight from the mapped arrays.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.data.batch import Batch
from biodistil.data.formats import Example, TextExample, TokenExample, fingerprint_examples
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory, atomic_write_json, atomic_write_jsonl, jsonable, number, read_record
from biodistil.models.features import FeatureRequest, Features, classifier_features
from biodistil.models.loading import load_tokenizer, model_folder
from biodistil.tasks.encoding import EncodedSplit, FeatureCollator, encode_inputs, model_inputs
from biodistil.tasks.prediction import scored_rows
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score_model
from biodistil.teachers.loading import load_teacher_classifier
from biodistil.teachers.store import (
    STORE_VERSION,
    MappedTable,
    check_table,
    entry_key,
    map_table,
    store_root,
    teacher_fingerprint,
    write_table,
)
from biodistil.training.engine import Collate

TABLE = "outputs.arrow"
NO_ROW = -1  # a position or feature the teacher's outputs do not cover


@dataclass(frozen=True)
class TeacherRequest:
    """What to cache: the task (label space, max_length, sub-word policy) and the teacher layers for PatientKD."""

    task: TaskSpec
    cls_layers: tuple[int, ...] = ()
    batch_size: int = 64
    progress_bar: bool = True
    teacher_layers: int = 0  # the teacher's depth, for layer indices counted from the end (not part of the key)
    dtype: torch.dtype = torch.float32  # the teacher's while it runs (in the key unless float32: older entries stay)

    def key(self) -> dict[str, Any]:
        task = self.task
        key = {"task": task.name, "kind": task.kind, "labels": task.labels, "max_length": task.max_length,
               "truncation": task.truncation, "label_policy": task.label_policy, "cls_layers": list(self.cls_layers)}
        if self.dtype != torch.float32:
            key["dtype"] = str(self.dtype).removeprefix("torch.")
        return key

    @property
    def token_task(self) -> bool:
        return self.task.kind == "token_classification"


def with_placeholder_labels(examples: Sequence[Example], task: TaskSpec) -> list[Example]:
    """Unlabelled examples get the first label (tag "O") so that they can be encoded; callers drop the labels."""
    out: list[Example] = []
    for example in examples:
        if isinstance(example, TokenExample):
            tags = example.tags or ["O"] * len(example.tokens)
            out.append(TokenExample(example.id, example.tokens, tags))
        elif example.label is None:
            fill: Any = [0] * task.num_labels if task.kind == "multilabel_classification" else task.labels[0]
            out.append(TextExample(example.id, example.text, example.text_pair, fill))
        else:
            out.append(example)
    return out


# ----------------------------------------------------------------------------------------------- the entry
def cached_teacher_outputs(teacher: str | Path, examples: Sequence[Example], request: TeacherRequest,
                           cache_dir: str | Path | None = None, device: torch.device | str = "cpu") -> "TaskOutputs":
    """The teacher's outputs over `examples`: read from the store, or computed once and stored there (by the teacher
    in the very files fingerprinted: for a Hub id, the snapshot of the revision it resolves to now)."""
    teacher = model_folder(str(teacher))
    payload = {"kind": "task", "teacher": teacher_fingerprint(teacher),
               "transfer": fingerprint_examples(examples, labels=False), "request": request.key()}
    key = entry_key(payload)
    folder = store_root(cache_dir) / f"task-{key}"
    outputs = _read_entry(folder, key, request)
    if outputs is None:
        atomic_directory(folder, lambda tmp: _write_entry(tmp, key, teacher, examples, request, device, payload))
        outputs = _read_entry(folder, key, request)
    if outputs is None:
        raise BiodistilError(f"Teacher-output cache {folder} could not be read back right after it was written; is "
                             "the disk full or failing? Choose another kd.cache_dir")
    return outputs


def _read_entry(folder: Path, key: str, request: TeacherRequest) -> "TaskOutputs | None":
    """The entry's outputs when its table matches the checksum recorded when it was written; None when it is absent
    or damaged (saying which), so that it is built again."""
    if not folder.exists():
        return None
    why = check_table(folder / TABLE, key, verify=True)
    if why is not None:
        print(f"Teacher-output cache {folder} is damaged ({why[:200]}); building it again", flush=True)
        return None
    return TaskOutputs(map_table(folder / TABLE), request, folder)


def _write_entry(folder: Path, key: str, teacher: str | Path, examples: Sequence[Example], request: TeacherRequest,
                 device: torch.device | str, payload: dict[str, Any]) -> None:
    model = load_teacher_classifier(teacher, request.task).to(device, dtype=request.dtype)
    tokenizer = load_tokenizer(str(teacher))
    encoded = encode_inputs(request.task, examples, tokenizer)  # the teacher reads inputs only: no labels needed
    columns = teacher_columns(model, tokenizer, request, encoded)
    fields = [pa.field("example", pa.int64()), pa.field("start", pa.int64()),
              pa.field("logits", pa.list_(pa.float32()))]
    if request.token_task:
        fields.append(pa.field("words", pa.list_(pa.int32())))
    if request.cls_layers:
        fields.append(pa.field("cls", pa.list_(pa.float32())))
    write_table(folder / TABLE, pa.schema(fields, metadata={"key": key}), columns)
    atomic_write_json(folder / "key.json", {**payload, "store_version": STORE_VERSION})


@torch.inference_mode()
def teacher_columns(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, request: TeacherRequest,
                    encoded: EncodedSplit) -> dict[str, list[Any]]:
    """The table's columns, one row per teacher feature in feature order. Features are batched by length (little
    padding) and the teacher runs in inference mode."""
    collate = FeatureCollator(tokenizer.pad_token_id, request.token_task)
    device = next(model.parameters()).device
    by_length = sorted(range(len(encoded)), key=lambda i: len(encoded.features[i]["input_ids"]))
    rows: list[dict[str, Any]] = [{} for _ in range(len(encoded))]
    with tqdm(total=len(encoded), desc="teacher outputs", unit="ex", dynamic_ncols=True,
              disable=not request.progress_bar) as bar:
        for begin in range(0, len(by_length), request.batch_size):
            indices = by_length[begin:begin + request.batch_size]
            padded = collate([encoded.features[i] for i in indices])
            batch = {k: v.to(device) for k, v in model_inputs(model, padded).items()}
            logits, states = forward_teacher(model, batch, bool(request.cls_layers))
            logits = logits.float().cpu().numpy()
            cls = np.stack([states[layer][:, 0].float().cpu().numpy() for layer in request.cls_layers], 1) \
                if request.cls_layers else None
            for offset, index in enumerate(indices):
                rows[index] = _teacher_row(request, encoded, index, logits[offset],
                                           None if cls is None else cls[offset])
            bar.update(len(indices))
    return {name: [row[name] for row in rows] for name in rows[0]} if rows else {}


def forward_teacher(model: PreTrainedModel, batch: dict[str, torch.Tensor], hidden: bool,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """One teacher pass (a separate function so that tests can count how often the teacher runs)."""
    outputs = model(**batch, output_hidden_states=hidden)
    return outputs.logits, outputs.hidden_states if hidden else None


def _teacher_row(request: TeacherRequest, encoded: EncodedSplit, index: int, logits: np.ndarray,
                 cls: np.ndarray | None) -> dict[str, Any]:
    example, start = encoded.origins[index]
    row: dict[str, Any] = {"example": example, "start": start}
    if request.token_task:
        row["words"], positions = _first_subwords(encoded.word_ids[index])
        logits = logits[positions]
    row["logits"] = logits.reshape(-1)
    if cls is not None:
        row["cls"] = cls.reshape(-1)
    return row


def _first_subwords(word_ids: list[int | None]) -> tuple[list[int], list[int]]:
    """The words of a window (offsets in the window) and the position of each one's first sub-word."""
    words, positions, seen = [], [], set()
    for position, word in enumerate(word_ids):
        if word is not None and word not in seen:
            seen.add(word)
            words.append(word)
            positions.append(position)
    return words, positions


# ----------------------------------------------------------------------------------------------- reading
class TaskOutputs:
    """A memory-mapped entry, indexed by example (sequence tasks) or by (example, word) (token tasks): `attach` marks
    a student feature with the rows it reads, `gather` forms a batch's tensors from them; as a teacher signal's
    source (`biodistil.teachers.signal.CachedTeacher`), `data` and `features`."""

    def __init__(self, table: MappedTable, request: TeacherRequest, folder: Path):
        self.folder, self.token_task = folder, request.token_task
        self.num_labels, self.cls_layers = request.task.num_labels, request.cls_layers
        self.teacher_layers = max(request.teacher_layers, *request.cls_layers, 0)
        self.logits = table.lists["logits"][1].reshape(-1, self.num_labels)  # [rows or words, C], mapped
        examples, starts = table.scalars["example"], table.scalars["start"]
        self.cls = table.lists["cls"][1].reshape(len(examples), len(self.cls_layers), -1) if self.cls_layers \
            else None
        self.by_window = {(int(e), int(s)): row for row, (e, s) in enumerate(zip(examples, starts, strict=True))}
        if self.token_task:
            offsets, words = table.lists["words"]
            first = offsets[:-1]
            self.by_word: dict[tuple[int, int], int] = {}
            for row, (example, start) in enumerate(zip(examples, starts, strict=True)):
                for j in range(first[row], offsets[row + 1]):
                    self.by_word.setdefault((int(example), int(start + words[j])), int(j))
        else:
            self.by_example = {int(e): row for row, e in reversed(list(enumerate(examples)))}

    def __len__(self) -> int:
        return len(self.by_window)

    def data(self, dataset: Sequence[dict[str, Any]], collate: Collate,
             payload_index: int = 0) -> tuple[list[dict[str, Any]], Collate]:
        """The student's features with their rows attached, and a collate that gathers the rows into the batch's
        payload `payload_index`."""
        attached = [self.attach(feature, payload_index) for feature in dataset]
        return attached, GatheringCollate(collate, self, payload_index)

    def features(self, batch: Batch, request: FeatureRequest, positions: torch.Tensor | None = None,
                 payload_index: int = 0) -> Features:
        """The batch's gathered logits (and [CLS] states, [B, 1, D] per layer) as the objective's features."""
        payload = batch.payload(payload_index)
        cls = payload.get("cls")
        hidden = {layer: cls[:, k:k + 1] for k, layer in enumerate(self.cls_layers)} if cls is not None else {}
        return classifier_features(payload["logits"], hidden, self.teacher_layers)

    def attach(self, feature: dict[str, Any], payload_index: int = 0) -> dict[str, Any]:
        """The feature with its rows under `rows@<payload_index>`: per position for token tasks (`NO_ROW` where the
        soft term does not count or the teacher has no word), else one; and the [CLS] row for PatientKD under
        `cls_row@<payload_index>`.
        Reads the feature's `origin` and `word_ids`."""
        example, start = feature["origin"]
        out = dict(feature)
        if self.token_task:
            out[f"rows@{payload_index}"] = [
                self.by_word.get((example, start + word), NO_ROW) if word >= 0 and counts else NO_ROW
                for word, counts in zip(feature["word_ids"], feature["kd_mask"], strict=True)]
        else:
            out[f"rows@{payload_index}"] = self.by_example[example]
        if self.cls is not None:
            out[f"cls_row@{payload_index}"] = self.by_window.get((example, start), NO_ROW)
        return out

    def gather(self, features: list[dict[str, Any]], batch: Batch, payload_index: int = 0) -> None:
        """Put the teacher's `logits` ([B, C], or [B, L, C] with the `kd` mask narrowed to the positions that have a
        teacher word, and further by each payload gathered after it) and `cls` [B, K, D] (+ the `cls` mask) into the
        batch's payload `payload_index`, read from the mapped arrays."""
        payload = batch.payload(payload_index)
        if self.token_task:
            length = batch.input_ids.size(1)
            rows = np.full((len(features), length), NO_ROW, dtype=np.int64)
            for i, feature in enumerate(features):
                rows[i, :len(feature[f"rows@{payload_index}"])] = feature[f"rows@{payload_index}"]
            payload["logits"] = _rows_of(self.logits, rows)
            _narrow(batch.masks, "kd", torch.from_numpy(rows != NO_ROW).long())
        else:
            payload["logits"] = _rows_of(self.logits, np.array([f[f"rows@{payload_index}"] for f in features]))
        if self.cls is not None:
            rows = np.array([f[f"cls_row@{payload_index}"] for f in features])
            payload["cls"] = _rows_of(self.cls, rows)
            _narrow(batch.masks, "cls", torch.from_numpy(rows != NO_ROW).long())


def _narrow(masks: dict[str, torch.Tensor], name: str, known: torch.Tensor) -> None:
    """masks[name] = known, or known and the mask already there (another teacher's)."""
    masks[name] = known if name not in masks else masks[name] * known


@dataclass(frozen=True)
class GatheringCollate:
    """`collate` for the student's features, plus the teacher's outputs at their rows (`TaskOutputs.gather`)."""

    collate: Collate
    outputs: TaskOutputs
    payload_index: int = 0

    def __call__(self, features: list[dict[str, Any]]) -> Batch:
        batch = self.collate(features)
        self.outputs.gather(features, batch, self.payload_index)
        return batch


def _rows_of(values: np.ndarray, rows: np.ndarray) -> torch.Tensor:
    """values[rows] as a float32 tensor, zeros where a row is `NO_ROW` (a fancy-indexed copy of the mapped rows)."""
    gathered = values[np.maximum(rows, 0)].astype(np.float32, copy=False)
    gathered[rows == NO_ROW] = 0.0
    return torch.from_numpy(gathered)


# ----------------------------------------------------------------------------------------------- test scores
def teacher_test_scores(teacher: str, task: TaskSpec, examples: list[Example], cache_dir: str | Path | None,
                        batch_size: int = 64) -> dict[str, float]:
    """The teacher's scores on labelled test examples, kept in the store's root (keyed by the teacher's and the
    examples' fingerprints) with its predictions per example (`teacher_test_predictions`), so that every arm and seed
    of a study compares with the same T."""
    path = _scores_path(teacher, task, examples, cache_dir)
    found = read_record(path, note="the teacher is scored again")
    if isinstance(found, dict) and _predictions_path(path).is_file():
        return {key: number(value) for key, value in found.items()}
    model = load_teacher_classifier(teacher, task)
    scored = score_model(model, load_tokenizer(teacher), task, examples, batch_size)
    atomic_write_jsonl(_predictions_path(path), scored_rows(examples, scored.predictions))
    atomic_write_json(path, jsonable(scored.scores))  # last: the pair's marker
    return scored.scores


def teacher_test_predictions(teacher: str, task: TaskSpec, examples: list[Example], cache_dir: str | Path | None
                             ) -> Path:
    """The teacher's test predictions per example (id, gold, predicted: a run's test_predictions.jsonl), scored by
    `teacher_test_scores` first if they are not in the store."""
    teacher_test_scores(teacher, task, examples, cache_dir)
    return _predictions_path(_scores_path(teacher, task, examples, cache_dir))


def _scores_path(teacher: str, task: TaskSpec, examples: list[Example], cache_dir: str | Path | None) -> Path:
    key = entry_key({"kind": "scores", "teacher": teacher_fingerprint(teacher), "task": task.name,
                     "examples": fingerprint_examples(examples), "max_length": task.max_length})
    return store_root(cache_dir) / f"scores-{key}.json"


def _predictions_path(scores: Path) -> Path:
    return scores.with_suffix(".predictions.jsonl")
