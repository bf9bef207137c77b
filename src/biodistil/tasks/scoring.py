"""Scoring predictions with the task's official metric (`biodistil.tasks.metrics`), and a model on labelled
examples in one call: encode, predict, score, exactly as fine-tuning scores its test set; a span task's
character-level scores on its original documents and its gold entities' counts (`span_task_record`)."""

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


def span_task_record(task: TaskSpec, examples: Sequence[Example], predicted_tags: Sequence[Sequence[str]],
                     split: str = "test", data_root: Any = None, fold: int | None = None) -> dict[str, Any]:
    """What a span task's run records beside its token-level scores: what became of the gold entities of each split
    on the way to tags (`entity_alignment`), and entity scores at the character level on the split's original
    documents (`character`: strict and overlap, per type, micro and macro; `character_f1`: the headline numbers).
    With a subset of the split's sentences (max_examples), the character scores are left out and a note says so."""
    from biodistil.documents.alignment import documents_from_tags
    from biodistil.documents.scoring import character_scores, headline
    from biodistil.tasks.spans import types_of_tags

    splits = {name: task.span_split(name, data_root, fold) for name in task.files}
    record: dict[str, Any] = {"entity_alignment": {name: read.alignment.record() for name, read in splits.items()}}
    gold = splits[split]
    if [example.id for example in examples] != [example.id for example in gold.examples]:
        record["character_note"] = (f"character-level scores need the whole {split} split ({len(gold.examples)} "
                                    f"sentences; {len(examples)} scored)")
        return record
    predicted = documents_from_tags(gold.documents, gold.examples, predicted_tags)
    scores = character_scores(gold.documents, predicted, types_of_tags(task.labels))
    return {**record, "character": scores, "character_f1": headline(scores)}
