"""Encoding a task's examples into model features, and padding features into batches.

Token classification (NER, PICO) encodes each sentence as words, labels its sub-words by the task's policy ("first"
or "all", `biodistil.data.alignment`) and, with `truncation: split`, cuts long sentences into windows of whole words
(training data: never inside a gold entity); sequence and multi-label tasks encode one text (or a pair) with its
target. `encode_inputs` does the same without targets, from an `EncodingSpec` (kind, labels, length, truncation:
what a fine-tuned model's head and labels say) or a task: unlabelled texts to predict need no task and no invented
labels. Truncation is counted per split (`EncodedSplit.truncated_examples`), never silent; a long relation example
keeps the window around its entity markers (`window_around_markers`; those that cannot are counted in
`markers_cut`). `origins` and `word_ids` keep the way back from features to examples and words
(`biodistil.tasks.prediction`). `teacher_encoding` gives each feature the same text in another tokenizer's tokens
(an online teacher across tokenizers): the same example (sequence tasks), or the same window of words with each
word's first teacher token (token tasks).
"""

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedTokenizerBase

from biodistil.data.alignment import align_labels, chunk_words, tokenize_words, words_for_tokenizer
from biodistil.data.batch import MODEL_INPUTS
from biodistil.data.formats import Example, TextExample, TokenExample
from biodistil.models.families import position_limit
from biodistil.tasks.registry import TaskKind, TaskSpec

# the entity markers of relation-extraction texts: @GENE$, @DRUG$, @DISEASE$, @CHEMICAL$ (BLURB), BC6ENTC and
# BC6ENTG (ChemProt's blinded entities; BC6OTHER marks entities the label is not about)
ENTITY_MARKERS = re.compile(r"@[A-Z][A-Z_-]*\$|\bBC6ENT[A-Z]\b")  # @GENE$, @DRUG-DRUG$ (DDI), BC6ENTC


@dataclass
class EncodedSplit:
    """A split turned into model features; `origins[i]` = (example index, first word) of feature i."""

    features: list[dict[str, list]]
    origins: list[tuple[int, int]]
    word_ids: list[list[int | None]] = field(default_factory=list)
    truncated_examples: int = 0  # examples that lost words or text to truncation
    markers_cut: int = 0  # relation examples whose entity markers do not all fit in one window

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> dict[str, list]:
        return self.features[index]


@dataclass(frozen=True)
class EncodingSpec:
    """What encoding texts and reading a model's outputs need of a task (`encode_inputs`, `tasks.prediction.predict`):
    its kind, its labels in the model's id order, the window length and what happens beyond it. A `TaskSpec` has the
    same fields; a fine-tuned model's head and labels make one (`export.predict.Predictor`)."""

    kind: TaskKind
    labels: tuple[str, ...]
    max_length: int
    truncation: Literal["truncate", "split"] = "truncate"


def encode_split(task: TaskSpec, examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase,
                 whole_entities: bool = False) -> EncodedSplit:
    """The examples of a split as model features with their targets (windows of words for token tasks; with
    `whole_entities`, training data, a window never ends inside a gold entity)."""
    encoded = encode_inputs(task, examples, tokenizer, whole_entities)
    if task.kind == "token_classification":
        ids, b_to_i = task.label_to_id, task.b_to_i if task.label_policy == "all" else None
        for feature, (index, start), word_ids in zip(encoded.features, encoded.origins, encoded.word_ids, strict=True):
            count = max((word + 1 for word in word_ids if word is not None), default=0)
            tags = examples[index].tags[start:start + count]
            feature["labels"] = align_labels(word_ids, [ids[tag] for tag in tags], task.label_policy, b_to_i)
        return encoded
    for feature, (index, _) in zip(encoded.features, encoded.origins, strict=True):
        feature["labels"] = _target(task, examples[index])
    return encoded


def encode_inputs(spec: EncodingSpec | TaskSpec, examples: Sequence[Example],
                  tokenizer: PreTrainedTokenizerBase, whole_entities: bool = False) -> EncodedSplit:
    """The examples as model inputs, without targets (their labels are read only with `whole_entities`: where a
    long sentence's windows may end)."""
    if spec.kind == "token_classification":
        return _encode_tokens(spec, examples, tokenizer, whole_entities)
    return _encode_texts(spec, examples, tokenizer)


def _encode_tokens(spec: EncodingSpec | TaskSpec, examples: Sequence[TokenExample], tokenizer,
                   whole_entities: bool = False) -> EncodedSplit:
    encoded = EncodedSplit([], [])
    room = spec.max_length - tokenizer.num_special_tokens_to_add(pair=False)
    # every sentence tokenized whole in one batched call: most fit in one window and are used as they are
    whole = tokenizer([words_for_tokenizer(tokenizer, e.tokens) for e in examples], is_split_into_words=True,
                      verbose=False) if examples else None
    for index, example in enumerate(examples):
        pieces = _counts(whole.word_ids(index), len(example.tokens))
        if example.tokens and sum(pieces) <= room:
            encoded.features.append({k: list(v[index]) for k, v in whole.items()})
            encoded.origins.append((index, 0))
            encoded.word_ids.append(whole.word_ids(index))
            continue
        continues = [tag.startswith("I") for tag in example.tags] if whole_entities else None
        windows = chunk_words(pieces, room, continues) if spec.truncation == "split" else [(0, len(example.tokens))]
        if sum(pieces) > room and spec.truncation != "split":  # split keeps every word, in windows
            encoded.truncated_examples += 1
        for start, end in windows:
            enc = tokenize_words(tokenizer, example.tokens[start:end], truncation=True, max_length=spec.max_length)
            encoded.features.append({k: list(v) for k, v in enc.items()})
            encoded.origins.append((index, start))
            encoded.word_ids.append(enc.word_ids())
    return encoded


NO_POSITION = -1  # a student token whose word the teacher's encoding does not hold (truncated), or no word


def teacher_encoding(task: TaskSpec, examples: Sequence[Example], encoded: EncodedSplit,
                     tokenizer: PreTrainedTokenizerBase) -> list[dict[str, list[int]]]:
    """For each feature of `encoded` (the student's), the same text in `tokenizer`'s tokens: `input_ids`,
    `attention_mask` (and `token_type_ids` when the tokenizer gives them). Sequence tasks: the feature's example,
    encoded as `encode_split` encodes it. Token tasks: the feature's window of words, truncated at the task's
    max_length, and `word_index` [L_S]: for each student token of a word, the position of that word's first teacher
    token (NO_POSITION off words and for words the teacher's side lost to truncation)."""
    if task.kind != "token_classification":
        teacher = _encode_texts(task, examples, tokenizer)
        return [_inputs_only(teacher.features[index]) for index, _ in encoded.origins]
    return [_teacher_window(task, examples[index], start, word_ids, tokenizer)
            for (index, start), word_ids in zip(encoded.origins, encoded.word_ids, strict=True)]


def _teacher_window(task: TaskSpec, example: TokenExample, start: int, word_ids: Sequence[int | None],
                    tokenizer: PreTrainedTokenizerBase) -> dict[str, list[int]]:
    count = max((word + 1 for word in word_ids if word is not None), default=0)
    words = list(example.tokens[start:start + count])
    enc = tokenize_words(tokenizer, words, truncation=True, max_length=task.max_length) if words \
        else tokenizer("", truncation=True, max_length=task.max_length)
    first: dict[int, int] = {}
    for position, word in enumerate(enc.word_ids() if words else []):
        if word is not None:
            first.setdefault(word, position)
    feature = _inputs_only({k: list(v) for k, v in enc.items()})
    feature["word_index"] = [NO_POSITION if word is None else first.get(word, NO_POSITION) for word in word_ids]
    return feature


def _inputs_only(feature: dict[str, list]) -> dict[str, list[int]]:
    return {key: list(value) for key, value in feature.items() if key in MODEL_INPUTS}


def _counts(word_ids: Sequence[int | None], words: int) -> list[int]:
    """Sub-word pieces per word, from a tokenization's word ids."""
    counts = [0] * words
    for word in word_ids:
        if word is not None:
            counts[word] += 1
    return counts


def _encode_texts(task: EncodingSpec | TaskSpec, examples: Sequence[TextExample], tokenizer) -> EncodedSplit:
    encoded = EncodedSplit([], [])
    for index, example in enumerate(examples):
        full = tokenizer(example.text, example.text_pair, truncation=False, verbose=False)  # windowed below
        text = example.text
        if len(full["input_ids"]) > task.max_length:
            encoded.truncated_examples += 1
            if example.text_pair is None and ENTITY_MARKERS.search(text):
                text, kept = window_around_markers(text, tokenizer, task.max_length)
                encoded.markers_cut += not kept
        # longest_first cuts the longer segment (the passage of a QA pair) first, and never fails on a long question
        enc = tokenizer(text, example.text_pair, truncation="longest_first", max_length=task.max_length)
        encoded.features.append({k: list(v) for k, v in enc.items()})
        encoded.origins.append((index, 0))
    return encoded


def window_around_markers(text: str, tokenizer, max_length: int) -> tuple[str, bool]:
    """The part of a long relation example that fits `max_length` tokens and holds its entity markers (@GENE$,
    @DRUG$, ChemProt's BC6ENTC/BC6ENTG ...), centred on them, cut at word starts; and whether every marker fits.
    When they are too far apart, the window starts at the first marker."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    spans = [m.span() for m in ENTITY_MARKERS.finditer(text)]
    marked = [i for i, (a, b) in enumerate(offsets) if any(a < end and b > start for start, end in spans)]
    room = max_length - tokenizer.num_special_tokens_to_add(pair=False) - 2  # margin: re-tokenising may differ
    first, last = marked[0], marked[-1] + 1
    kept = last - first <= room
    start = max(0, min(first - (room - (last - first)) // 2, len(offsets) - room)) if kept else first
    while start > 0 and offsets[start][0] > 0 and not text[offsets[start][0] - 1].isspace():
        start -= 1  # whole words only
    end = min(len(offsets), start + room)
    while end < len(offsets) and end > start + 1 and offsets[end][0] > 0 and \
            not text[offsets[end][0] - 1].isspace():
        end -= 1
    return text[offsets[start][0]:offsets[end - 1][1]], kept


def _target(task: TaskSpec, example: TextExample) -> Any:
    if task.kind == "multilabel_classification":
        return [float(v) for v in example.label]
    return task.label_to_id[str(example.label)]


@dataclass(frozen=True)
class FeatureCollator:
    """Pads the model inputs and labels of features to the longest in the batch; per-token labels with -100."""

    pad_id: int
    token_labels: bool  # True for token classification, False for one label (or label vector) per example

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = max(len(f["input_ids"]) for f in features)
        batch: dict[str, torch.Tensor] = {}
        for key in (key for key in (*MODEL_INPUTS, "labels") if key in features[0]):  # other keys are not padded here
            if key == "labels" and not self.token_labels:
                batch[key] = torch.tensor([f[key] for f in features])
                continue
            fill = {"input_ids": self.pad_id, "labels": -100}.get(key, 0)
            batch[key] = torch.tensor([f[key] + [fill] * (length - len(f[key])) for f in features])
        return batch


def collator_for(task: TaskSpec | EncodingSpec, tokenizer: PreTrainedTokenizerBase) -> FeatureCollator:
    """The collator of a task's features for this tokenizer."""
    return FeatureCollator(tokenizer.pad_token_id, task.kind == "token_classification")


def model_inputs(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of `batch` that the model's forward takes (of MODEL_INPUTS).

    A tokenizer may produce `token_type_ids` for a model that takes none (a BERT tokenizer shared with a ModernBERT
    or DistilBERT student): they are dropped. Anything that is not a torch module (an ONNX Runtime model) gets
    every model input of the batch.
    """
    accepted = inspect.signature(model.forward).parameters if isinstance(model, nn.Module) else MODEL_INPUTS
    return {key: value for key, value in batch.items() if key in MODEL_INPUTS and key in accepted}


def fit_length_to_model(task: TaskSpec, model_name_or_path: str | Path) -> TaskSpec:
    """The task with max_length capped at what the model's position embeddings allow (truncation is counted)."""
    config = AutoConfig.from_pretrained(str(model_name_or_path))
    limit = position_limit(config, default=task.max_length)
    return task if task.max_length <= limit else task.model_copy(update={"max_length": limit})
