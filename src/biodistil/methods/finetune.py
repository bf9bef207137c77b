"""Fine-tuning an encoder on a task of the task registry, and predicting with it.

Token classification (NER, PICO), sequence classification (single texts and pairs) and multi-label
classification share one path: encode the split into features, train a `ClassifierModule` with the one
engine, predict per example, score with the task's official metric. Long token sequences are split into
windows of whole words or truncated, as the task says; truncation is counted and reported, never silent.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as transformers_logging

from biodistil.config import TrainConfig
from biodistil.data.alignment import align_labels, chunk_words, word_predictions
from biodistil.data.formats import TextExample, TokenExample
from biodistil.errors import BiodistilError
from biodistil.evaluation.tasks import TaskSpec
from biodistil.training.engine import Engine, TrainResult

Example = TokenExample | TextExample


@dataclass
class EncodedSplit:
    """A split turned into model features; `origins[i]` = (example index, first word) of feature i."""

    features: list[dict[str, list]]
    origins: list[tuple[int, int]]
    word_ids: list[list[int | None]] = field(default_factory=list)
    truncated_examples: int = 0  # examples that lost words or text to truncation

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> dict[str, list]:
        return self.features[index]


def encode_split(task: TaskSpec, examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase) -> EncodedSplit:
    if task.kind == "token_classification":
        return _encode_tokens(task, examples, tokenizer)
    return _encode_texts(task, examples, tokenizer)


def _encode_tokens(task: TaskSpec, examples: Sequence[TokenExample], tokenizer) -> EncodedSplit:
    encoded = EncodedSplit([], [])
    ids = task.label_to_id
    b_to_i = task.b_to_i if task.label_policy == "all" else None
    room = task.max_length - tokenizer.num_special_tokens_to_add(pair=False)
    for index, example in enumerate(examples):
        pieces = _pieces_per_word(tokenizer, example.tokens)
        windows = chunk_words(pieces, room) if task.truncation == "split" else [(0, len(example.tokens))]
        if sum(pieces) > room:
            encoded.truncated_examples += 1
        for start, end in windows:
            words = example.tokens[start:end]
            enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=task.max_length)
            word_ids = enc.word_ids()
            labels = align_labels(word_ids, [ids[t] for t in example.tags[start:end]], task.label_policy, b_to_i)
            encoded.features.append({**{k: list(v) for k, v in enc.items()}, "labels": labels})
            encoded.origins.append((index, start))
            encoded.word_ids.append(word_ids)
    return encoded


def _pieces_per_word(tokenizer, words: Sequence[str]) -> list[int]:
    word_ids = tokenizer(list(words), is_split_into_words=True, add_special_tokens=False).word_ids()
    counts = [0] * len(words)
    for word in word_ids:
        if word is not None:
            counts[word] += 1
    return counts


def _encode_texts(task: TaskSpec, examples: Sequence[TextExample], tokenizer) -> EncodedSplit:
    encoded = EncodedSplit([], [])
    for index, example in enumerate(examples):
        full = tokenizer(example.text, example.text_pair, truncation=False)
        if len(full["input_ids"]) > task.max_length:
            encoded.truncated_examples += 1
        strategy = "only_second" if example.text_pair else "longest_first"
        enc = tokenizer(example.text, example.text_pair, truncation=strategy, max_length=task.max_length)
        feature = {k: list(v) for k, v in enc.items()}
        feature["labels"] = _target(task, example)
        encoded.features.append(feature)
        encoded.origins.append((index, 0))
    return encoded


def _target(task: TaskSpec, example: TextExample) -> Any:
    if task.kind == "multilabel_classification":
        return [float(v) for v in example.label]
    return task.label_to_id[str(example.label)]


@dataclass(frozen=True)
class FeatureCollator:
    """Pads features to the longest in the batch; per-token labels are padded with -100."""

    pad_id: int
    token_labels: bool  # True for token classification, False for one label (or label vector) per example

    def __call__(self, features: list[dict[str, list]]) -> dict[str, torch.Tensor]:
        length = max(len(f["input_ids"]) for f in features)
        batch: dict[str, torch.Tensor] = {}
        for key in features[0]:
            if key == "labels" and not self.token_labels:
                batch[key] = torch.tensor([f[key] for f in features])
                continue
            fill = {"input_ids": self.pad_id, "labels": -100}.get(key, 0)
            batch[key] = torch.tensor([f[key] + [fill] * (length - len(f[key])) for f in features])
        return batch


def collator_for(task: TaskSpec, tokenizer: PreTrainedTokenizerBase) -> FeatureCollator:
    return FeatureCollator(tokenizer.pad_token_id, task.kind == "token_classification")


class ClassifierModule(nn.Module):
    """What the engine trains when fine-tuning: a classifier whose forward computes its own loss."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.model(**batch).loss, {}


def build_classifier(model_dir: str | Path, task: TaskSpec) -> PreTrainedModel:
    """A task head on an encoder (the MLM head, if any, is dropped; the new head is freshly initialised)."""
    factory = AutoModelForTokenClassification if task.kind == "token_classification" else (
        AutoModelForSequenceClassification)
    kwargs: dict[str, Any] = {"num_labels": task.num_labels, "id2label": task.id_to_label,
                              "label2id": task.label_to_id}
    if task.kind == "multilabel_classification":
        kwargs["problem_type"] = "multi_label_classification"
    quiet = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # the "MLM head unused, new head initialised" report is expected
    try:
        return factory.from_pretrained(str(model_dir), **kwargs)
    except OSError as err:
        raise BiodistilError(f"Could not load an encoder from {model_dir}: {err}") from None
    finally:
        transformers_logging.set_verbosity(quiet)


@dataclass
class Predictions:
    """Per-example predictions of a split, in the task's label space."""

    labels: list[Any]  # tag lists (token tasks), label strings, or 0/1 vectors (multi-label)
    scores: list[list[float]]  # class probabilities per example (empty for token tasks)
    filled_words: int = 0  # words with no prediction (truncated away), predicted as O


@torch.no_grad()
def predict(model: PreTrainedModel, task: TaskSpec, examples: Sequence[Example], encoded: EncodedSplit,
            collate: FeatureCollator, batch_size: int = 64) -> Predictions:
    model.eval()
    device = next(model.parameters()).device
    loader = DataLoader(encoded.features, batch_size=batch_size, collate_fn=collate)
    outputs: list[np.ndarray] = []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items() if k != "labels"}
        logits = model(**batch).logits.float().cpu().numpy()
        outputs.extend(logits)
    if task.kind == "token_classification":
        return _word_level(task, examples, encoded, outputs)
    if task.kind == "multilabel_classification":
        probs = [1 / (1 + np.exp(-row)) for row in outputs]
        return Predictions([[int(p > 0.5) for p in row] for row in probs], [row.tolist() for row in probs])
    probs = [np.exp(row - row.max()) / np.exp(row - row.max()).sum() for row in outputs]
    return Predictions([task.labels[int(p.argmax())] for p in probs], [p.tolist() for p in probs])


def _word_level(task: TaskSpec, examples, encoded: EncodedSplit, outputs: list[np.ndarray]) -> Predictions:
    tags: list[list[str]] = [["O"] * len(e.tokens) for e in examples]
    seen: list[set[int]] = [set() for _ in examples]
    for logits, (index, start), word_ids in zip(outputs, encoded.origins, encoded.word_ids, strict=True):
        present = {w for w in word_ids if w is not None}
        predicted = word_predictions(word_ids, logits[: len(word_ids)].argmax(-1), max(present, default=-1) + 1)
        for offset in present:
            tags[index][start + offset] = task.labels[predicted[offset]]
            seen[index].add(start + offset)
    filled = sum(len(e.tokens) - len(s) for e, s in zip(examples, seen, strict=True))
    return Predictions(tags, [], filled)


def score(task: TaskSpec, examples: Sequence[Example], predictions: Predictions) -> dict[str, float]:
    """The task's official metric on these predictions."""
    if task.kind == "token_classification":
        return task.compute_metrics([e.tags for e in examples], predictions.labels)
    extra: dict[str, Any] = {}
    if task.metric == "accuracy_auroc":
        positive = task.label_to_id[str(task.metric_options.get("positive", task.labels[-1]))]
        extra["positive_scores"] = [s[positive] for s in predictions.scores]
    return task.compute_metrics(task.example_targets(examples), predictions.labels, **extra)


def train_classifier(model: PreTrainedModel, train: EncodedSplit, collate: FeatureCollator, cfg: TrainConfig,
                     run_dir: Path, seed: int, dev: EncodedSplit | None = None) -> TrainResult:
    """Fine-tune `model` in place on encoded training features with the one engine."""
    engine = Engine(cfg, run_dir, seed)
    result = engine.fit(ClassifierModule(model), train, collate, eval_data=dev)
    model.to(engine.accelerator.device)
    return result


def steps_for_epochs(num_examples: int, batch_size: int, epochs: float) -> int:
    return max(1, round(epochs * num_examples / batch_size))
