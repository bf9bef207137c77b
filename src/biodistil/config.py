"""Typed recipes: YAML files validated into config classes, with dotted command-line overrides.

Every command reads one recipe class. Unknown keys and bad values fail before any work starts, with
the offending key and the valid choices in the message; the resolved recipe is saved in the run folder.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from biodistil.embedded import resolve_model_name
from biodistil.errors import BiodistilError
from biodistil.io import atomic_write_text, load_yaml
from biodistil.paths import absolute, model_reference, task_reference
from biodistil.term_specs import TASK_TERMS, TERM_NAMES, TERM_SPECS, misplaced_options

Precision = Literal["auto", "no", "bf16", "fp16"]


# False while `validate_recipe(..., resolve_models=False)` reads a recipe to compare or show it, not to run it: model
# names stay as written, so it needs none of its models on this machine (a fetched model may not be there).
_RESOLVING_MODELS: ContextVar[bool] = ContextVar("resolving_models", default=True)


def resolve_model_ref(name: str) -> str:
    return model_reference(resolve_model_name(name)) if _RESOLVING_MODELS.get() else name


# Paths a user gives are resolved when the recipe is read, against the working folder, and recorded absolute in the
# run's config.yaml: a run started as `--out runs/demo` and one started as `--out /abs/runs/demo` are the same run.
# A file, folder or glob:
LocalPath = Annotated[str, AfterValidator(absolute)]
# A model folder (absolute), a Hub id (as given), or the short name of an embedded model (e.g. minilm-l6, resolved
# to its installed folder):
ModelRef = Annotated[str, AfterValidator(resolve_model_ref)]
# A built-in task name (as given) or a task YAML file (absolute):
TaskRef = Annotated[str, AfterValidator(task_reference)]
PATH_TYPES = (absolute, resolve_model_ref, task_reference)


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    def continued_from(self, recorded: dict[str, Any]) -> dict[str, Any]:
        """The recorded recipe of the run this recipe continues, with the changes a continued run may make taken
        as recorded (`RunFolder` compares the two): none, unless a section says otherwise."""
        return recorded


class RunConfig(Section):
    """Where the run folder goes and how it is named."""

    output_dir: LocalPath = Field("runs/run", validate_default=True)
    seed: int = 42


class TrainConfig(Section):
    """Optimisation and bookkeeping shared by every stage (pre-training, distillation, fine-tuning)."""

    max_steps: int = Field(1000, ge=1, description="optimizer steps")
    batch_size: int = Field(32, ge=1, description="sequences per process per micro-batch")
    grad_accumulation: int = Field(1, ge=1)
    num_workers: Literal["auto"] | Annotated[int, Field(ge=0)] = Field(
        "auto", description="data-loading worker processes (collate, MLM masking, a teacher cache's rows): auto = 0 "
        "on a CPU (in the training process), on CUDA one per usable core but one, at most 4, pinned and prefetched "
        "(training.machine.loader_plan); N = N workers")
    group_by_length: bool = Field(False, description="batch examples of similar length (less padding: about 2x "
                                  "faster fine-tuning and task KD on sentence tasks); the batches stay random")
    learning_rate: float = Field(5e-4, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-6
    warmup_steps: int | None = Field(None, ge=0)
    warmup_ratio: float = Field(0.05, ge=0, le=1)
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    max_grad_norm: float | None = Field(1.0, gt=0)
    precision: Precision = "auto"
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: a CUDA GPU when one is visible, else the CPU; cpu or cuda to insist (cuda without a "
        "visible GPU is an error before anything runs)")
    compile: bool | Literal["auto"] = Field(
        "auto", description="auto: compile the vocabulary KL's row kernel where TorchInductor can (a C++ compiler on "
        "the CPU), which wins on every CPU measured (not for rows narrower than 2,048 — task KD's few classes, a toy "
        "vocabulary —, where eager rows are as fast); true: also torch.compile the student's encoder (and an online "
        "teacher's), which did not win on CPUs; false: nothing. The first steps include the compile")
    threads: Literal["stage", "auto"] | Annotated[int, Field(ge=1)] = Field(
        "stage", description="torch's CPU threads while the stage trains: stage = the idle cores measured when it "
        "starts, kept to its end (a recipe runs one way throughout); auto = that, re-checked every 60 s against other "
        "work on the machine; N = N threads (over OMP_NUM_THREADS, which otherwise wins; biodistil.training.threads)")
    dropout: Literal["torch", "fast"] = Field(
        "torch", description="torch: PyTorch's dropout; fast: on the CPU, every nn.Dropout draws its mask from 15-bit "
        "fields of the default generator's 64-bit words (biodistil.models.dropout: a call 2.4-4.3x cheaper than "
        "PyTorch's per-element Bernoulli draw, a small student's step 1.07-1.13x faster; drop rate round(p * 2^15) / "
        "2^15; other masks than torch's, so seeded results differ from its). On a GPU always PyTorch's")
    eval_every: int = Field(200, ge=0, description="0 disables held-out evaluation during training")
    eval_batches: int | None = Field(None, ge=1, description="cap on held-out batches per evaluation")
    save_every: int = Field(500, ge=0, description="0 saves only at the end")
    keep_checkpoints: int = Field(2, ge=1)
    log_every: int = Field(10, ge=1)
    tensorboard: bool = True
    progress_bar: bool = True

    @field_validator("precision", mode="before")
    @classmethod
    def _yaml_no_is_a_word(cls, value: Any) -> Any:
        return "no" if value is False else value  # `precision: no` in YAML arrives as False

    def resolved_warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else int(self.max_steps * self.warmup_ratio)


class CorpusConfig(Section):
    """A plain-text corpus: files, folders or glob patterns (one document per blank-line-separated block)."""

    train: list[LocalPath] = Field(default_factory=list, description="files, folders or globs")
    eval: list[LocalPath] = Field(default_factory=list, description="held-out files; empty = split from train")
    hub_dataset: str | None = Field(None, description="Hugging Face dataset id (online users)")
    hub_text_column: str = "text"
    eval_fraction: float = Field(0.01, ge=0, lt=1)
    max_eval_blocks: int = Field(500, ge=1)
    max_lines: int | None = Field(None, ge=1, description="read only the first N lines of the corpus")
    block_size: int = Field(128, ge=8)
    cache_dir: LocalPath | None = Field(None, description="default: ~/.cache/biodistil/corpora")

    @model_validator(mode="after")
    def _needs_a_source(self) -> CorpusConfig:
        if not self.train and not self.hub_dataset:
            raise ValueError("give data.train (files, folders or globs) or data.hub_dataset")
        return self


class MaskingConfig(Section):
    """MLM masking: which share of tokens is predicted, how they are corrupted, and whether masks are drawn anew
    for every batch (dynamic, the default) or fixed per block (static: `duplication` seeded patterns per block,
    epoch e using pattern e mod D, as BERT's duplication factor; what a teacher cache needs)."""

    probability: float = Field(0.15, gt=0, lt=1)
    mask_ratio: float = Field(0.8, ge=0, le=1)
    random_ratio: float = Field(0.1, ge=0, le=1)
    whole_word: bool = False
    duplication: int | None = Field(
        None, ge=1, description="static masking: D mask patterns per block, epoch e uses pattern e mod D; "
        "null = dynamic masking (new masks every batch)")
    seed: int = Field(0, description="static masking: the seed of every block's patterns (not run.seed, so that "
                      "runs of other seeds, students and methods share the masks and a teacher cache)")

    @model_validator(mode="after")
    def _ratios_fit(self) -> MaskingConfig:
        if self.mask_ratio + self.random_ratio > 1:
            raise ValueError("masking.mask_ratio + masking.random_ratio must be at most 1")
        return self


class ArchitectureConfig(Section):
    """A randomly initialised encoder described by its shape."""

    model_type: Literal["bert", "roberta", "distilbert", "modernbert"] = "bert"
    num_layers: int = Field(6, ge=1)
    hidden_size: int = Field(768, ge=8)
    num_heads: int = Field(12, ge=1)
    intermediate_size: int = Field(3072, ge=8)
    max_position_embeddings: int = Field(512, ge=8)
    dropout: float = Field(0.1, ge=0, lt=1)
    global_attention_every: int | None = Field(
        None, ge=1, description="modernbert: layer i attends globally when i % n == 0, locally otherwise (default 3)")
    local_attention: int | None = Field(
        None, ge=2, description="modernbert: local window, keys within ±local_attention/2 (default 128)")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ArchitectureConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.model_type != "modernbert" and (self.global_attention_every or self.local_attention):
            raise ValueError("global_attention_every and local_attention describe ModernBERT's global/local layers; "
                             f"model_type {self.model_type!r} has global attention only")
        return self


class TeacherConfig(Section):
    """The frozen teacher: a Hub id or a local folder with a masked-LM model and its tokenizer."""

    name_or_path: ModelRef
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="the teacher's weights and outputs; auto = bfloat16 where the hardware computes it fast "
        "(a GPU with bf16; a CPU with AMX or AVX-512 BF16 among its flags, or where the flags cannot be read, whose "
        "bf16 matmul measures 1.3x its float32 one), else float32; the run's report says which and why")
    trust_remote_code: bool = False


class DistillTeacher(TeacherConfig):
    """One of several `distill` teachers: a masked LM (the student's tokenizer or its own), its weight λ (normalised
    over the teachers) and, optionally, its own layer map for the layer terms that have one."""

    weight: float = Field(1.0, gt=0)
    layer_map: Literal["uniform"] | list[int] | None = Field(
        None, description="this teacher's layer g(l) per student layer l, in place of the layer_map of every layer "
        "term that has one (e.g. a 12-layer and a 6-layer teacher: 'uniform' maps each to its own depth)")


class VocabExpansionConfig(Section):
    """VE-KD: train a WordPiece vocabulary on the domain corpus and append the tokens the teacher lacks."""

    vocab_size: int = Field(60000, ge=100, description="student vocabulary size after expansion (paper: 60,000)")
    corpus: list[LocalPath] = Field(default_factory=list, description="files, folders or globs; empty = data.train")
    max_lines: int | None = Field(None, ge=1, description="train the domain vocabulary on the first N lines only")
    min_frequency: int = Field(2, ge=1)


class TokenizerTrainingConfig(Section):
    """A WordPiece vocabulary trained on the corpus."""

    vocab_size: int = Field(30522, ge=100)
    lowercase: bool = False
    min_frequency: int = Field(2, ge=1)
    max_lines: int | None = Field(None, ge=1, description="train the vocabulary on the first N lines only")


class StudentConfig(Section):
    """How the student is made: teacher layers, a fresh architecture, or an existing pretrained model."""

    init: Literal["teacher_layers", "architecture", "pretrained"] = "teacher_layers"
    layers: list[int] | None = Field(None, description="teacher layers to copy; default every other layer")
    architecture: ArchitectureConfig | None = None
    name_or_path: ModelRef | None = None
    trust_remote_code: bool = False
    vocab_expansion: VocabExpansionConfig | None = Field(
        None, description="VE-KD: expand the student's vocabulary with domain tokens (init=teacher_layers only)"
    )
    tokenizer: TokenizerTrainingConfig | None = Field(
        None, description="a WordPiece vocabulary of its own for the student, trained on data.train (as pretrain's "
        "model.tokenizer): init=architecture sizes the student for it; init=teacher_layers copies the teacher's "
        "embedding of each token whose text the teacher writes as one token and averages the teacher's pieces for "
        "the others. The objective then runs across tokenizers (docs/cross-tokenizer.md)",
    )

    @model_validator(mode="after")
    def _init_has_its_inputs(self) -> StudentConfig:
        if self.init == "architecture" and self.architecture is None:
            raise ValueError("student.init=architecture needs student.architecture")
        if self.init == "pretrained" and not self.name_or_path:
            raise ValueError("student.init=pretrained needs student.name_or_path")
        if self.vocab_expansion is not None and self.init != "teacher_layers":
            raise ValueError("student.vocab_expansion needs student.init=teacher_layers (new embeddings come from it)")
        if self.tokenizer is not None and (self.init == "pretrained" or self.vocab_expansion is not None):
            raise ValueError("student.tokenizer trains the student's own vocabulary: not with init=pretrained (which "
                             "has one) nor with student.vocab_expansion (which extends the teacher's)")
        return self


class TermConfig(Section):
    """One weighted loss term of an objective (docs/methods.md gives every loss and its equation).

    A layer term compares one (student_layer, teacher_layer) pair, or with `layer_map` every student
    transformer layer l = 1..M with teacher layer g(l).
    """

    loss: Literal[TERM_NAMES]  # biodistil.term_specs
    weight: float = Field(1.0, ge=0)
    positions: Literal["all", "masked", "known"] = Field(
        "all", description="logit and hidden terms: non-padding, masked, or non-padding tokens the teacher knows "
        "(not VE-KD new tokens)",
    )
    student_layer: int = Field(
        -1, description="hidden-state index (0 = embeddings) or, for attention/relations, transformer layer; -1 = last"
    )
    teacher_layer: int = -1
    layer_map: Literal["uniform"] | list[int] | None = Field(
        None, description="hidden_*/attention_*: student layer l -> teacher layer g(l); 'uniform' or one teacher "
        "layer (1..N) per student layer",
    )
    layer_reduction: Literal["sum", "mean"] = Field("sum", description="with layer_map: sum or mean over layers")
    token_reduction: Literal["mean", "sum"] = Field(
        "mean", description="attention_kl: mean over heads and tokens, or sum over tokens averaged over heads"
    )
    vocab_reduction: Literal["mean", "sum"] = Field(
        "mean", description="logit_mse: squared errors averaged over the vocabulary (per-logit MSE) or summed over "
        "it (VE-KD: (1/n)·Σ_i ‖z_T(i) − z_S(i)‖²); always averaged over positions",
    )
    attention_map: Literal["probabilities", "scores"] = Field(
        "probabilities", description="attention_mse: softmax probabilities, or the unnormalised scores Q·Kᵀ/√d "
        "(TinyBERT); padded keys are excluded either way",
    )
    num_relation_heads: int | None = Field(
        None, ge=1, description="minilm_relations: relation heads (default: the teacher's attention heads)"
    )
    relations: list[Literal["q", "k", "v"]] = Field(default_factory=lambda: ["q", "k", "v"])
    epsilon: float | None = Field(None, ge=0, description="tolerance: the term becomes max(hinge_weight·L − ε, 0)")
    hinge_weight: float = Field(1.0, gt=0, description="W_KD of the tolerance hinge (needs epsilon)")

    @model_validator(mode="after")
    def _options_fit_the_loss(self) -> TermConfig:
        fields = type(self).model_fields
        defaults = {name: spec.get_default(call_default_factory=True) for name, spec in fields.items()}
        misplaced = misplaced_options(self.loss, self.model_dump(), defaults)
        if misplaced:
            raise ValueError("; ".join(misplaced))
        if self.hinge_weight != 1.0 and self.epsilon is None:
            raise ValueError("hinge_weight needs epsilon (the tolerance hinge is max(hinge_weight·L − epsilon, 0))")
        if not self.relations or len(set(self.relations)) != len(self.relations):
            raise ValueError(f"relations must name distinct entries of q, k, v; got {self.relations}")
        return self


class NamesTeachers:
    """A recipe of `teacher:` or `teachers:` (a list of entries with `name_or_path`), naming them in messages."""

    def teacher_field(self, index: int) -> str:
        """The recipe field that names teacher `index`."""
        return "teacher" if self.teachers is None else f"teachers[{index}]"

    @contextmanager
    def naming_teacher(self, index: int) -> Iterator[None]:
        """An error raised inside names teacher `index`, its field and model, when there are several."""
        try:
            yield
        except BiodistilError as err:
            if self.teachers is None:
                raise
            raise BiodistilError(f"teachers[{index}] ({self.teachers[index].name_or_path}): {err}") from None


class TeachersConfig(Section):
    """How several teachers (`teachers:`) teach, one meaning in `distill` (spelled under `objective:`) and `kd`
    (under `kd:`); docs/methods.md gives the equations (`biodistil.methods.several_teachers`)."""

    combine: Literal["mixture", "per_teacher"] = Field(
        "mixture", description="several teachers: a term whose spec has a mixture space reads the weighted mixture of "
        "the teachers' predictions; per_teacher: each teacher term is computed once per teacher k and weighted by "
        "λ_k (logged <term>@k, and <term> = Σ_k λ_k·<term>@k); layer terms are always one per teacher. The logit terms "
        "are linear in their target up to a part free of the student, so per_teacher gives the student the mixture's "
        "gradient (its loss is higher by the teachers' spread about their mixture): it matters where rows cannot be "
        "mixed (a top-k cache) and for the per-teacher logs")
    confidence: bool = Field(
        False, description="several teachers, mixture: weigh each teacher per row by its probability of the label "
        "the student's own loss reads there (distill: the original token at a masked position; kd: the gold label), "
        "else by exp(−entropy) of its prediction")

    def on_mixture(self, losses: list[str]) -> list[str]:
        """The terms of kinds `losses` that several teachers teach through their mixture (`combine: mixture` and a
        spec with a mixture space)."""
        return [loss for loss in losses if self.combine == "mixture" and TERM_SPECS[loss].mixture is not None
                and TERM_SPECS[loss].needs_teacher]

    def check_teachers(self, several: bool, section: str) -> None:
        """Confidence weighs the shares of a mixture: it needs several teachers and `combine: mixture`."""
        if self.confidence and (not several or self.combine != "mixture"):
            raise ValueError(f"{section}.confidence weighs several teachers' shares of a mixture: give teachers: and "
                             f"{section}.combine: mixture")


class ObjectiveConfig(TeachersConfig):
    """A distillation method: a weighted combination of loss terms (and how several teachers teach them)."""

    temperature: float = Field(2.0, gt=0)
    terms: list[TermConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _task_agnostic_terms(self) -> ObjectiveConfig:
        task = [term.loss for term in self.terms if term.loss in TASK_TERMS]
        if task:
            raise ValueError(f"loss {', '.join(task)} compares classifier outputs: a term of task-specific "
                             "distillation (`biodistil kd`: kd.soft_loss, kd.beta, kd.patient), not of a masked-LM "
                             "objective")
        return self


class ExportConfig(Section):
    """The final model written to <run>/model."""

    enabled: bool = True


class ModelConfig(Section):
    """An encoder given as a local Hugging Face folder, a Hub id or an embedded model name (e.g. minilm-l6)."""

    name_or_path: ModelRef = Field(min_length=1)
    layers: list[int] | None = Field(
        None, description="keep only these transformer layers (0-based), e.g. [0, 2, 4]: a student made of a "
        "pre-trained model's alternate layers (written once to <run>/init_model)",
    )
    reinitialise: bool = Field(
        False, description="draw fresh weights for the architecture (seeded by run.seed): the same model with no "
        "pre-training, a baseline (written once to <run>/init_model)",
    )


class PretrainModelConfig(Section):
    """MLM pre-training: from scratch (architecture + trained vocabulary) or continual (existing model)."""

    init: Literal["scratch", "continual"] = "scratch"
    name_or_path: ModelRef | None = None
    architecture: ArchitectureConfig | None = None
    tokenizer: TokenizerTrainingConfig | None = None
    tokenizer_name_or_path: ModelRef | None = Field(
        None, description="scratch: reuse this tokenizer (Hub id or folder) instead of training one"
    )
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _init_has_its_inputs(self) -> PretrainModelConfig:
        if self.init == "continual" and not self.name_or_path:
            raise ValueError("model.init=continual needs model.name_or_path")
        if self.init == "scratch" and self.architecture is None:
            raise ValueError("model.init=scratch needs model.architecture")
        if self.init == "scratch" and (self.tokenizer is None) == (self.tokenizer_name_or_path is None):
            raise ValueError("model.init=scratch needs exactly one of model.tokenizer (train a vocabulary) "
                             "and model.tokenizer_name_or_path (reuse one)")
        return self


class PretrainRecipe(Section):
    """`biodistil pretrain`: masked-language-model training, from scratch or continual."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: PretrainModelConfig
    data: CorpusConfig
    masking: MaskingConfig = Field(default_factory=MaskingConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)


class TeacherCacheConfig(Section):
    """Distil from a cache of the teacher's outputs (`biodistil cache-teacher`, or built by `distill` first): per
    block and mask pattern, what the terms read at the masked positions and the hidden states they read. Needs
    static masks (masking.duplication). `logits: head` keeps the teacher's last hidden state at the masked positions
    and its MLM head, and forms its exact logits while the student trains; `logits: top_k` keeps its top-k logits
    and `logit_kl` becomes the KL over the top-k tokens and the tail (sampled, or one bucket)."""

    logits: Literal["head", "top_k"] = Field(
        "head", description="head: the teacher's exact logits, formed from the stored input of its MLM decoder by its "
        "head (kept in memory, the rest of the teacher dropped); top_k: its top-k logits and tail draws (no teacher)")
    top_k: int = Field(64, ge=1, description="logits: top_k: teacher logits kept per masked position")
    tail_samples: int = Field(64, ge=0, description="logits: top_k: tokens drawn per masked position from the rest "
                              "of the teacher's distribution, for an unbiased KL; 0 = the rest as one bucket (the KL "
                              "inside it is lost)")
    dir: LocalPath | None = Field(None, description="teacher store folder; default ~/.cache/biodistil/teacher")
    shard_blocks: int = Field(512, ge=1, description="blocks per shard (one file, written atomically)")
    batch_size: int = Field(32, ge=1, description="blocks per teacher batch while building")


class DistillRecipe(Section, NamesTeachers):
    """`biodistil distill`: task-agnostic distillation of a masked-LM teacher into a student."""

    run: RunConfig = Field(default_factory=RunConfig)
    teacher: TeacherConfig | None = Field(None, description="the teacher (or give `teachers:`)")
    teachers: list[DistillTeacher] | None = Field(
        None, min_length=2, description="several teachers, each with a weight (and its own tokenizer: the terms then "
        "compare the words every side shares); how the logit terms read them: objective.combine")
    student: StudentConfig = Field(default_factory=StudentConfig)
    data: CorpusConfig
    masking: MaskingConfig = Field(default_factory=MaskingConfig)
    objective: ObjectiveConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    teacher_cache: TeacherCacheConfig | None = Field(
        None, description="distil from cached teacher outputs instead of running the teacher (needs "
        "masking.duplication)")

    @property
    def teacher_list(self) -> list[DistillTeacher]:
        """Every teacher in slot order (the one of `teacher:` with weight 1)."""
        if self.teachers is not None:
            return list(self.teachers)
        return [DistillTeacher(**self.teacher.model_dump())]

    @property
    def teacher_weights(self) -> list[float]:
        """λ_k, normalised to sum to 1."""
        weights = [entry.weight for entry in self.teacher_list]
        return [weight / sum(weights) for weight in weights]

    @model_validator(mode="after")
    def _one_spelling_of_teachers(self) -> DistillRecipe:
        if (self.teacher is None) == (self.teachers is None):
            raise ValueError("give the teacher (teacher:) or several (teachers:), not both")
        self.objective.check_teachers(self.teachers is not None, "objective")
        if self.teachers is None:
            return self
        if self.student.vocab_expansion is not None:
            raise ValueError("student.vocab_expansion (VE-KD) extends one teacher's vocabulary: give teacher:, not "
                             "teachers:")
        cache = self.teacher_cache
        if cache is not None and cache.logits == "top_k" and self.objective.on_mixture(
                [term.loss for term in self.objective.terms]):
            raise ValueError("teacher_cache.logits top_k keeps each teacher's top-k logits, not whole rows to mix: "
                             "set objective.combine: per_teacher, or teacher_cache.logits: head")
        return self

    @model_validator(mode="after")
    def _static_masks_fit(self) -> DistillRecipe:
        if self.masking.duplication is not None and self.student.vocab_expansion is not None:
            raise ValueError("masking.duplication (static masks) does not apply to VE-KD (student.vocab_expansion), "
                             "whose masking covers the new tokens batch by batch")
        if self.teacher_cache is not None and self.masking.duplication is None:
            raise ValueError("teacher_cache needs static masks, whose outputs can be stored: set masking.duplication "
                             "(mask patterns per block, e.g. 4)")
        if self.teacher_cache is not None and self.data.hub_dataset:
            raise ValueError("teacher_cache needs corpus files (data.train), not data.hub_dataset")
        if self.student.tokenizer is not None:
            _check_across_tokenizers(self)
        return self


def _check_across_tokenizers(recipe: DistillRecipe) -> None:
    """What distillation across tokenizers (a student vocabulary of its own) does not offer, refused by name."""
    if recipe.teacher_cache is not None:
        raise ValueError("teacher_cache is not supported across tokenizers (student.tokenizer): the teacher reads its "
                         "own tokens of each text, masked batch by batch; remove teacher_cache")
    if recipe.masking.duplication is not None:
        raise ValueError("masking.duplication (static masks) is not supported across tokenizers (student.tokenizer): "
                         "the same words are masked on both sides batch by batch; remove masking.duplication")
    if recipe.data.hub_dataset:
        raise ValueError("across tokenizers (student.tokenizer) the corpus is read as text from files: give "
                         "data.train, not data.hub_dataset")
    if recipe.train.group_by_length:
        raise ValueError("train.group_by_length is not supported across tokenizers (student.tokenizer): blocks are "
                         "text, tokenized batch by batch; remove it")


RecipeT = TypeVar("RecipeT", bound=Section)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, section by section: nested mappings are merged, other values replaced. The
    result shares nothing with its inputs (values are copied), so either may be changed afterwards."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_paths(section: type[BaseModel], raw: dict[str, Any]) -> dict[str, Any]:
    """A partial recipe of `section` (a study's defaults, a pipeline's settings) with every path it holds resolved as
    validation would resolve it (`LocalPath`, `ModelRef`, `TaskRef`), so that it is recorded absolute too; keys
    `section` does not know are left for validation to report."""
    resolved = dict(raw)
    for key, value in raw.items():
        field = section.model_fields.get(key) if isinstance(key, str) else None
        if field is None or value is None:
            continue
        resolve = path_kind(field)
        nested = _model_in(field.annotation)
        if resolve is not None and isinstance(value, str):
            resolved[key] = resolve(value)
        elif resolve is not None and isinstance(value, list):
            resolved[key] = [resolve(item) if isinstance(item, str) else item for item in value]
        elif nested is not None and isinstance(value, dict):
            resolved[key] = resolve_paths(nested, value)
    hook = getattr(section, "resolve_raw_paths", None)
    return hook(resolved) if hook is not None else resolved


def path_kind(field: Any) -> Any:
    """The resolver of a recipe field that holds paths (`absolute`, `resolve_model_ref` or `task_reference`: what
    the path names), or None."""
    return _path_function(field.annotation) or _path_function_in(field.metadata)


def nested_section(field: Any) -> type[BaseModel] | None:
    """The section class a recipe field holds (`X`, `X | None`, `list[X]`), or None."""
    return _model_in(field.annotation)


def _path_function(annotation: Any) -> Any:
    """The resolver of a path type inside an annotation (`LocalPath`, `list[LocalPath]`, `ModelRef | None`), or
    None."""
    found = _path_function_in(getattr(annotation, "__metadata__", ()))
    if found is not None:
        return found
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _path_function(arg)
        if found is not None:
            return found
    return None


def _path_function_in(metadata: Any) -> Any:
    for meta in metadata:
        if isinstance(meta, AfterValidator) and meta.func in PATH_TYPES:
            return meta.func
    return None


def load_recipe(recipe_cls: type[RecipeT], path: str | Path | None, overrides: list[str] = (), *,
                resolve_models: bool = True) -> RecipeT:
    """Read a YAML recipe, apply `key.sub=value` overrides, and validate it into `recipe_cls`; with `resolve_models`
    False, model names stay as written (nothing is looked up, checked or fetched)."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_yaml(Path(path))
    for item in overrides:
        _apply_override(raw, item)
    return validate_recipe(recipe_cls, raw, source=str(path) if path else "overrides", resolve_models=resolve_models)


def validate_recipe(recipe_cls: type[RecipeT], raw: dict[str, Any], source: str = "recipe", *,
                    resolve_models: bool = True) -> RecipeT:
    token = _RESOLVING_MODELS.set(resolve_models)
    try:
        return recipe_cls.model_validate(raw)
    except ValidationError as err:
        raise BiodistilError(f"Invalid recipe {source}:\n{_explain(err, recipe_cls)}") from None
    finally:
        _RESOLVING_MODELS.reset(token)


def dump_recipe(recipe: Section, path: Path) -> None:
    """Save the resolved recipe (every default filled in) as YAML."""
    atomic_write_text(path, yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BiodistilError(f"Recipe not found: {path}")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise BiodistilError(f"Recipe {path}{line}: not valid YAML: {err.problem or err}") from None
    except yaml.YAMLError as err:
        raise BiodistilError(f"Recipe {path} is not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BiodistilError(f"Recipe {path} must be a mapping of sections, got {type(data).__name__}")
    return data


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise BiodistilError(f"Override '{item}' must look like key.sub=value")
    try:
        value = load_yaml(text) if text else ""
    except yaml.YAMLError:
        value = text
    if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
        value = text  # YAML 1.1 reads yes/no/on/off as booleans; on the command line they are words
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise BiodistilError(f"Override '{item}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def _explain(err: ValidationError, recipe_cls: type[BaseModel]) -> str:
    lines = []
    for problem in err.errors():
        where = ".".join(str(p) for p in problem["loc"])
        if problem["type"] == "extra_forbidden":
            valid = _fields_at(recipe_cls, problem["loc"][:-1])
            lines.append(f"  - unknown key '{where}'; valid keys here: {', '.join(valid)}")
        else:
            lines.append(f"  - {where or '(top level)'}: {problem['msg']} (got {problem.get('input')!r})")
    return "\n".join(lines)


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if _is_model(current) else None
        if field is None:
            return []
        current = _model_in(field.annotation)
    return sorted(current.model_fields) if _is_model(current) else []


def _is_model(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def _model_in(annotation: Any) -> Any:
    """The BaseModel class inside an annotation such as `X | None` or `list[X]`."""
    if _is_model(annotation):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None
