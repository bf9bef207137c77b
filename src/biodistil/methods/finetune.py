"""Fine-tuning an encoder on a task of the task registry: a classifier head on the encoder, trained with the one
engine, model selection on dev, scored on test.

Token classification (NER, PICO), sequence classification (single texts and pairs) and multi-label
classification share one path, built on `biodistil.tasks`: encode the split into features, train a
`ClassifierModule` with the engine, predict per example, score with the task's official metric.
`finetune_on_task` is shared by `finetune`, the `kd` baselines, studies, `evaluate` and the quick demo.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as transformers_logging

from biodistil.config import TrainConfig
from biodistil.data.formats import Example
from biodistil.errors import BiodistilError
from biodistil.tasks.encoding import collator_for, encode_split, fit_length_to_model, model_inputs
from biodistil.tasks.prediction import Predictions, predict
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score
from biodistil.tasks.splits import read_split
from biodistil.training.engine import Engine, TrainResult


class ClassifierModule(nn.Module):
    """What the engine trains when fine-tuning: a classifier whose forward computes its own loss."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.model(**model_inputs(self.model, batch, keep=("labels",))).loss, {}


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
