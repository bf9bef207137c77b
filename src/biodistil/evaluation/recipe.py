"""The typed recipe of `biodistil evaluate` (and the settings of `biodistil bench`).

A recipe names models (Hub ids or folders, optionally with a short name) and tasks (built-in names or task
YAML files, optionally with per-task settings), how many seeds to run, and the fine-tuning settings that
replace the task definitions' defaults. Precedence, most specific first: the task's entry in the recipe,
the recipe's `train` section, the task definition's `hyperparameters`.

Command-line overrides are YAML values, so a list of models is one override:
`models=[runs/demo/teacher/model,runs/demo/student/model]`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from biodistil.config import LocalPath, ModelRef, RunConfig, Section, TaskRef, TrainConfig
from biodistil.embedded import EMBEDDED
from biodistil.paths import LABEL_CHARS, unique_labels

Family = Literal["ner", "relation_extraction", "document_classification", "question_answering", "pico"]
FAMILIES: tuple[str, ...] = ("ner", "pico", "relation_extraction", "document_classification", "question_answering")
FAMILY_TITLES = {
    "ner": "NER",
    "pico": "PICO",
    "relation_extraction": "relation extraction",
    "document_classification": "document classification",
    "question_answering": "question answering",
}
# The BLURB family of a task follows from its official metric (a recipe entry may say otherwise).
METRIC_FAMILY = {
    "entity_f1": "ner",
    "token_macro_f1": "pico",
    "binary_prf": "relation_extraction",
    "micro_f1_excluding": "relation_extraction",
    "hoc_example_f1": "document_classification",
    "accuracy_macro_f1": "question_answering",
    "accuracy_auroc": "question_answering",
}


class ModelEntry(Section):
    """A model to evaluate: a Hub id or a local folder, and the short name used in folders and reports."""

    path: ModelRef = Field(min_length=1, description="Hub id, local model folder or embedded model name")
    name: str | None = Field(None, description="short name (default: derived from the path)")
    layers: list[int] | None = Field(None, description="evaluate a shallower copy made of these layers (0-based) "
                                                       "of the model, e.g. [0, 2, 4]")
    reinitialise: bool = Field(False, description="draw fresh weights for the architecture (seeded by run.seed): "
                                                  "the same model with no pre-training, a baseline")

    @model_validator(mode="before")
    @classmethod
    def _embedded_models_keep_their_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("name") is None and data.get("path") in EMBEDDED:
            return {**data, "name": data["path"]}
        return data

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, name: str | None) -> str | None:
        if name is not None and (not name or LABEL_CHARS.search(name) or name.startswith(".")):
            raise ValueError(f"model name '{name}' must use only letters, digits, '.', '_' and '-'")
        return name


class TaskEntry(Section):
    """A task to evaluate on (built-in name or task YAML file), with optional per-task settings."""

    name: TaskRef = Field(min_length=1, description="built-in task name or path of a task YAML file")
    family: Family | None = Field(None, description="BLURB family (default: from the task's metric)")
    learning_rate: float | None = Field(None, gt=0)
    batch_size: int | None = Field(None, ge=1)
    epochs: float | None = Field(None, gt=0)
    early_stopping_patience: int | None = Field(None, ge=0, description="0 = no early stopping")
    max_examples: int | None = Field(None, ge=1, description="cap on the examples of every split (smoke runs)")
    max_folds: int | None = Field(None, ge=1, description="cross-validation tasks: run only folds 1..N")
    label_policy: Literal["first", "all"] | None = Field(None, description="NER sub-word labels (task default)")
    truncation: Literal["truncate", "split"] | None = None
    max_length: int | None = Field(None, ge=8)


class EvalTrainConfig(TrainConfig):
    """Fine-tuning settings for every (model, task, seed) cell.

    `learning_rate`, `batch_size`, `epochs` and `early_stopping_patience` left empty come from each task's
    definition. The number of steps follows from the epochs (`max_steps` is not used). The dev set is scored
    with the task metric once per epoch (`eval_every: 0`) or every N steps; the best weights are kept.
    """

    learning_rate: float | None = Field(None, gt=0, description="default: each task's")  # type: ignore[assignment]
    batch_size: int | None = Field(None, ge=1, description="default: each task's")  # type: ignore[assignment]
    epochs: float | None = Field(None, gt=0, description="default: each task's")
    early_stopping_patience: int | None = Field(None, ge=0, description="default: each task's; 0 = off")
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    eval_every: int = Field(0, ge=0, description="0 = score the dev set once per epoch")
    save_every: int = Field(0, ge=0, description="0 = no intermediate checkpoints (they are deleted anyway)")
    keep_checkpoints: int = Field(1, ge=1)
    log_every: int = Field(10, ge=1)
    tensorboard: bool = False

    def for_cell(self, learning_rate: float, batch_size: int) -> TrainConfig:
        """The plain TrainConfig that `finetune_on_task` takes, with this cell's learning rate and batch size."""
        fields = self.model_dump(exclude={"learning_rate", "batch_size", "epochs", "early_stopping_patience"})
        return TrainConfig(**fields, learning_rate=learning_rate, batch_size=batch_size)


class EvalDataConfig(Section):
    """Where the task files are, and caps for quick runs."""

    root: LocalPath | None = Field(None, description="data folder (default: $BIODISTIL_DATA, else ../shared/data)")
    max_examples: int | None = Field(
        None, ge=1, description="cap on the examples of every split; scores are then not comparable to papers"
    )
    max_folds: int | None = Field(None, ge=1, description="cross-validation tasks: run only folds 1..N")
    skip_missing: bool = Field(True, description="skip tasks whose files are absent (with a note); else an error")


class BenchConfig(Section):
    """Efficiency benchmark: latency at a small batch and throughput at a large one, per sequence length."""

    enabled: bool = Field(False, description="evaluate: run the benchmark on the recipe's models at the end")
    lengths: list[int] = Field(default_factory=lambda: [128, 512], min_length=1)
    latency_batch: int = Field(1, ge=1)
    throughput_batch: int = Field(32, ge=1)
    warmup: int = Field(2, ge=0, description="untimed runs per model and setting")
    repeats: int = Field(10, ge=1, description="timed runs per model and setting")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1, description="CPU threads for torch (default: torch's)")
    memory: Literal["isolated", "in-process", "off"] = Field(
        "isolated", description="CPU peak memory: each model and shape in a fresh process (isolated), in the timing "
        "process, or not measured")

    @field_validator("lengths")
    @classmethod
    def _lengths_positive(cls, lengths: list[int]) -> list[int]:
        if any(length < 2 for length in lengths):
            raise ValueError(f"sequence lengths must be at least 2 (CLS and SEP), got {lengths}")
        return lengths


class ReportConfig(Section):
    """How the report is built."""

    reference: str | None = Field(None, description="name of the reference model (default: the first model)")


class EvaluateRecipe(Section):
    """`biodistil evaluate`: fine-tune every model on every task for N seeds, then report (and benchmark)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(output_dir="runs/evaluate"))
    models: list[ModelEntry] = Field(min_length=1, description="Hub ids or folders, or {name, path} entries")
    tasks: list[TaskEntry] = Field(min_length=1, description="task names or task YAML files, or {name, ...}")
    num_seeds: int = Field(3, ge=1, description="seeds run.seed, run.seed + 1, ...")
    train: EvalTrainConfig = Field(default_factory=EvalTrainConfig)
    data: EvalDataConfig = Field(default_factory=EvalDataConfig)
    save_models: bool = Field(False, description="keep every fine-tuned model (disk!) in its cell folder")
    bench: BenchConfig = Field(default_factory=BenchConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)

    @field_validator("models", mode="before")
    @classmethod
    def _models_from_strings(cls, models: Any) -> Any:
        return [{"path": m} if isinstance(m, str) else m for m in models] if isinstance(models, list) else models

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks_from_strings(cls, tasks: Any) -> Any:
        return [{"name": t} if isinstance(t, str) else t for t in tasks] if isinstance(tasks, list) else tasks

    @model_validator(mode="after")
    def _names_unique(self) -> EvaluateRecipe:
        labels = self.model_labels()
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"tasks are listed twice: {sorted({n for n in names if names.count(n) > 1})}")
        if self.report.reference is not None and self.report.reference not in labels:
            raise ValueError(f"report.reference '{self.report.reference}' is not a model name; names: {labels}")
        return self

    @property
    def seeds(self) -> list[int]:
        return [self.run.seed + k for k in range(self.num_seeds)]

    def model_labels(self) -> list[str]:
        """Short, unique, folder-safe names of the models, in recipe order."""
        return unique_labels([(m.name, m.path) for m in self.models])

    def reference_label(self) -> str:
        return self.report.reference or self.model_labels()[0]
