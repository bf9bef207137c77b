"""`biodistil finetune`: an encoder fine-tuned on a task of the task registry (a classifier head on the encoder,
trained with the one engine, model selection on dev, scored on test), and the functions other stages reuse.

Token classification (NER, PICO), sequence classification (single texts and pairs) and multi-label
classification share one path, built on `biodistil.tasks`: encode the split into features, train a
`ClassifierModule` with the engine, predict per example, score with the task's official metric.
`finetune_on_task` is shared by `finetune`, the `kd` baselines, studies, `evaluate` and the quick demo.
"""

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from safetensors import SafetensorError
from torch import nn
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as transformers_logging

from biodistil.config import ExportConfig, ModelConfig, RunConfig, Section, TrainConfig
from biodistil.data.formats import Example
from biodistil.errors import BiodistilError
from biodistil.export.card import write_model_card
from biodistil.io import atomic_write_json, jsonable, number
from biodistil.paths import recorded
from biodistil.tasks.encoding import collator_for, encode_split, fit_length_to_model, model_inputs
from biodistil.tasks.prediction import Predictions, degenerate, predict, prediction_notes, write_predictions
from biodistil.tasks.recipe import TaskConfig, load_task_split, task_spec
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score, score_model
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
    except (OSError, SafetensorError) as err:
        raise BiodistilError(f"Could not load an encoder from {model_dir}: {err}") from None
    finally:
        transformers_logging.set_verbosity(quiet)


def steps_for_epochs(num_examples: int, batch_size: int, epochs: float) -> int:
    """Optimizer steps for `epochs` passes over `num_examples` at `batch_size` (at least one)."""
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
    markers_cut: dict[str, int] = field(default_factory=dict)  # relation examples whose markers did not all fit


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
    resume: bool = False,
    train_examples: int | None = None,
) -> FinetuneOutcome:
    """Fine-tune an encoder on a task: train split, model selection on dev (task metric), score on test.

    `epochs` sets cfg.max_steps from the training-set size; with a dev split, the dev score is computed every
    `cfg.eval_every` steps (default: once per epoch), the best weights are kept and training stops after
    `patience` evaluations without gain. Cross-validation tasks (no dev split) train for the full budget.
    `train_examples` keeps a seeded subset of the training split only (a labelled budget; `max_examples` caps
    every split). `select_metric` chooses the dev score used for selection (default: the task's headline, e.g.
    accuracy for BioASQ; the transfer study selects on AUROC). `resume` continues from the latest checkpoint in
    `run_dir`.
    """
    from accelerate.utils import set_seed

    from biodistil.models.loading import load_tokenizer
    from biodistil.training.engine import Selection

    set_seed(seed)
    tokenizer = load_tokenizer(str(model_name_or_path))
    task = fit_length_to_model(task, model_name_or_path)
    limits = {"train": train_examples or max_examples, "dev": max_examples, "test": max_examples}
    splits = {name: read_split(task, name, data_root, fold, limit) for name, limit in limits.items()}
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
                         selection=selection, resume=resume)
    model.to(engine.accelerator.device)
    dev_scores = evaluate_fn(ClassifierModule(model)) if evaluate_fn else {}
    predictions = predict(model, task, splits["test"], encoded["test"], collate, cfg.batch_size * 2)
    truncated = {name: split.truncated_examples for name, split in encoded.items()}
    markers_cut = {name: split.markers_cut for name, split in encoded.items() if split.markers_cut}
    return FinetuneOutcome(model, tokenizer, trained, dev_scores, score(task, splits["test"], predictions),
                           predictions, splits["test"], truncated, markers_cut)


def init_model_path(name_or_path: str, layers: list[int] | None, run_dir: Path, reinitialise: bool = False,
                    seed: int = 0) -> str:
    """The model a run starts from: `name_or_path`, or with `layers` a shallower copy of its encoder made of those
    layers (0-based; e.g. a student from a teacher's alternate pre-trained layers), and with `reinitialise` the same
    architecture with freshly drawn weights (seeded; a no-pre-training baseline), written once to
    `<run>/init_model` with the tokenizer."""
    if layers is None and not reinitialise:
        return str(name_or_path)
    from biodistil.export.hf import export_model
    from biodistil.models.loading import load_encoder, load_tokenizer
    from biodistil.models.student import student_from_teacher_layers

    target = run_dir / "init_model"
    if not (target / "config.json").is_file():
        encoder = load_encoder(name_or_path)
        if layers is not None:
            encoder = student_from_teacher_layers(encoder, layers)
        if reinitialise:
            encoder = _fresh_weights(encoder, seed)
        export_model(encoder, load_tokenizer(name_or_path), target)
    return str(target)


def _fresh_weights(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """The same architecture with the weights its model class draws at initialisation, from `seed`."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    return AutoModel.from_config(model.config)


# ------------------------------------------------------------------------------------------ command


class FinetuneOptions(Section):
    """How long to fine-tune and whether to score the untrained model (S_init of the gap closed)."""

    epochs: float | None = Field(None, gt=0, description="set train.max_steps from the training-set size")
    patience: int | None = Field(None, ge=1, description="dev evaluations without gain before stopping")
    score_init: bool = Field(True, description="also score the model before training on the test set")


class FinetuneRecipe(Section):
    """`biodistil finetune`: fine-tune an encoder on a task; save a Hugging Face model, metrics, predictions."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig
    task: TaskConfig
    finetune: FinetuneOptions = Field(default_factory=FinetuneOptions)
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)


def run_finetune(recipe: FinetuneRecipe, resume: bool = False, stop_after: int | None = None) -> Path:
    """Fine-tune the recipe's encoder on its task: model selection on dev, scores and predictions on test,
    the untrained model's test scores (S_init), and the model exported in Hugging Face format."""
    from accelerate.utils import set_seed

    from biodistil.export.hf import export_model
    from biodistil.models.loading import check_model, load_tokenizer
    from biodistil.training.run import RunFolder, single_process

    if stop_after is not None:
        raise BiodistilError("finetune: --stop-after is not supported (interrupt it and continue with --resume)")
    single_process("finetune")
    check_model(recipe.model.name_or_path, "model.name_or_path")
    started = time.perf_counter()
    run = RunFolder(recipe.run.output_dir, recipe, resume)
    path = init_model_path(recipe.model.name_or_path, recipe.model.layers, run.path)
    task = fit_length_to_model(task_spec(recipe.task), path)
    init: dict[str, float] = {}
    if recipe.finetune.score_init:
        set_seed(recipe.run.seed)
        test = load_task_split(task, recipe.task, "test")
        init = score_model(build_classifier(path, task), load_tokenizer(path), task, test).scores if test else {}
    outcome = finetune_on_task(path, task, recipe.task.data_dir, recipe.train, run.path, recipe.run.seed,
                               recipe.task.fold, recipe.finetune.epochs, recipe.finetune.patience,
                               recipe.task.max_examples, resume=run.resume,
                               train_examples=recipe.task.train_examples)
    metrics = jsonable({"task": task.name, "metric": task.headline_key, "test": outcome.test_scores,
                        "dev": outcome.dev_scores, "init": init, "train": asdict(outcome.train),
                        "truncated_examples": outcome.truncated, "markers_cut": outcome.markers_cut,
                        "unpredicted_words": outcome.test_predictions.filled_words,
                        "degenerate": degenerate(task, outcome.test_predictions),
                        "wall_seconds": round(time.perf_counter() - started, 1)})
    if recipe.export.enabled:
        export_model(outcome.model, outcome.tokenizer, run.model_dir)
        metrics["model_dir"] = recorded(run.model_dir, run.path)
    words = sum(len(e.tokens) for e in outcome.test_examples) if task.kind == "token_classification" else None
    metrics["notes"] = notes = prediction_notes(task, outcome.test_predictions, outcome.truncated, words,
                                                        outcome.markers_cut)
    for note in notes:
        print(f"Warning: {note}", file=sys.stderr, flush=True)
    write_predictions(run.path / "test_predictions.jsonl", outcome.test_examples, outcome.test_predictions)
    atomic_write_json(run.path / "metrics.json", metrics)
    run.write_report(f"Fine-tuning on {task.name}", _report_rows(metrics, outcome, run.model_dir),
                     [f"**Warning:** {note}" for note in notes])
    if (run.model_dir / "config.json").is_file():
        write_model_card(run.path)
    run.write_summary(metrics)  # last: a summary marks the run finished
    return run.model_dir


def _report_rows(metrics: dict[str, Any], outcome: FinetuneOutcome, model_dir: Path) -> dict[str, object]:
    rows: dict[str, object] = {"task / metric": f"{metrics['task']} / {metrics['metric']}",
                               "steps": outcome.train.steps}
    for name in ("dev", "test", "init"):
        if metrics[name]:
            rows[name] = ", ".join(f"{k} {number(v):.4f}" for k, v in metrics[name].items())
    if metrics["degenerate"]:
        rows["test"] = f"{rows.get('test', '')} (degenerate: {metrics['degenerate']})"
    rows["model"] = f"`{model_dir}`" if "model_dir" in metrics else "not exported"
    return rows
