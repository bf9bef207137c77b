"""From model outputs back to the task's examples: labels per example, tags per word, and the files they go to.

Token tasks are predicted per word (the label of its first sub-word, `biodistil.data.alignment`) over every
window of a sentence; words that no window kept (truncated away) are predicted as O and counted.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import PreTrainedModel

from biodistil.data.alignment import word_predictions
from biodistil.data.formats import Example, TokenExample
from biodistil.tasks.encoding import EncodedSplit, EncodingSpec, FeatureCollator, model_inputs
from biodistil.tasks.registry import TaskSpec


@dataclass
class Predictions:
    """Per-example predictions of a split, in the task's label space."""

    labels: list[Any]  # tag lists (token tasks), label strings, or 0/1 vectors (multi-label)
    scores: list[list[float]]  # class probabilities per example (empty for token tasks)
    filled_words: int = 0  # words with no prediction (truncated away), predicted as O
    word_scores: list[list[float]] | None = None  # token tasks: each word's probability of its predicted tag


@dataclass
class Fallback:
    """A more exact model for the windows the first one is unsure of: a window whose `decision_margin` is under
    `margin` is predicted again by `model` (an int8 graph's fp32 original); `windows` and `rerun` count them."""

    model: Any
    margin: float
    windows: int = 0
    rerun: int = 0


@torch.no_grad()
def predict(model: PreTrainedModel, task: TaskSpec | EncodingSpec, examples: Sequence[Example], encoded: EncodedSplit,
            collate: FeatureCollator, batch_size: int = 64, fallback: Fallback | None = None,
            autocast: torch.dtype | None = None, max_padding: float | None = None) -> Predictions:
    """Per-example predictions of a split; `model` is a Hugging Face model or anything called like one that
    returns `.logits` and has `.device` and `.eval()` (e.g. an ONNX Runtime model, `biodistil.export.runtime`).
    Features are batched by length (`length_batches`), and the outputs returned in feature order. With a `fallback`,
    the windows `model` is unsure of are predicted again by the fallback's model. With `autocast` (torch.bfloat16),
    a PyTorch model runs under autocast to that type on its device: float32 weights, bf16 matrix products."""
    outputs = _logits(model, encoded.features, collate, batch_size, autocast, max_padding)
    if fallback is not None:
        word_ids = encoded.word_ids if task.kind == "token_classification" else [None] * len(outputs)
        unsure = [i for i, row in enumerate(outputs) if decision_margin(task, row, word_ids[i]) < fallback.margin]
        again = _logits(fallback.model, [encoded.features[i] for i in unsure], collate, batch_size,
                        max_padding=max_padding)
        for index, row in zip(unsure, again, strict=True):
            outputs[index] = row
        fallback.windows, fallback.rerun = fallback.windows + len(outputs), fallback.rerun + len(unsure)
    if task.kind == "token_classification":
        return _word_level(task, examples, encoded, outputs)
    if task.kind == "multilabel_classification":
        probs = [1 / (1 + np.exp(-row)) for row in outputs]
        return Predictions([[int(p > 0.5) for p in row] for row in probs], [row.tolist() for row in probs])
    probs = [np.exp(row - row.max()) / np.exp(row - row.max()).sum() for row in outputs]
    return Predictions([task.labels[int(p.argmax())] for p in probs], [p.tolist() for p in probs])


def length_batches(lengths: Sequence[int], batch_size: int, max_padding: float | None = None) -> list[list[int]]:
    """Indices of `lengths` in batches, shortest first, `batch_size` a batch; with `max_padding`, a batch also ends
    before the next index would make padding more than that share of its positions (a batch pads to its longest)."""
    batches: list[list[int]] = []
    tokens = 0
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        length, batch = lengths[index], batches[-1] if batches else []
        fits = max_padding is None or tokens + length >= (1 - max_padding) * (len(batch) + 1) * length
        if batch and len(batch) < batch_size and fits:
            batch.append(index)
            tokens += length
        else:
            batches.append([index])
            tokens = length
    return batches


def _logits(model: Any, features: Sequence[dict], collate: FeatureCollator, batch_size: int,
            autocast: torch.dtype | None = None, max_padding: float | None = None) -> list[np.ndarray]:
    """The model's logits for each feature, in the features' order, in `length_batches` (under `autocast`, if
    given)."""
    model.eval()
    batches = length_batches([len(feature["input_ids"]) for feature in features], batch_size, max_padding)
    loader = DataLoader(features, batch_sampler=batches, collate_fn=collate)
    outputs: list[np.ndarray] = [np.empty(0)] * len(features)
    rows = (index for batch in batches for index in batch)
    # one autocast region for every batch: autocast casts each weight to bf16 once in a region, not once a batch
    with torch.autocast(model.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        for batch in loader:
            batch = {k: v.to(model.device) for k, v in model_inputs(model, batch).items()}
            for row in model(**batch).logits.float().cpu().numpy():
                outputs[next(rows)] = row
    return outputs


def decision_margin(task: TaskSpec | EncodingSpec, logits: np.ndarray,
                    word_ids: Sequence[int | None] | None = None) -> float:
    """How sure a window's prediction is, in probability: the smallest gap between the two most probable tags at a
    word's first sub-word (token tasks: the tags that are predicted), between the two most probable classes
    (single-label), or between a label's probability and 0.5, doubled (multi-label); 1.0 with nothing predicted."""
    if task.kind == "multilabel_classification":
        return float((2 * np.abs(1 / (1 + np.exp(-logits)) - 0.5)).min(initial=1.0))
    rows = logits[None] if task.kind != "token_classification" else \
        logits[[i for i, word in enumerate(word_ids or []) if word is not None and (i == 0 or word_ids[i - 1] != word)]]
    if not len(rows):
        return 1.0
    probabilities = np.exp(rows - rows.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    top_two = np.sort(probabilities, -1)[:, -2:]
    return float((top_two[:, 1] - top_two[:, 0]).min())


def _word_level(task: TaskSpec | EncodingSpec, examples, encoded: EncodedSplit,
                outputs: list[np.ndarray]) -> Predictions:
    tags: list[list[str]] = [["O"] * len(e.tokens) for e in examples]
    word_scores: list[list[float]] = [[0.0] * len(e.tokens) for e in examples]
    seen: list[set[int]] = [set() for _ in examples]
    for logits, (index, start), word_ids in zip(outputs, encoded.origins, encoded.word_ids, strict=True):
        present = {w for w in word_ids if w is not None}
        rows = logits[: len(word_ids)]
        probs = np.exp(rows - rows.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        predicted = word_predictions(word_ids, rows.argmax(-1), max(present, default=-1) + 1)
        first = {word: position for position, word in reversed(list(enumerate(word_ids))) if word is not None}
        for offset in present:
            tags[index][start + offset] = task.labels[predicted[offset]]
            word_scores[index][start + offset] = float(probs[first[offset], predicted[offset]])
            seen[index].add(start + offset)
    filled = sum(len(e.tokens) - len(s) for e, s in zip(examples, seen, strict=True))
    return Predictions(tags, [], filled, word_scores)


def degenerate(task: TaskSpec, predictions: Predictions) -> str:
    """What is degenerate about a split's predictions ("" when nothing): one class for every example, no entity
    at all (every word O) on a token task, or, on a task scored without its negative class (ChemProt's "False"),
    only that class and one positive type. Such a score says little about the model."""
    labels = predictions.labels
    if task.kind == "token_classification":
        return "" if any(tag != "O" for tags in labels for tag in tags) else "every word predicted O (no entity)"
    if len(labels) < 2:
        return ""
    distinct = {json.dumps(label) for label in labels}
    if len(distinct) == 1:
        return f"every example predicted {labels[0]!r}"
    negative = set(task.metric_options.get("negative_labels") or ())
    positive = sorted({str(label) for label in labels} - negative)
    if negative and len(set(task.labels) - negative) > 1 and len(positive) == 1 and len(distinct) == 2:
        return f"only the negative class and one positive type ({positive[0]!r}) predicted"
    return ""


def prediction_notes(task: TaskSpec, predictions: Predictions, truncated: dict[str, int],
                     words: int | None = None, markers_cut: dict[str, int] | None = None) -> list[str]:
    """Warnings that belong beside a score: long examples cut by truncation, relation examples whose entity
    markers did not all fit, test words left without a prediction (scored as O), degenerate predictions."""
    notes = []
    cut = {split: count for split, count in truncated.items() if count}
    if cut:
        kept = " (relation examples: the window around their entity markers)" if task.kind != (
            "token_classification") else ""
        notes.append(f"Long examples cut to {task.max_length} tokens{kept}: "
                     + ", ".join(f"{count} {split}" for split, count in cut.items()))
    if markers_cut:
        notes.append("Relation examples whose entity markers are further apart than max_length (the window keeps "
                     "the first marker): " + ", ".join(f"{count} {split}" for split, count in markers_cut.items()))
    if predictions.filled_words:
        total = f" of {words}" if words else ""
        notes.append(f"{predictions.filled_words}{total} test words were cut off by truncation: no prediction, "
                     "scored as O (truncation: split keeps every word)")
    problem = degenerate(task, predictions)
    if problem:
        notes.append(f"Degenerate test predictions: {problem}; the score does not reflect a trained model")
    return notes


def scored_rows(examples: Sequence[Example], predictions: Predictions) -> list[dict[str, Any]]:
    """The records of the test_predictions.jsonl that `finetune` and `kd` write, one per example: id, gold,
    predicted label (or tags) and class scores."""
    rows = []
    for index, example in enumerate(examples):
        gold = example.tags if isinstance(example, TokenExample) else example.label
        row = {"id": example.id, "gold": gold, "predicted": predictions.labels[index]}
        if predictions.scores:
            row["scores"] = [round(float(s), 6) for s in predictions.scores[index]]
        rows.append(row)
    return rows


def prediction_rows(task: TaskSpec, examples: Sequence[Any], predictions: Any) -> list[dict[str, Any]]:
    """The records of `evaluate`'s predictions.jsonl, one per example: id, gold, prediction (and tokens or class
    probabilities by label)."""
    rows = []
    for index, example in enumerate(examples):
        row: dict[str, Any] = {"id": example.id}
        if isinstance(example, TokenExample):
            row.update(tokens=example.tokens, gold=example.tags, prediction=predictions.labels[index])
        else:
            row.update(gold=example.label, prediction=predictions.labels[index])
            if predictions.scores:
                row["probabilities"] = {label: round(float(p), 6)
                                        for label, p in zip(task.labels, predictions.scores[index], strict=True)}
        rows.append(row)
    return rows
