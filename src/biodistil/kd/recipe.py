"""Typed recipes of task-specific distillation: `transfer`, `kd` and `study` (`finetune`'s is in
`biodistil.finetune.command`).

Every class subclasses `biodistil.config.Section` (unknown keys are errors naming the valid ones) and reuses
`RunConfig`, `TrainConfig`, `ExportConfig`, `ModelConfig` and the `task:` section (`biodistil.tasks.recipe`);
load one with `biodistil.config.load_recipe`.
docs/task-specific.md explains each section with the equations of the losses.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import Field, model_validator

from biodistil.config import (
    ExportConfig,
    LocalPath,
    ModelConfig,
    ModelRef,
    NamesTeachers,
    RunConfig,
    Section,
    TaskRef,
    TeachersConfig,
    TrainConfig,
    resolve_paths,
)
from biodistil.kd.random_text import DEFAULT_STARTERS
from biodistil.paths import absolute
from biodistil.tasks.recipe import TaskConfig
from biodistil.term_specs import KD_SOFT_TERMS

SourceKind = Literal["in_domain", "task", "file", "text", "saved"]


class SourceConfig(Section):
    """Where transfer (or quiz) examples come from.

    in_domain: the target task's own split; task: a split of another registry task (e.g. pubmedqa);
    file: a task file of a known format (e.g. boolq_jsonl); text: plain text, one paragraph per line (split
    into sentences); saved: a transfer set written by `biodistil transfer`. A relative `path` is under the task's
    data folder (kind file, text) or the working folder (kind saved, made absolute when the recipe is read).
    """

    kind: SourceKind = "in_domain"
    task: TaskRef | None = Field(None, description="kind=task: registry task name or task YAML")
    split: Literal["train", "dev", "test"] = "train"
    path: str | None = Field(None, description="kind=file/text/saved")
    format: str | None = Field(None, description="kind=file: a reader of biodistil.data.formats, e.g. boolq_jsonl")
    reader_options: dict[str, Any] = Field(default_factory=dict)
    max_examples: int | None = Field(None, ge=1, description="keep N examples: a fixed random subset in file order "
                                                               "(kind=text: the first N texts)")
    sentences: bool = Field(True, description="kind=text: split paragraphs into sentences")

    @model_validator(mode="before")
    @classmethod
    def resolve_raw_paths(cls, raw: Any) -> Any:
        """A saved transfer set is a folder the user names: absolute, like every other path they give."""
        if isinstance(raw, dict) and raw.get("kind") == "saved" and isinstance(raw.get("path"), str):
            return {**raw, "path": absolute(raw["path"])}
        return raw

    @model_validator(mode="after")
    def _kind_has_its_inputs(self) -> SourceConfig:
        needs = {"task": ["task"], "file": ["path", "format"], "text": ["path"], "saved": ["path"]}
        missing = [name for name in needs.get(self.kind, []) if getattr(self, name) is None]
        if missing:
            raise ValueError(f"source kind '{self.kind}' needs {', '.join(missing)}")
        return self


class RandomConfig(Section):
    """Randomized text: a unigram model of the source passages; passages sampled word by word from it,
    questions = a starter word + words drawn uniformly from the vocabulary (pair tasks get both)."""

    size: int = Field(1000, ge=1, description="number of random examples")
    question_length: tuple[int, int] = Field((5, 12), description="words after the starter, inclusive range")
    passage_length: tuple[int, int] = Field((40, 120), description="words per passage, inclusive range")
    starters: list[str] = Field(default_factory=lambda: list(DEFAULT_STARTERS), min_length=1)
    lowercase: bool = True
    seed: int = 0

    @model_validator(mode="after")
    def _ranges(self) -> RandomConfig:
        for name in ("question_length", "passage_length"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be [min, max] with 1 <= min <= max, got {[low, high]}")
        return self


class TransferConfig(Section):
    """The transfer set the student learns the teacher's outputs on."""

    source: SourceConfig = Field(default_factory=SourceConfig)
    random: RandomConfig | None = Field(None, description="randomize: the source only feeds the unigram model")
    keep_labels: bool = Field(False, description="keep the source's gold labels (CE term, fine-tune baseline)")
    label_map: dict[str, str | None] = Field(
        default_factory=dict, description="source label -> task label; null drops those examples (keep_labels)"
    )
    pairs: bool | None = Field(None, description="text pairs? default: as the task's training data")
    labelled: int | None = Field(
        None, ge=1, description="keep_labels on a labelled budget only: the gold labels of the seeded subset of N "
        "training examples that task.train_examples: N fine-tunes on. With the whole training split as the source "
        "(kind in_domain) the rest of the split is unlabelled; with any other source (text, another task, random "
        "text) the budget is added to the source's examples, whose own labels are dropped (teacher term only)")

    @model_validator(mode="after")
    def _labels(self) -> TransferConfig:
        if self.random is not None and self.keep_labels and self.labelled is None:
            raise ValueError("a random transfer set has no labels; set keep_labels: false (or transfer.labelled to "
                             "add a labelled budget of the task's training split)")
        if self.labelled is not None:
            if not self.keep_labels:
                raise ValueError("transfer.labelled keeps the labels of a budget of examples: set keep_labels: true")
            if self.source.kind == "in_domain" and (self.source.split != "train" or self.source.max_examples):
                raise ValueError("transfer.labelled with an in-domain source needs the whole training split "
                                 "(split train, no max_examples)")
        return self

    def budget_beside_source(self) -> bool:
        """Whether the labelled budget is added to the source (any source but the task's own training split)."""
        return self.labelled is not None and (self.random is not None or self.source.kind != "in_domain")


class PatientConfig(Section):
    """PatientKD: L += γ·Σ_i MSE(normalised [CLS] of student layer i, normalised [CLS] of teacher layer g(i))."""

    gamma: float = Field(100.0, ge=0)
    layer_map: Literal["skip", "last"] = Field("skip", description="PKD-Skip (every k-th layer) or PKD-Last")


class KDOptions(TeachersConfig):
    """The distillation loss: L = α·soft + β·CE(y, z_S) (+ γ·PatientKD), and how several teachers teach it."""

    soft_loss: Literal[(*KD_SOFT_TERMS, "none")] = Field(  # biodistil.term_specs: TermSpec.kd_soft
        "hinton", description="hinton: T²·KL; logit_mse; sigmoid: label-free binary KD; none: gold labels only"
    )
    alpha: float = Field(1.0, ge=0)
    beta: float = Field(0.0, ge=0, description="weight of the CE with gold labels (needs transfer.keep_labels)")
    temperature: float = Field(2.0, gt=0)
    teacher_outputs: Literal["auto", "cached", "online"] = Field(
        "auto", description="cached: computed once and stored on disk; online: teacher run every step; "
        "auto: online for meta-learning, else cached",
    )
    cache_dir: LocalPath | None = Field(None, description="teacher store folder; default ~/.cache/biodistil/teacher")
    epochs: float | None = Field(None, gt=0, description="set train.max_steps from the transfer-set size")
    patient: PatientConfig | None = None
    select_on_dev: bool = Field(False, description="score the task's dev split every train.eval_every steps "
                                                   "and keep the best weights")

    @model_validator(mode="after")
    def _consistent(self) -> KDOptions:
        if self.soft_loss == "none" and self.beta == 0:
            raise ValueError("soft_loss 'none' trains on gold labels only: set beta > 0")
        if self.soft_loss == "none" and self.patient is not None:
            raise ValueError("patient needs a teacher; soft_loss 'none' uses none")
        return self


class MetaConfig(Section):
    """MetaDistil / MetaAdaptiveKD: the teacher (and, adaptive, α and β) learns from a pilot student's quiz loss."""

    mode: Literal["metadistil", "adaptive"] = "metadistil"
    order: Literal["second", "first"] = Field(
        "second", description="second: exact meta-gradient through the pilot step; first: finite-difference "
        "approximation with first-order gradients only",
    )
    teacher_learning_rate: float = Field(1e-5, gt=0)
    weights_learning_rate: float = Field(1e-2, gt=0, description="adaptive: learning rate of α and β")
    pilot_learning_rate: float | None = Field(None, gt=0, description="pilot SGD step; default train.learning_rate")
    pilot_batches: int | None = Field(
        None, ge=1, description="training batches per pilot step (must divide train.grad_accumulation); "
        "default all of the step's batches",
    )
    quiz: SourceConfig | None = Field(None, description="held-out quiz set; default split from the training data")
    quiz_fraction: float = Field(0.1, gt=0, lt=1)
    quiz_batch_size: int | None = Field(None, ge=1, description="default train.batch_size")
    finite_difference: float = Field(0.01, gt=0, description="order=first: ε of the finite difference")


class KDTeacher(Section):
    """One of several teachers: a classifier fine-tuned on the task, and its weight λ (normalised over teachers)."""

    name_or_path: ModelRef = Field(min_length=1)
    weight: float = Field(1.0, gt=0)
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="the dtype the teacher runs in (online, or while its outputs are cached: a dtype other "
        "than float32 is part of the cache's key); auto = bfloat16 where the hardware computes it fast")


class KDRecipe(Section, NamesTeachers):
    """`biodistil kd`: train a student on a fine-tuned teacher's outputs (or several teachers') over a transfer set."""

    run: RunConfig = Field(default_factory=RunConfig)
    teacher: ModelConfig | None = Field(None, description="the teacher (or give `teachers:`)")
    teachers: list[KDTeacher] | None = Field(
        None, min_length=2, description="several teachers, each with a weight; how they teach: kd.combine")
    student: ModelConfig
    task: TaskConfig
    transfer: TransferConfig = Field(default_factory=TransferConfig)
    kd: KDOptions = Field(default_factory=KDOptions)
    meta: MetaConfig | None = None
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)

    @model_validator(mode="after")
    def _consistent(self) -> KDRecipe:
        if (self.teacher is None) == (self.teachers is None):
            raise ValueError("give the teacher (teacher:) or several (teachers:), not both")
        if self.teacher is not None and (self.teacher.layers is not None or self.teacher.reinitialise):
            raise ValueError("teacher.layers / teacher.reinitialise: the teacher is used as it is; they apply to the "
                             "student")
        if self.teachers is not None and self.meta is not None:
            raise ValueError("meta-learning updates one teacher: give teacher:, not teachers:")
        if self.teachers is not None and self.kd.patient is not None:
            raise ValueError("kd.patient maps the student's layers to one teacher's: give teacher:, or drop "
                             "kd.patient with teachers:")
        self.kd.check_teachers(self.teachers is not None, "kd")
        if (self.kd.beta > 0 or self.kd.soft_loss == "none") and not self.transfer.keep_labels:
            raise ValueError("kd.beta > 0 (or soft_loss none) needs gold labels: set transfer.keep_labels: true")
        if self.meta is not None:
            if self.meta.mode == "adaptive" and (self.kd.beta <= 0 or self.kd.alpha <= 0):
                raise ValueError("meta.mode adaptive learns α and β from positive starting values: set kd.alpha > 0 "
                                 "and kd.beta > 0 (with transfer.keep_labels: true)")
            if self.kd.teacher_outputs == "cached":
                raise ValueError("meta-learning updates the teacher: kd.teacher_outputs must be online or auto")
            if self.kd.soft_loss == "none":
                raise ValueError("meta-learning needs a teacher: kd.soft_loss must not be 'none'")
            if self.meta.quiz is None and not self.transfer.keep_labels:
                raise ValueError("meta.quiz is empty, so the quiz set is split from the training data, which then "
                                 "needs labels: set transfer.keep_labels: true or give meta.quiz")
            pilot = self.meta.pilot_batches
            if pilot is not None and self.train.grad_accumulation % pilot:
                raise ValueError(f"meta.pilot_batches {pilot} must divide train.grad_accumulation "
                                 f"{self.train.grad_accumulation}")
        return self

    def teacher_entries(self) -> list[KDTeacher]:
        """Every teacher with its weight λ_k normalised to sum to 1 (one teacher: weight 1)."""
        if self.teachers is None:
            return [KDTeacher(name_or_path=self.teacher.name_or_path)]
        total = sum(entry.weight for entry in self.teachers)
        return [entry.model_copy(update={"weight": entry.weight / total}) for entry in self.teachers]

    def outputs_mode(self) -> Literal["cached", "online"]:
        """Where teacher outputs come from: `auto` is online for meta-learning, cached otherwise."""
        if self.kd.teacher_outputs != "auto":
            return self.kd.teacher_outputs
        return "online" if self.meta is not None else "cached"


class TransferRecipe(Section):
    """`biodistil transfer`: build a transfer set for a task and save it as a datasets Arrow folder."""

    run: RunConfig = Field(default_factory=RunConfig)
    task: TaskConfig
    transfer: TransferConfig = Field(default_factory=TransferConfig)


class StudyTeacher(Section):
    """Another teacher of a study task, fine-tuned by the study (`tasks[].more_teachers`)."""

    teacher_init: ModelRef = Field(description="the encoder the study fine-tunes into this teacher")
    teacher_overrides: dict[str, Any] = Field(default_factory=dict, description="finetune recipe values")


class StudyTask(Section):
    """One evaluation task of a study and its teacher: a fine-tuned folder, or fine-tuned by the study; and any more
    teachers the arms name as "@<name>" ("@teacher": the first)."""

    name: TaskRef = Field(description="built-in task name or task YAML file (its folders take the task's name)")
    teacher: ModelRef | None = Field(None, description="a teacher already fine-tuned on the task (folder or Hub id)")
    teacher_init: ModelRef | None = Field(None, description="else: the encoder the study fine-tunes into the teacher "
                                                       "(default: the study's teacher_init)")
    teacher_overrides: dict[str, Any] = Field(default_factory=dict, description="finetune recipe values")
    teacher_seeds: list[int] | None = Field(
        None, min_length=1, description="the seeds the study fine-tunes the teacher with (default: the study's first "
        "seed): the first is the teacher the kd arms learn from (<task>/teacher), the others are written to "
        "<task>/teacher-seed-<S>; T, the denominator of the share and the gap closed, is their mean, and the share's "
        "interval draws them")
    more_teachers: dict[str, StudyTeacher] = Field(
        default_factory=dict, description="more teachers fine-tuned by the study into <task>/teacher-<name>; an arm "
        "names them in its overrides as teacher: {name_or_path: '@<name>'} or in teachers: [...]; the summary scores "
        "each and their ensemble on the test set")
    overrides: dict[Literal["finetune", "kd"], dict[str, Any]] = Field(
        default_factory=dict, description="recipe values of this task's finetune / kd arm runs (e.g. a labelled "
        "budget sized to its training split): over the study's defaults, under each arm's overrides")


class StudyArm(Section):
    """One row of a study: a `finetune` or `kd` run per seed, from the defaults plus `overrides`."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    command: Literal["finetune", "kd"] = "kd"
    overrides: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int] | None = Field(None, min_length=1, description="this arm's seeds, e.g. more where a "
                                                                    "comparison needs them; default the study's")
    starts: list[ModelRef] | None = Field(
        None, min_length=1, description="several models the arm starts from (e.g. the student of each distillation "
        "seed), each run with every seed in <arm>/start-<k>/seed-<S>; the row's interval draws the starts, then the "
        "seeds within each, and its t-test compares the starts' mean scores (the distillation runs are the units)")


class StudyRecipe(Section):
    """`biodistil study`: teacher(s), then every arm × seed as a normal run folder, then a summary table with
    the mean score and the gap closed (S − S_init)/(T − S_init)."""

    run: RunConfig = Field(default_factory=RunConfig)
    data_dir: LocalPath | None = None
    seeds: list[int] = Field(default_factory=lambda: [1, 2, 3], min_length=1)
    metric: str | None = Field(None, description="key of the task metric to report; default the headline")
    student: ModelRef = Field(description="the student encoder every arm starts from (folder, Hub id or embedded "
                                          "model name)")
    student_layers: list[int] | None = Field(None, description="build the student from these layers (0-based) of "
                                                               "`student`, e.g. [0, 2, 4]")
    teacher_init: ModelRef | None = Field(None, description="encoder fine-tuned into each task's teacher, unless "
                                                            "the task names a fine-tuned teacher")
    tasks: list[StudyTask] = Field(min_length=1)
    defaults: dict[Literal["finetune", "kd"], dict[str, Any]] = Field(
        default_factory=dict, description="recipe values shared by all finetune / kd runs"
    )
    arms: list[StudyArm] = Field(min_length=1)
    reference_arm: str | None = Field(None, description="the arm every other arm of a task is measured from: the "
                                      "summary adds each row's gap closed (S − R)/(T − R), S its mean, R the "
                                      "reference's, T the teachers', with its interval over both arms' runs, the "
                                      "teacher seeds and the test (and dev) examples")
    resamples: int = Field(2000, ge=100, description="bootstrap resamples behind each interval of the summary (the "
                           "share, the gap closed); 2,000 puts a 95% interval's bounds within a few percent of its "
                           "width of where more resamples would")
    earlier_looks: int = Field(0, ge=0, description="how many times the scores of this question were seen before "
                               "this recipe was fixed (e.g. a schedule changed after a first run's scores): each "
                               "comparison is then tested at α/(1 + earlier_looks + the study's own extra looks)")

    @model_validator(mode="before")
    @classmethod
    def _paths_in_partial_recipes(cls, raw: Any) -> Any:
        """Paths in `defaults`, arm and task `overrides` and `teacher_overrides` resolved as the runs' recipes will
        resolve them, so that the study's config.yaml records them absolute (a resumed study compares them)."""
        if not isinstance(raw, dict):
            return raw
        from biodistil.finetune.command import FinetuneRecipe

        commands = {"finetune": FinetuneRecipe, "kd": KDRecipe}
        raw = dict(raw)
        if isinstance(raw.get("defaults"), dict):
            raw["defaults"] = {key: resolve_paths(commands[key], value) if key in commands and isinstance(value, dict)
                               else value for key, value in raw["defaults"].items()}
        if isinstance(raw.get("arms"), list):
            raw["arms"] = [_with_resolved(arm, "overrides", commands.get(arm.get("command", "kd"), KDRecipe))
                           if isinstance(arm, dict) else arm for arm in raw["arms"]]
        if isinstance(raw.get("tasks"), list):
            raw["tasks"] = [_task_with_resolved(task, commands) if isinstance(task, dict) else task
                            for task in raw["tasks"]]
        return raw

    def continued_from(self, recorded: dict[str, Any]) -> dict[str, Any]:
        """A study continues with seeds added (its finished runs stay valid: each is its own run folder): the study's
        list extended at its end (the teachers train with its first seed), an arm's seeds extended anywhere."""
        recorded = copy.deepcopy(recorded)
        old_seeds = recorded.get("seeds")
        if isinstance(old_seeds, list) and self.seeds[:len(old_seeds)] == old_seeds:
            recorded["seeds"] = list(self.seeds)
        arms = recorded.get("arms") if isinstance(recorded.get("arms"), list) else []
        for old, new in zip(arms, self.arms, strict=False):
            if not isinstance(old, dict) or old.get("name") != new.name:
                continue
            before = old.get("seeds") or old_seeds or []
            if set(before) <= set(new.seeds or self.seeds):
                old["seeds"] = None if new.seeds is None else list(new.seeds)
        return recorded

    @model_validator(mode="after")
    def _unique_arms(self) -> StudyRecipe:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names) or "teacher" in names:
            raise ValueError(f"arm names must be unique and not 'teacher'; got {names}")
        if self.reference_arm is not None and self.reference_arm not in names:
            raise ValueError(f"reference_arm {self.reference_arm!r} is not one of the arms {names}")
        for task in self.tasks:
            if task.teacher is None and (task.teacher_init or self.teacher_init) is None:
                raise ValueError(f"task {task.name}: give its teacher (fine-tuned) or a teacher_init to fine-tune")
        return self


def _task_with_resolved(task: dict[str, Any], commands: dict[str, type[Section]]) -> dict[str, Any]:
    task = _with_resolved(task, "teacher_overrides", commands["finetune"])
    if isinstance(task.get("more_teachers"), dict):
        task["more_teachers"] = {name: _with_resolved(entry, "teacher_overrides", commands["finetune"])
                                 if isinstance(entry, dict) else entry
                                 for name, entry in task["more_teachers"].items()}
    if isinstance(task.get("overrides"), dict):
        task["overrides"] = {key: resolve_paths(commands[key], value) if key in commands and isinstance(value, dict)
                             else value for key, value in task["overrides"].items()}
    return task


def _with_resolved(entry: dict[str, Any], key: str, recipe_cls: type[Section]) -> dict[str, Any]:
    value = entry.get(key)
    return {**entry, key: resolve_paths(recipe_cls, value)} if isinstance(value, dict) else entry
