"""The task registry: one `TaskSpec` per biomedical task, shared by finetune, kd and evaluate.

Built-in tasks live in `builtin_tasks.yaml` next to this file. A user adds a dataset of a known format with a
few lines of YAML, either complete or starting from a built-in task:

    # my_disease.yaml
    extends: ncbi_disease              # optional: copy every field of a built-in task, then override
    name: my_disease
    files: {train: /data/mine/train.tsv, dev: /data/mine/devel.tsv, test: /data/mine/test.tsv}

and passes the file where a task name is expected: `get_task("my_disease.yaml")`. Relative file paths are
relative to the data folder; absolute paths are used as they are. Cross-validation tasks set `cv_folds: N`
and put `{fold}` in their paths (folds are numbered 1..N); `load_split("train", root, fold=3)`. Seeded subsets of
a split: `biodistil.tasks.splits.read_split`.
"""

import functools
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from biodistil.config import deep_merge
from biodistil.data.formats import (
    READERS,
    TOKEN_FORMATS,
    Example,
    TokenExample,
    parse_ner_record,
    parse_text_record,
    read_examples,
    reader_options,
)
from biodistil.data.paths import require_file, resolve_data_root
from biodistil.errors import BiodistilError
from biodistil.io import load_yaml
from biodistil.tasks.metrics import METRICS, Metrics
from biodistil.tasks.spans import (
    SPAN_FORMATS,
    SpanSettings,
    SpanSplit,
    labels_from_documents,
    read_span_split,
    span_reader_options,
    tags_for_types,
    types_of_tags,
)

BUILTIN_TASKS_FILE = Path(__file__).with_name("builtin_tasks.yaml")

TaskKind = Literal["token_classification", "sequence_classification", "multilabel_classification"]
Split = Literal["train", "dev", "test"]
SPLIT_ALIASES = {"devel": "dev", "validation": "dev", "valid": "dev"}
HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
FOLD_PLACEHOLDER = "{fold}"
# What each kind of task gives its metric (first word of MetricSpec.inputs).
_METRIC_INPUTS = {
    "token_classification": "tag",
    "sequence_classification": "labels",
    "multilabel_classification": "0/1",
}


class Hyperparameters(BaseModel):
    """Default fine-tuning hyper-parameters of a task (a recipe may override them)."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(5e-5, gt=0)
    batch_size: int = Field(32, ge=1)
    epochs: int = Field(3, ge=1)
    early_stopping_patience: int | None = Field(
        None, ge=1, description="evaluations without improvement; None = off"
    )


class TaskSpec(BaseModel):
    """One evaluation task: where its files are, how to read them, its labels, metric and defaults.

    `truncation` says what to do with token sequences longer than `max_length` sub-words: "truncate" (the
    cut words are predicted as O and counted; callers must report the count) or "split" (the sentence is cut
    into windows of whole words, see `biodistil.data.alignment.chunk_words`). `label_policy` is the NER
    sub-word labelling policy ("first" or "all"). A task of a span format (brat, pubtator, bioc, span_jsonl:
    documents with character-offset entities, `biodistil.tasks.spans`) may give its labels as entity types, or
    none (read from the train split's documents), and says in `spans` how its documents become tagged sentences.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    kind: TaskKind
    format: str
    files: dict[Split, str]
    cv_folds: int | None = Field(None, ge=2)
    labels: list[str] = Field(default_factory=list)
    metric: str
    metric_options: dict[str, Any] = Field(default_factory=dict)
    reader_options: dict[str, Any] = Field(default_factory=dict)
    max_length: int = Field(128, ge=8)
    truncation: Literal["truncate", "split"] = "truncate"
    label_policy: Literal["first", "all"] = "first"
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    hub_dataset: str | None = None
    hub_config: str | None = None
    spans: SpanSettings = Field(default_factory=SpanSettings)

    # ------------------------------------------------------------------------------- validation

    @field_validator("files", mode="before")
    @classmethod
    def _normalise_splits(cls, files: Any) -> Any:
        if isinstance(files, dict):
            return {SPLIT_ALIASES.get(str(k), k): v for k, v in files.items()}
        return files

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_are_strings(cls, labels: Any) -> Any:
        if isinstance(labels, list):
            odd = [v for v in labels if not isinstance(v, str)]
            if odd:
                raise ValueError(
                    f"labels must be strings; quote {odd} in YAML (yes/no/0/1/False are not strings)"
                )
        return labels

    @model_validator(mode="before")
    @classmethod
    def _types_as_tags(cls, fields: Any) -> Any:
        """A span task's labels given as entity types ([Chemical, Disease]) become O, B-Chemical, I-Chemical, ..."""
        if isinstance(fields, dict) and fields.get("format") in SPAN_FORMATS:
            labels = fields.get("labels")
            if isinstance(labels, list) and labels and "O" not in labels and all(isinstance(v, str) for v in labels):
                return {**fields, "labels": tags_for_types(labels)}
        return fields

    @model_validator(mode="after")
    def _consistent(self) -> "TaskSpec":
        self._check_format()
        self._check_metric()
        self._check_files()
        self._check_labels()
        return self

    def _check_format(self) -> None:
        if self.format not in READERS and self.format not in SPAN_FORMATS:
            raise ValueError(f"format '{self.format}' is unknown; known formats: {sorted(READERS | SPAN_FORMATS)}")
        is_token = self.kind == "token_classification"
        if is_token != (self.format in TOKEN_FORMATS | SPAN_FORMATS):
            raise ValueError(f"format '{self.format}' does not suit a {self.kind} task")
        accepted = span_reader_options(self.format) if self.is_span_task else reader_options(self.format)
        unknown = set(self.reader_options) - set(accepted)
        if unknown:
            raise ValueError(f"reader_options {sorted(unknown)} unknown to '{self.format}' (accepted: {accepted})")
        if self.truncation == "split" and not is_token:
            raise ValueError("truncation 'split' is only for token_classification tasks; use 'truncate'")

    def _check_metric(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric '{self.metric}' is unknown; known metrics: {sorted(METRICS)}")
        if METRICS[self.metric].inputs.split(" ")[0] != _METRIC_INPUTS[self.kind]:
            raise ValueError(
                f"metric '{self.metric}' scores {METRICS[self.metric].inputs}, not a {self.kind} task"
            )
        unknown = set(self.metric_options) - set(METRICS[self.metric].options)
        if unknown:
            raise ValueError(
                f"metric_options {sorted(unknown)} unknown to '{self.metric}' "
                f"(accepted: {list(METRICS[self.metric].options)})"
            )
        if "negative_labels" in METRICS[self.metric].options and self.labels:
            default = inspect.signature(METRICS[self.metric].function).parameters["negative_labels"].default
            negatives = [str(n) for n in self.metric_options.get("negative_labels", default)]
            if not set(negatives) & set(self.labels):
                raise ValueError(
                    f"metric '{self.metric}' leaves out the negative class {negatives}, which is not among the labels "
                    f"{self.labels}; set metric_options.negative_labels to the task's negative label(s), or it "
                    "would be scored as a positive class"
                )

    def _check_files(self) -> None:
        if not self.files:
            raise ValueError("files must name at least one split (train, dev, test)")
        for split, path in self.files.items():
            has_fold = FOLD_PLACEHOLDER in path
            if self.cv_folds and not has_fold:
                raise ValueError(f"files.{split} must contain {FOLD_PLACEHOLDER} since cv_folds is set")
            if not self.cv_folds and has_fold:
                raise ValueError(
                    f"files.{split} contains {FOLD_PLACEHOLDER}; set cv_folds for a cross-validation task"
                )

    def _check_labels(self) -> None:
        if not self.labels and not self.is_span_task:
            raise ValueError("labels must name at least one label (a span task may leave them out)")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels contain duplicates: {self.labels}")
        if self.kind == "token_classification" and self.labels and "O" not in self.labels:
            raise ValueError("a token_classification task needs the outside tag 'O' among its labels")

    # ------------------------------------------------------------------------------ properties

    @property
    def is_span_task(self) -> bool:
        """True when the task's files are span-annotated documents (brat, pubtator, bioc, span_jsonl)."""
        return self.format in SPAN_FORMATS

    @property
    def label_to_id(self) -> dict[str, int]:
        """Label (tag) → class id, in the order of `labels`."""
        return {label: index for index, label in enumerate(self.labels)}

    @property
    def id_to_label(self) -> dict[int, str]:
        """Class id → label (tag)."""
        return dict(enumerate(self.labels))

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def headline_key(self) -> str:
        """The key of the headline number in `compute_metrics`' result."""
        return METRICS[self.metric].headline

    @property
    def folds(self) -> list[int]:
        """Fold numbers 1..cv_folds of a cross-validation task, [] otherwise."""
        return list(range(1, self.cv_folds + 1)) if self.cv_folds else []

    @property
    def b_to_i(self) -> dict[int, int]:
        """Id of each B tag → id of the matching I tag (B → I, B-X → I-X), for label policy "all"."""
        ids = self.label_to_id
        pairs = {tag: "I" + tag[1:] for tag in self.labels if tag.startswith("B") and tag[1:2] in ("", "-")}
        return {ids[b]: ids[i] for b, i in pairs.items() if i in ids}

    # ---------------------------------------------------------------------------------- files

    def _relative_path(self, split: str, fold: int | None) -> str:
        split = SPLIT_ALIASES.get(split, split)
        if split not in self.files:
            raise BiodistilError(
                f"Task '{self.name}' has no split '{split}'; its splits are {sorted(self.files)}"
            )
        template = self.files[split]  # type: ignore[index]
        if not self.cv_folds:
            if fold is not None:
                raise BiodistilError(f"Task '{self.name}' is not a cross-validation task; do not pass a fold")
            return template
        if fold not in self.folds:
            raise BiodistilError(
                f"Task '{self.name}' needs a fold in 1..{self.cv_folds} for split '{split}', got {fold!r}"
            )
        return template.replace(FOLD_PLACEHOLDER, str(fold))

    def missing_files(self, data_root: str | Path | None = None) -> list[str]:
        """Absent task files (all splits, all folds); every relative one when the data folder is absent."""
        try:
            root: Path | None = resolve_data_root(data_root)
        except BiodistilError:
            root = None
        missing = []
        for split in self.files:
            for fold in self.folds or [None]:
                relative = Path(self._relative_path(split, fold))
                if relative.is_absolute():
                    path: Path | None = relative
                else:
                    path = root / relative if root is not None else None
                if path is None or not (path.is_file() or (self.format == "brat" and path.is_dir())):
                    missing.append(str(path or relative))
        return missing

    def is_available(self, data_root: str | Path | None = None) -> bool:
        """True when every file of the task is present (recipes skip absent tasks with a note)."""
        return not self.missing_files(data_root)

    # ---------------------------------------------------------------------------------- loading

    def load_split(
        self, split: str, data_root: str | Path | None = None, fold: int | None = None
    ) -> list[Example]:
        """Read one split (of one fold) into TokenExample / TextExample records, labels checked.

        When the local file is absent and the task names a `hub_dataset`, the split is loaded from the hub;
        offline, that gives an error saying so and asking for a local path.
        """
        self._relative_path(split, fold)  # a bad split or fold is an error, never a reason to try the hub
        if self.is_span_task:
            return list(self.span_split(split, data_root, fold).examples)
        try:
            path = self._local_file(split, data_root, fold)
        except BiodistilError as err:
            if self.hub_dataset and not self.cv_folds:
                return self.load_hub_split(split, local_error=str(err))
            raise
        examples = read_examples(self.format, path, **self._reader_options())
        if not examples and split in ("train", "test"):
            raise BiodistilError(f"{path}: the {split} file of task '{self.name}' holds no examples (expected "
                                 f"{self.format} records); check the file, or the task's files.{split}")
        if not examples:
            print(f"Warning: {path}: the {split} file of task '{self.name}' holds no examples; no model selection "
                  "on it (the last step's weights are kept)", file=sys.stderr, flush=True)
        self.check_labels(examples, path)
        return examples

    def span_split(self, split: str, data_root: str | Path | None = None, fold: int | None = None) -> SpanSplit:
        """A span task's split: its gold documents, their tagged sentences and what became of each gold entity
        (printed once per split and process)."""
        path = self._local_file(split, data_root, fold)
        types = types_of_tags(self.labels) if self.labels else None
        sharing = [name for name in self.files if self.files[name] == self.files[split]]  # type: ignore[index]
        read = read_span_split(self.format, path, self.reader_options, self.spans, split, sharing, types,
                               f"Task {self.name} {split}: ")
        if not read.examples and split in ("train", "test"):
            raise BiodistilError(f"{path}: the {split} split of task '{self.name}' holds no documents")
        return read

    def _local_file(self, split: str, data_root: str | Path | None, fold: int | None) -> Path:
        relative = self._relative_path(split, fold)
        if self.format == "brat" and not Path(relative).is_absolute():
            folder = resolve_data_root(data_root) / relative
            if folder.is_dir():
                return folder
        if not Path(relative).is_absolute():
            return require_file(resolve_data_root(data_root), relative)
        if self.format == "brat" and Path(relative).is_dir():
            return Path(relative)
        if not Path(relative).is_file():
            raise BiodistilError(f"Expected data file {relative} (absolute path in task '{self.name}').")
        return Path(relative)

    def _reader_options(self) -> dict[str, Any]:
        options = dict(self.reader_options)
        if self.format == "blurb_ner_jsonl" and "tag_names" not in options:
            options["tag_names"] = list(self.labels)  # integer tags are ids into the task's own tag list
        return options

    def check_labels(self, examples: Sequence[Example], source: str | Path) -> None:
        """Every example's label (tag) must belong to the task; unlabelled (None) examples are allowed."""
        known = self.label_to_id
        for index, example in enumerate(examples):
            problem = self._label_problem(example, known)
            if problem:
                raise BiodistilError(
                    f"{source}: example {index} (id {example.id}): {problem} "
                    f"(task '{self.name}' labels: {self.labels})"
                )

    def _label_problem(self, example: Example, known: dict[str, int]) -> str | None:
        if isinstance(example, TokenExample):
            unknown = sorted(set(example.tags) - set(known))
            return f"unknown tag(s) {unknown}" if unknown else None
        label = example.label
        if label is None:
            return None
        if self.kind == "multilabel_classification":
            if not isinstance(label, list) or len(label) != self.num_labels:
                return f"label {label!r:.80} should be a list of {self.num_labels} 0/1 values"
            return None
        if not isinstance(label, str) or label not in known:
            return f"unknown label {label!r:.80}"
        return None

    def load_hub_split(self, split: str, local_error: str = "") -> list[Example]:
        """Load a split from the Hugging Face hub (`hub_dataset`, `hub_config`); clear error when offline."""
        if not self.hub_dataset:
            raise BiodistilError(f"Task '{self.name}' names no hub_dataset; pass a local path (--data DIR).")
        split = SPLIT_ALIASES.get(split, split)
        try:
            rows = _load_hub_rows(self.hub_dataset, self.hub_config, HUB_SPLITS.get(split, split))
        except Exception as err:
            raise BiodistilError(
                f"{local_error + ' ' if local_error else ''}Task '{self.name}': the Hugging Face hub cannot "
                f"be reached or has no '{self.hub_dataset}' ({self.hub_config or 'default'}) split '{split}' "
                f"({type(err).__name__}: {str(err)[:200]}). Pass a local path instead: --data DIR holding "
                f"{self.files}, or a task YAML whose files point at your copies."
            ) from None
        return self._hub_examples(rows)

    def _hub_examples(self, rows: Sequence[dict[str, Any]]) -> list[Example]:
        source = Path(f"hub:{self.hub_dataset}/{self.hub_config or ''}")
        tag_names = self.reader_options.get("tag_names", list(self.labels))
        examples: list[Example] = []
        for index, row in enumerate(rows):
            if self.kind == "token_classification":
                examples.append(parse_ner_record(dict(row), index, source, index + 1, tag_names))
            else:
                examples.append(parse_text_record(dict(row), index, source, index + 1))
        self.check_labels(examples, source)
        return examples

    # ---------------------------------------------------------------------------------- scoring

    def compute_metrics(self, y_true: Sequence[Any], y_pred: Sequence[Any], **extra: Any) -> Metrics:
        """The task's metric with its options; `extra` adds inputs such as positive_scores for BioASQ."""
        return METRICS[self.metric](y_true, y_pred, **self.metric_options, **extra)

    def example_targets(self, examples: Sequence[Example]) -> list[Any]:
        """Gold values in the form the metric expects: tag lists, labels, or 0/1 vectors."""
        return [e.tags if isinstance(e, TokenExample) else e.label for e in examples]


def _load_hub_rows(dataset: str, config: str | None, split: str) -> Sequence[dict[str, Any]]:
    """Rows of a hub dataset split (separate so tests can replace it)."""
    import datasets

    return datasets.load_dataset(dataset, config, split=split)


# ------------------------------------------------------------------------------------------- registry


def _yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        line = err.problem_mark.line + 1 if err.problem_mark else "?"
        raise BiodistilError(
            f"{path}:{line}: invalid YAML ({err.problem}); expected a task mapping"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise BiodistilError(f"{path}: cannot read task file ({err})") from None
    if not isinstance(data, dict):
        raise BiodistilError(f"{path}:1: expected a YAML mapping of task fields, got {type(data).__name__}")
    return data


def _validate(fields: dict[str, Any], origin: str) -> TaskSpec:
    try:
        return TaskSpec.model_validate(fields)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'task'}: {e['msg']}" for e in err.errors())
        raise BiodistilError(f"{origin}: invalid task definition: {problems}") from None


@functools.cache
def _builtin_tasks() -> dict[str, TaskSpec]:
    data = _yaml_mapping(BUILTIN_TASKS_FILE)
    tasks = data.get("tasks")
    if not isinstance(tasks, dict):
        raise BiodistilError(f"{BUILTIN_TASKS_FILE}: expected a 'tasks:' mapping of task name → definition")
    return {
        name: _validate({"name": name, **fields}, f"{BUILTIN_TASKS_FILE} (task '{name}')")
        for name, fields in tasks.items()
    }


def list_tasks() -> list[str]:
    """Names of the built-in tasks."""
    return sorted(_builtin_tasks())


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Fields of `override` replace those of `base`; `hyperparameters` is merged key by key."""
    merged = {**base, **override}
    if isinstance(base.get("hyperparameters"), dict) and isinstance(override.get("hyperparameters"), dict):
        merged["hyperparameters"] = deep_merge(base["hyperparameters"], override["hyperparameters"])
    return merged


def load_task_file(path: str | Path) -> TaskSpec:
    """A task defined in a user's YAML file (all TaskSpec fields, or `extends: <built-in>` plus overrides)."""
    path = Path(path)
    fields = _one_task(_yaml_mapping(path), path)
    fields.setdefault("name", path.stem)
    base_name = fields.pop("extends", None)
    if base_name is not None:
        base = get_task(str(base_name)).model_dump(exclude={"name"})
        fields = _merge(base, fields)
    return _validate(fields, str(path))


def _one_task(fields: dict[str, Any], path: Path) -> dict[str, Any]:
    """A task file's fields. A file written as the built-in registry is (`tasks: {my_task: {...}}`) is read when it
    holds one task; several are refused with the expected form."""
    if set(fields) != {"tasks"}:
        return fields
    tasks = fields["tasks"]
    if isinstance(tasks, dict) and len(tasks) == 1:
        name, body = next(iter(tasks.items()))
        if isinstance(body, dict):
            return {"name": str(name), **body}
    found = f"{len(tasks)} tasks ({', '.join(map(str, tasks))})" if isinstance(tasks, dict) else "no task mapping"
    raise BiodistilError(f"{path}: a task file defines one task, but its `tasks:` holds {found}.\n"
                         "Expected at the top level: name: my_task, kind: token_classification, format: "
                         "biobert_ner_tsv, files: {train: train.tsv, test: test.tsv}, labels: [O, B, I], metric: "
                         "entity_f1\nor `tasks: {my_task: {...}}` holding that one task (one file per task).")


def with_labels(task: TaskSpec, data_root: str | Path | None = None) -> TaskSpec:
    """A span task without labels, with the BIO tags of the types its train split's documents use."""
    if task.labels or not task.is_span_task:
        return task
    split = "train" if "train" in task.files else next(iter(task.files))
    try:
        documents = task.span_split(split, data_root).documents
    except BiodistilError as err:
        raise BiodistilError(f"Task '{task.name}' names no labels, and its {split} documents to read them from cannot "
                             f"be read ({err}); give `labels:` (the entity types) in the task") from None
    return task.model_copy(update={"labels": labels_from_documents(documents)})


def get_task(name_or_yaml_path: str | Path) -> TaskSpec:
    """A built-in task by name, or a task from a YAML file; unknown names list the known tasks."""
    builtin = _builtin_tasks()
    key = str(name_or_yaml_path)
    if key in builtin:
        return with_labels(builtin[key].model_copy(deep=True))
    path = Path(key).expanduser()
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise BiodistilError(f"Task file {path} not found (expected a YAML task definition)")
        return with_labels(load_task_file(path))
    raise BiodistilError(
        f"Unknown task '{key}'; built-in tasks: {', '.join(sorted(builtin))} "
        "(or pass the path of a task YAML file)"
    )
