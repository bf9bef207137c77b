"""Teacher outputs over a transfer set, computed once and cached on disk for every epoch and run that needs them.

The cache key is sha256(teacher fingerprint, transfer-set inputs (not labels), task encoding, requested layers):
a change of the teacher's weights, config or tokenizer, or of the transfer set, gives a new entry. An entry is
a datasets Arrow folder with one row per *teacher feature* (an example, or one window of a long token
sequence): `example`, `start` (first word of the window), `logits` ([C] per example, or [W, C] for the W words
of a token window, taken at each word's first sub-word), `words` (token tasks: the window's word offsets) and,
for PatientKD, `cls` ([K, D]: the [CLS] vector of each requested teacher layer).

`attach_teacher_outputs` aligns an entry with the *student's* encoding of the same examples (the tokenizers
may differ): per example for sequence tasks, per word (first sub-word) for token tasks.
"""

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerBase

from biodistil.data.corpus import default_cache_dir
from biodistil.data.formats import Example, TextExample, TokenExample
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory, atomic_write_json, file_sha256, jsonable, number
from biodistil.kd.transfer import fingerprint_examples
from biodistil.methods.finetune import build_classifier
from biodistil.tasks.encoding import EncodedSplit, FeatureCollator, encode_split, model_inputs
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score_model

CACHE_VERSION = 2
CHECKSUMS = "checksums.json"  # sha256 of every file of an entry, written last
_MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "merges.txt", "vocab.json",
                "special_tokens_map.json")
_ARCHITECTURE = {"token_classification": "ForTokenClassification",
                 "sequence_classification": "ForSequenceClassification",
                 "multilabel_classification": "ForSequenceClassification"}


def teacher_cache_dir(explicit: str | Path | None = None) -> Path:
    """`kd.cache_dir`, else ~/.cache/biodistil/teacher (or $BIODISTIL_CACHE/teacher)."""
    return Path(explicit).expanduser() if explicit else default_cache_dir().parent / "teacher"


def model_fingerprint(name_or_path: str | Path) -> str:
    """sha256 of a model's weights, config and tokenizer files: of its folder, or for a Hub id of the cache's
    snapshot of its current revision (`models.loading.model_folder`), so that an updated Hub model gets new entries
    and one model spelled two ways shares them."""
    from biodistil.models.loading import model_folder

    folder = model_folder(str(name_or_path))
    digest = hashlib.sha256(f"model-v{CACHE_VERSION}".encode())
    files = sorted({*folder.glob("*.safetensors"), *folder.glob("*.bin"), *(folder / n for n in _MODEL_FILES)})
    for path in files:
        if path.is_file():
            digest.update(path.name.encode())
            with path.open("rb") as handle:
                for chunk in iter(lambda h=handle: h.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def load_teacher_classifier(name_or_path: str | Path, task: TaskSpec) -> PreTrainedModel:
    """A teacher fine-tuned on `task`: its config must name a classification head with the task's labels."""
    try:
        config = AutoConfig.from_pretrained(str(name_or_path))
    except OSError as err:
        raise BiodistilError(f"Teacher {name_or_path}: cannot read its config ({err})") from None
    heads = [name for name in (config.architectures or []) if name.endswith(_ARCHITECTURE[task.kind])]
    labels = [config.id2label[i] for i in sorted(config.id2label)] if config.id2label else []
    if not heads or labels != task.labels:
        raise BiodistilError(
            f"Teacher {name_or_path} is not fine-tuned on task {task.name}: its config has architectures "
            f"{config.architectures} and labels {labels}; expected a *{_ARCHITECTURE[task.kind]} model with labels "
            f"{task.labels}. Fine-tune it first with `biodistil finetune`."
        )
    model = build_classifier(name_or_path, task)
    model.eval()
    return model


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


@dataclass(frozen=True)
class TeacherRequest:
    """What to cache: the task (label space, max_length, sub-word policy) and the teacher layers for PatientKD."""

    task: TaskSpec
    cls_layers: tuple[int, ...] = ()
    batch_size: int = 64
    progress_bar: bool = True

    def key(self) -> dict[str, Any]:
        task = self.task
        return {"task": task.name, "kind": task.kind, "labels": task.labels, "max_length": task.max_length,
                "truncation": task.truncation, "label_policy": task.label_policy, "cls_layers": list(self.cls_layers)}


def cached_teacher_outputs(teacher: str | Path, examples: Sequence[Example], request: TeacherRequest,
                           cache_dir: str | Path | None = None, device: torch.device | str = "cpu",
                           ) -> datasets.Dataset:
    """The teacher's outputs over `examples`: read from the cache, or computed once and stored there."""
    payload = {"teacher": model_fingerprint(teacher), "transfer": fingerprint_examples(examples, labels=False),
               "request": request.key(), "version": CACHE_VERSION}
    key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]
    target = teacher_cache_dir(cache_dir) / key
    table = load_verified(target)
    if table is None:
        atomic_directory(target, lambda tmp: _write_outputs(tmp, teacher, examples, request, device, payload))
        table = load_verified(target)
    if table is None:
        raise BiodistilError(f"Teacher-output cache {target} could not be read back right after it was written; is "
                             "the disk full or failing? Choose another kd.cache_dir")
    return table


def load_verified(folder: Path) -> datasets.Dataset | None:
    """A cache entry whose files match the sha256 sums recorded when it was written (`checksums.json`), loaded; None
    when it is absent or damaged (a truncated or garbage file, a missing `state.json`), saying which, so that it is
    built again."""
    if not folder.exists():
        return None
    try:
        sums = json.loads((folder / CHECKSUMS).read_text(encoding="utf-8"))
        changed = [name for name, digest in sums.items() if file_sha256(folder / name) != digest]
        if changed:
            raise ValueError(f"{', '.join(changed)} changed since written")
        return datasets.load_from_disk(str(folder))
    except (OSError, ValueError, pa.ArrowException) as err:
        print(f"Teacher-output cache {folder} is damaged ({type(err).__name__}: {str(err)[:200]}); building it "
              "again", flush=True)
        return None


def _write_outputs(folder: Path, teacher: str | Path, examples: Sequence[Example], request: TeacherRequest,
                   device: torch.device | str, payload: dict[str, Any]) -> None:
    from biodistil.models.loading import load_tokenizer

    model = load_teacher_classifier(teacher, request.task).to(device)
    tokenizer = load_tokenizer(str(teacher))
    encoded = encode_split(request.task, with_placeholder_labels(examples, request.task), tokenizer)
    rows = teacher_rows(model, tokenizer, request, encoded)
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    (folder / "cache_key.json").write_text(json.dumps(payload, indent=1))
    sums = {path.name: file_sha256(path) for path in sorted(folder.iterdir()) if path.is_file()}
    (folder / CHECKSUMS).write_text(json.dumps(sums, indent=1))


@torch.inference_mode()
def teacher_rows(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, request: TeacherRequest,
                 encoded: EncodedSplit) -> list[dict[str, Any]]:
    """One row per teacher feature, in feature order: logits (per example, or per word of a token window) and
    [CLS] states. Features are batched by length (little padding) and the teacher runs in inference mode."""
    collate = FeatureCollator(tokenizer.pad_token_id, request.task.kind == "token_classification")
    device = next(model.parameters()).device
    by_length = sorted(range(len(encoded)), key=lambda i: len(encoded.features[i]["input_ids"]))
    batches = [by_length[begin:begin + request.batch_size] for begin in range(0, len(by_length), request.batch_size)]
    rows: list[dict[str, Any]] = [{} for _ in range(len(encoded))]
    with tqdm(total=len(encoded), desc="teacher outputs", unit="ex", dynamic_ncols=True,
              disable=not request.progress_bar) as bar:
        for indices in batches:
            padded = collate([encoded.features[i] for i in indices])
            batch = {k: v.to(device) for k, v in model_inputs(model, padded).items()}
            logits, states = forward_teacher(model, batch, bool(request.cls_layers))
            logits = logits.float().cpu().numpy()
            cls = [states[layer][:, 0].float().cpu().numpy() for layer in request.cls_layers]
            for offset, index in enumerate(indices):
                rows[index] = _teacher_row(request, encoded, index, logits[offset], [c[offset] for c in cls])
            bar.update(len(indices))
    return rows


def _teacher_row(request: TeacherRequest, encoded: EncodedSplit, index: int, logits: np.ndarray,
                 cls: list[np.ndarray]) -> dict[str, Any]:
    example, start = encoded.origins[index]
    row: dict[str, Any] = {"example": example, "start": start}
    if request.task.kind == "token_classification":
        row["words"], row["logits"] = _word_logits(logits, encoded.word_ids[index])
    else:
        row["logits"] = logits.tolist()
    if cls:
        row["cls"] = [state.tolist() for state in cls]
    return row


def forward_teacher(model: PreTrainedModel, batch: dict[str, torch.Tensor], hidden: bool,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """One teacher pass (a separate function so that tests can count how often the teacher runs)."""
    outputs = model(**batch, output_hidden_states=hidden)
    return outputs.logits, outputs.hidden_states if hidden else None


def _word_logits(logits: np.ndarray, word_ids: list[int | None]) -> tuple[list[int], list[list[float]]]:
    """Logits at the first sub-word of each word of a window, with the words' offsets in the window."""
    words, positions, seen = [], [], set()
    for position, word in enumerate(word_ids):
        if word is not None and word not in seen:
            seen.add(word)
            words.append(word)
            positions.append(position)
    return words, logits[positions].tolist()


def attach_teacher_outputs(encoded: EncodedSplit, table: datasets.Dataset, task: TaskSpec,
                           kd_positions: list[list[int]] | None) -> list[dict[str, Any]]:
    """Student features with the cached teacher outputs: `teacher_logits` ([C], or [L, C] per position with
    `kd_mask` [L] marking the positions that have a teacher word), and `teacher_cls` [K, D] + `pkd_mask`."""
    token_task = task.kind == "token_classification"
    per_example, per_word, cls = _index_outputs(table, token_task)
    features = []
    for i, feature in enumerate(encoded.features):
        example, start = encoded.origins[i]
        out = dict(feature)
        if token_task:
            out["teacher_logits"], out["kd_mask"] = _position_logits(
                per_word, example, start, encoded.word_ids[i], kd_positions[i], task.num_labels)
        else:
            out["teacher_logits"] = per_example[example]
        if "cls" in table.column_names:
            found = cls.get((example, start))
            out["pkd_mask"] = int(found is not None)
            out["teacher_cls"] = found if found is not None else _zeros_like_cls(table)
        features.append(out)
    return features


def _index_outputs(table: datasets.Dataset, token_task: bool) -> tuple[dict, dict, dict]:
    per_example: dict[int, list[float]] = {}
    per_word: dict[tuple[int, int], list[float]] = {}
    cls: dict[tuple[int, int], list[list[float]]] = {}
    has_cls = "cls" in table.column_names
    for row in table:
        if token_task:
            for offset, logits in zip(row["words"], row["logits"], strict=True):
                per_word.setdefault((row["example"], row["start"] + offset), logits)
        else:
            per_example[row["example"]] = row["logits"]
        if has_cls:
            cls[(row["example"], row["start"])] = row["cls"]
    return per_example, per_word, cls


def _position_logits(per_word: dict, example: int, start: int, word_ids: list[int | None], positions: list[int],
                     num_labels: int) -> tuple[list[list[float]], list[int]]:
    logits, mask = [], []
    for position, word in enumerate(word_ids):
        found = per_word.get((example, start + word)) if word is not None and positions[position] else None
        logits.append(found if found is not None else [0.0] * num_labels)
        mask.append(int(found is not None))
    return logits, mask


def _zeros_like_cls(table: datasets.Dataset) -> list[list[float]]:
    first = table[0]["cls"]
    return [[0.0] * len(first[0]) for _ in first]


def teacher_test_scores(teacher: str, task: TaskSpec, examples: list[Example], cache_dir: str | Path | None,
                        batch_size: int = 64) -> dict[str, float]:
    """The teacher's scores on labelled test examples, cached beside its outputs (keyed by the teacher's and the
    examples' fingerprints), so that every arm and seed of a study compares with the same T."""
    key = f"scores-{model_fingerprint(teacher)[:20]}-{fingerprint_examples(examples)[:20]}-{task.name}" \
          f"-{task.max_length}.json"
    path = teacher_cache_dir(cache_dir) / key
    if path.is_file():
        return {key: number(value) for key, value in json.loads(path.read_text()).items()}
    from biodistil.models.loading import load_tokenizer

    model = load_teacher_classifier(teacher, task)
    scores = score_model(model, load_tokenizer(teacher), task, examples, batch_size).scores
    atomic_write_json(path, jsonable(scores))
    return scores
