"""`finetune_on_task`: an encoder fine-tuned on a task of the task registry (a classifier head on the encoder,
trained with the one engine, model selection on dev, scored on test).

Token classification (NER, PICO), sequence classification (single texts and pairs) and multi-label
classification share one path, built on `biodistil.tasks`: encode the split into features, train a
`ClassifierModule` with the engine, predict per example, score with the task's official metric.
`finetune_on_task` is shared by `finetune`, studies, `evaluate` and the quick demo.

Under several processes (`accelerate launch` / `torchrun`: DDP through the engine) each process trains on its slice of
every global batch of `train.batch_size` × `train.grad_accumulation` × processes examples; dev selection and the
final scores are computed once, on the main process, and handed to the others (`training.processes`). The same
global batch gives the same run as one process, up to float rounding, when the model has no dropout (dropout masks
are drawn per process): a token task's loss is the mean over the labelled tokens of the whole global batch
(`ClassifierModule.loss_items`, weighed by the engine), not a mean of each process's means.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.config import TrainConfig
from biodistil.data.batch import AsBatch, Batch
from biodistil.data.formats import Example
from biodistil.errors import BiodistilError
from biodistil.finetune.selection import ScoringSplit, examples_per_step, select_on_dev
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.encoding import fit_length_to_model, model_inputs
from biodistil.tasks.prediction import Predictions
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import Scored
from biodistil.tasks.splits import read_split
from biodistil.training.engine import Engine, HeldOut, TrainData, TrainResult, make_accelerator
from biodistil.training.processes import computed_on_main


class ClassifierModule(nn.Module):
    """What the engine trains when fine-tuning: a classifier whose forward computes its own loss."""

    uses_kl_rows = False  # no distillation term: `train.compile` has no KL row kernel to compile here

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.model(**model_inputs(self.model, batch.inputs), labels=batch.labels).loss, {}

    def loss_items(self, batch: Batch) -> int:
        """What the loss averages over: labelled tokens (labels other than -100) in a token task, else examples."""
        labels = batch.labels
        return int((labels != -100).sum()) if labels.dtype == torch.long and labels.dim() == 2 else len(labels)


def steps_for_epochs(num_examples: int, batch_size: int, epochs: float) -> int:
    """Optimizer steps for `epochs` passes over `num_examples` at `batch_size` (at least one)."""
    return max(1, round(epochs * num_examples / batch_size))


@dataclass
class FinetuneOutcome:
    """A fine-tuned model and its scores; `test_predictions` (and `dev_predictions`, with a dev split) are per
    example, in file order."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    train: TrainResult
    dev_scores: dict[str, float]
    test_scores: dict[str, float]
    test_predictions: Predictions
    test_examples: list[Example]
    truncated: dict[str, int]
    markers_cut: dict[str, int] = field(default_factory=dict)  # relation examples whose markers did not all fit
    dev_predictions: Predictions | None = None
    dev_examples: list[Example] = field(default_factory=list)


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
    accelerator: Accelerator | None = None,
) -> FinetuneOutcome:
    """Fine-tune an encoder on a task: train split, model selection on dev (task metric), score on test.

    `epochs` sets cfg.max_steps from the training-set size and the global batch; with a dev split, the dev score is
    computed every `cfg.eval_every` steps (default: once per epoch), the best weights are kept and training stops
    after `patience` evaluations without gain. Cross-validation tasks (no dev split) train for the full budget.
    `train_examples` keeps a seeded subset of the training split only (a labelled budget; `max_examples` caps
    every split). `select_metric` chooses the dev score used for selection (default: the task's headline, e.g.
    accuracy for BioASQ; the transfer study selects on AUROC). `resume` continues from the latest checkpoint in
    `run_dir`. `accelerator` (default: one made for `cfg`) says which processes train together; every one of them
    returns the same outcome (see the module docstring).
    """
    from accelerate.utils import set_seed

    from biodistil.models.loading import load_tokenizer

    accelerator = accelerator or make_accelerator(cfg.precision, run_dir, cfg.tensorboard, cfg.device)
    set_seed(seed)
    tokenizer = load_tokenizer(str(model_name_or_path))
    task = fit_length_to_model(task, model_name_or_path)
    splits = _read_splits(task, data_root, fold, max_examples, train_examples)
    scoring = {name: ScoringSplit.encode(task, examples, tokenizer, whole_entities=name == "train")
               for name, examples in splits.items() if examples}
    train = scoring["train"]
    processes = accelerator.num_processes
    if epochs is not None:
        per_step = examples_per_step(cfg, processes)
        cfg = cfg.model_copy(update={"max_steps": steps_for_epochs(len(train.encoded), per_step, epochs)})
    chosen = select_on_dev(scoring.get("dev"), cfg, len(train.encoded), _classifier, select_metric, patience,
                           processes)
    model = build_classifier(model_name_or_path, task)
    engine = Engine(chosen.cfg, run_dir, seed, accelerator)
    trained = engine.fit(ClassifierModule(model), TrainData(train.encoded, AsBatch(train.collate)),
                         HeldOut(chosen.evaluate_fn, chosen.selection), resume=resume)
    model.to(accelerator.device)
    dev, test = computed_on_main(lambda: _final_scores(scoring, model, chosen.cfg.batch_size * 2))
    truncated = {name: split.encoded.truncated_examples for name, split in scoring.items()}
    markers_cut = {name: split.encoded.markers_cut for name, split in scoring.items() if split.encoded.markers_cut}
    return FinetuneOutcome(model, tokenizer, trained, dev.scores if dev else {}, test.scores, test.predictions,
                           splits["test"], truncated, markers_cut, dev.predictions if dev else None,
                           splits.get("dev") or [])


def _final_scores(scoring: dict[str, ScoringSplit], model: PreTrainedModel,
                  batch_size: int) -> tuple[Scored | None, Scored]:
    """The trained model's scored dev split (None without one) and its scored test split."""
    dev = scoring["dev"].scored(model, batch_size) if "dev" in scoring else None
    return dev, scoring["test"].scored(model, batch_size)


def _read_splits(task: TaskSpec, data_root: str | Path | None, fold: int | None, max_examples: int | None,
                 train_examples: int | None) -> dict[str, list[Example]]:
    """The train, dev and test splits (dev may be empty: cross-validation tasks); train and test are needed."""
    limits = {"train": train_examples or max_examples, "dev": max_examples, "test": max_examples}
    splits = {name: read_split(task, name, data_root, fold, limit) for name, limit in limits.items()}
    if not splits["train"] or not splits["test"]:
        raise BiodistilError(f"Task {task.name}: the train and test splits are needed (fold={fold})")
    return splits


def _classifier(module: ClassifierModule) -> PreTrainedModel:
    return module.model
