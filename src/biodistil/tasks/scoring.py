"""Scoring predictions with the task's official metric (`biodistil.tasks.metrics`), and a model on labelled
examples in one call: encode, predict, score, exactly as fine-tuning scores its test set."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from biodistil.data.formats import Example
from biodistil.tasks.encoding import collator_for, encode_split
from biodistil.tasks.metrics import METRICS
from biodistil.tasks.prediction import Predictions, predict
from biodistil.tasks.registry import TaskSpec


def score(task: TaskSpec, examples: Sequence[Example], predictions: Predictions) -> dict[str, float]:
    """The task's official metric on these predictions."""
    if task.kind == "token_classification":
        return task.compute_metrics([e.tags for e in examples], predictions.labels)
    extra: dict[str, Any] = {}
    if "positive_scores" in METRICS[task.metric].inputs:
        extra["positive_scores"] = [s[positive_index(task)] for s in predictions.scores]
    return task.compute_metrics(task.example_targets(examples), predictions.labels, **extra)


def positive_index(task: TaskSpec) -> int:
    """Where the positive class's score stands in a prediction's class scores (the metric's `positive` option, else
    the last label)."""
    return task.label_to_id[str(task.metric_options.get("positive", task.labels[-1]))]


@dataclass
class Scored:
    """A model's scores on labelled examples, its predictions per example and the examples cut by truncation."""

    scores: dict[str, float]
    predictions: Predictions
    truncated_examples: int


def score_model(model: Any, tokenizer: PreTrainedTokenizerBase, task: TaskSpec, examples: Sequence[Example],
                batch_size: int = 64) -> Scored:
    """Encode, predict and score `examples`; `model` is a Hugging Face classifier or anything called like one (an
    ONNX Runtime model, `biodistil.export.runtime`)."""
    encoded = encode_split(task, examples, tokenizer)
    predictions = predict(model, task, examples, encoded, collator_for(task, tokenizer), batch_size)
    return Scored(score(task, examples, predictions), predictions, encoded.truncated_examples)
