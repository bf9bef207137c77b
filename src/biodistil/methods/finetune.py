"""Fine-tuning an encoder on a task of the task registry, and predicting with it.

Token classification (NER, PICO), sequence classification (single texts and pairs) and multi-label
classification share one path: encode the split into features, train a `ClassifierModule` with the one
engine, predict per example, score with the task's official metric. Long token sequences are split into
windows of whole words or truncated, as the task says; truncation is counted and reported, never silent.
"""

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as transformers_logging

from biodistil.config import TrainConfig
from biodistil.data.alignment import align_labels, chunk_words, tokenize_words, word_predictions
from biodistil.data.formats import TextExample, TokenExample
from biodistil.errors import BiodistilError
from biodistil.evaluation.tasks import TaskSpec, read_split
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
            enc = tokenize_words(tokenizer, words, truncation=True, max_length=task.max_length)
            word_ids = enc.word_ids()
            labels = align_labels(word_ids, [ids[t] for t in example.tags[start:end]], task.label_policy, b_to_i)
            encoded.features.append({**{k: list(v) for k, v in enc.items()}, "labels": labels})
            encoded.origins.append((index, start))
            encoded.word_ids.append(word_ids)
    return encoded


def _pieces_per_word(tokenizer, words: Sequence[str]) -> list[int]:
    word_ids = tokenize_words(tokenizer, words, add_special_tokens=False).word_ids()
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
        # longest_first cuts the longer segment (the passage of a QA pair) first, and never fails on a long question
        enc = tokenizer(example.text, example.text_pair, truncation="longest_first", max_length=task.max_length)
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
        return self.model(**model_batch(self.model, batch)).loss, {}


def model_batch(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`batch` without `token_type_ids` when the model's forward takes none (ModernBERT, DistilBERT): a tokenizer
    may produce them (a BERT tokenizer shared with a ModernBERT student), and such a model would not use them."""
    if "token_type_ids" not in batch or not isinstance(model, nn.Module):
        return batch
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        return batch
    return {key: value for key, value in batch.items() if key != "token_type_ids"}


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
    """Per-example predictions of a split; `model` is a Hugging Face model or anything called like one that
    returns `.logits` and has `.device` and `.eval()` (e.g. an ONNX Runtime model, `biodistil.export.runtime`)."""
    model.eval()
    device = model.device
    loader = DataLoader(encoded.features, batch_size=batch_size, collate_fn=collate)
    outputs: list[np.ndarray] = []
    for batch in loader:
        batch = {k: v.to(device) for k, v in model_batch(model, batch).items() if k != "labels"}
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


@dataclass
class FinetuneOutcome:
    """A fine-tuned model and its scores; `test_predictions` are per example, in file order."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    train: TrainResult
    dev_scores: dict[str, float]
    test_scores: dict[str, float]
    test_predictions: Predictions
    test_examples: list[Example]
    truncated: dict[str, int]


def finetune_on_task(
    model_name_or_path: str | Path,
    task: TaskSpec,
    data_root: str | Path | None,
    cfg: TrainConfig,
    run_dir: Path,
    seed: int,
    fold: int | None = None,
    epochs: float | None = None,
    patience: int | None = None,
    max_examples: int | None = None,
    select_metric: str | None = None,
) -> FinetuneOutcome:
    """Fine-tune an encoder on a task: train split, model selection on dev (task metric), score on test.

    `epochs` sets cfg.max_steps from the training-set size; with a dev split, the dev score is computed every
    `cfg.eval_every` steps (default: once per epoch), the best weights are kept and training stops after
    `patience` evaluations without gain. Cross-validation tasks (no dev split) train for the full budget.
    `select_metric` chooses the dev score used for selection (default: the task's headline, e.g. accuracy for
    BioASQ; the transfer study selects on AUROC).
    """
    from accelerate.utils import set_seed

    from biodistil.models.loading import load_tokenizer
    from biodistil.training.engine import Selection

    set_seed(seed)
    tokenizer = load_tokenizer(str(model_name_or_path))
    task = fit_length_to_model(task, model_name_or_path)
    splits = {name: read_split(task, name, data_root, fold, max_examples) for name in ("train", "dev", "test")}
    if not splits["train"] or not splits["test"]:
        raise BiodistilError(f"Task {task.name}: the train and test splits are needed (fold={fold})")
    encoded = {name: encode_split(task, examples, tokenizer) for name, examples in splits.items() if examples}
    collate = collator_for(task, tokenizer)
    per_epoch = max(1, len(encoded["train"]) // cfg.batch_size)
    updates: dict[str, Any] = {}
    if epochs is not None:
        updates["max_steps"] = steps_for_epochs(len(encoded["train"]), cfg.batch_size, epochs)
    if splits["dev"] and cfg.eval_every == 0:
        updates["eval_every"] = per_epoch
    cfg = cfg.model_copy(update=updates)
    model = build_classifier(model_name_or_path, task)
    engine = Engine(cfg, run_dir, seed)
    evaluate_fn = selection = None
    if splits["dev"]:
        def evaluate_fn(module: ClassifierModule) -> dict[str, float]:
            found = predict(module.model, task, splits["dev"], encoded["dev"], collate, cfg.batch_size * 2)
            return score(task, splits["dev"], found)

        selection = Selection(metric=select_metric or task.headline_key, mode="max", patience=patience)
    trained = engine.fit(ClassifierModule(model), encoded["train"], collate, evaluate_fn=evaluate_fn,
                         selection=selection)
    model.to(engine.accelerator.device)
    dev_scores = evaluate_fn(ClassifierModule(model)) if evaluate_fn else {}
    predictions = predict(model, task, splits["test"], encoded["test"], collate, cfg.batch_size * 2)
    truncated = {name: split.truncated_examples for name, split in encoded.items()}
    return FinetuneOutcome(model, tokenizer, trained, dev_scores, score(task, splits["test"], predictions),
                           predictions, splits["test"], truncated)


def init_model_path(name_or_path: str, layers: list[int] | None, run_dir: Path) -> str:
    """The model a run starts from: `name_or_path`, or with `layers` a shallower copy of its encoder made of those
    layers (0-based; e.g. a student from a teacher's alternate pre-trained layers), written once to
    `<run>/init_model` with the tokenizer."""
    if layers is None:
        return str(name_or_path)
    from biodistil.export.hf import export_model
    from biodistil.models.loading import load_encoder, load_tokenizer
    from biodistil.models.student import student_from_teacher_layers

    target = run_dir / "init_model"
    if not (target / "config.json").is_file():
        encoder = student_from_teacher_layers(load_encoder(name_or_path), layers)
        export_model(encoder, load_tokenizer(name_or_path), target)
    return str(target)


def fit_length_to_model(task: TaskSpec, model_name_or_path: str | Path) -> TaskSpec:
    """The task with max_length capped at what the model's position embeddings allow (truncation is counted)."""
    config = AutoConfig.from_pretrained(str(model_name_or_path))
    reserved = 2 if config.model_type in ("roberta", "xlm-roberta") else 0  # RoBERTa offsets positions by pad+1
    limit = int(getattr(config, "max_position_embeddings", task.max_length)) - reserved
    return task if task.max_length <= limit else task.model_copy(update={"max_length": limit})
