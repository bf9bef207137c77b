"""`biodistil kd`: train a student on a fine-tuned teacher's outputs over a transfer set, with the one engine.

The loss (losses/task.py) is L = α·soft(z_S, z_T) + β·CE(y, z_S) + γ·PatientKD, where soft is
  hinton     T²·KL(softmax(z_T/T) ‖ softmax(z_S/T))            (Hinton et al. 2015)
  logit_mse  (1/C)·Σ_c (z_S,c − z_T,c)²
  sigmoid    BCE(q_T, q_S), q = 1/(1 + exp(−z/T)) of the positive class   (label-free binary KD)
  none       no teacher term: the fine-tune baseline on the transfer set's own gold labels
and PatientKD = Σ_i MSE(h_S,i/‖h_S,i‖, h_T,g(i)/‖h_T,g(i)‖) over [CLS] states, g = PKD-Skip or PKD-Last.

Teacher outputs are cached on disk (data/teacher_cache.py) and read from each batch (`teacher_logits`), so the
module holds no teacher; in online mode the module runs the teacher every step. With `meta`, MetaDistil or
MetaAdaptiveKD (methods/meta.py) updates the teacher (and α, β) before every student step. After training,
the student is scored on the task's test set beside its initialisation and the teacher, and the share of the
gap it closes, (S − S_init)/(T − S_init), is reported.
"""

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.data.formats import TextExample, TokenExample
from biodistil.data.teacher_cache import (
    TeacherRequest,
    attach_teacher_outputs,
    cached_teacher_outputs,
    forward_teacher,
    load_teacher_classifier,
    model_fingerprint,
    teacher_cache_dir,
    with_placeholder_labels,
)
from biodistil.data.transfer_sets import (
    build_transfer_set,
    describe_source,
    fingerprint_examples,
    is_labelled,
    load_transfer_set,
    map_labels,
    read_source,
    save_transfer_set,
    shape_for_task,
)
from biodistil.errors import BiodistilError
from biodistil.io import atomic_write_json, jsonable, number
from biodistil.losses.distillation import masked_lm_loss
from biodistil.losses.task import hinton_kd_loss, logit_mse_loss, patient_kd_loss, sigmoid_kd_loss
from biodistil.methods.finetune import build_classifier, init_model_path, steps_for_epochs
from biodistil.methods.layer_map import pkd_last_map, pkd_skip_map
from biodistil.methods.masked_lm import freeze
from biodistil.methods.task_recipe import KDOptions, KDRecipe
from biodistil.tasks.encoding import FeatureCollator, collator_for, encode_split, fit_length_to_model, model_inputs
from biodistil.tasks.prediction import write_predictions
from biodistil.tasks.recipe import load_task_split, task_spec
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score_model

Example = TokenExample | TextExample
Weight = float | torch.Tensor
TEACHER_KEYS = ("teacher_logits", "kd_mask", "teacher_cls", "pkd_mask")


# ------------------------------------------------------------------------------------------ task helpers


def gap_closed(student: dict[str, float], init: dict[str, float], teacher: dict[str, float]) -> dict[str, float]:
    """(S − S_init)/(T − S_init) per metric key: the share of the initialisation–teacher gap the student closes
    (NaN where the teacher does not beat the initialisation by a margin)."""
    gaps = {}
    for key in student.keys() & init.keys() & teacher.keys():
        span = teacher[key] - init[key]
        finite = all(math.isfinite(v) for v in (student[key], init[key], teacher[key]))
        gaps[key] = (student[key] - init[key]) / span if finite and abs(span) > 1e-12 else math.nan
    return dict(sorted(gaps.items()))


def teacher_test_scores(teacher: str, task: TaskSpec, examples: list[Example], cache_dir: str | Path | None,
                        batch_size: int = 64) -> dict[str, float]:
    """The teacher's test scores, cached beside its outputs (keyed by teacher and test-set fingerprints)."""
    key = f"scores-{model_fingerprint(teacher)[:20]}-{fingerprint_examples(examples)[:20]}-{task.name}" \
          f"-{task.max_length}.json"
    path = teacher_cache_dir(cache_dir) / key
    if path.is_file():
        return {key: number(value) for key, value in json.loads(path.read_text()).items()}
    from biodistil.models.loading import load_tokenizer

    model = load_teacher_classifier(teacher, task)
    scores = score_model(model, load_tokenizer(teacher), task, examples, batch_size).scores
    atomic_write_json(path, jsonable(scores))
    return scores


# ------------------------------------------------------------------------------------------ losses


def soft_term(kind: str, loss: str, student: torch.Tensor, teacher: torch.Tensor, temperature: float,
              mask: torch.Tensor | None) -> torch.Tensor:
    """The teacher term: hinton T²·KL, logit_mse, or sigmoid BCE(σ(z_T/T), σ(z_S/T)) (multi-label: per label)."""
    teacher = teacher.to(student.dtype)
    if loss == "hinton":
        return hinton_kd_loss(student, teacher, None, 1.0, 0.0, temperature, mask).kd
    if loss == "logit_mse":
        return logit_mse_loss(student, teacher, mask)
    if kind == "multilabel_classification":
        return sigmoid_kd_loss(student.reshape(-1), teacher.reshape(-1), temperature)
    return sigmoid_kd_loss(student, teacher, temperature)


def task_loss(kind: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """CE(y, z_S) for the task: softmax CE per example, per labelled token (−100 ignored), or per-label BCE."""
    if kind == "multilabel_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    if kind == "token_classification":
        return masked_lm_loss(logits, labels)
    return F.cross_entropy(logits.float(), labels)


def check_loss_fits_task(cfg: KDOptions, task: TaskSpec) -> None:
    if cfg.soft_loss == "hinton" and task.kind == "multilabel_classification":
        raise BiodistilError(f"kd.soft_loss hinton (softmax over classes) does not fit multi-label task {task.name}; "
                             "use sigmoid or logit_mse")
    if cfg.soft_loss == "sigmoid" and (task.kind == "token_classification" or (
            task.kind == "sequence_classification" and task.num_labels > 2)):
        raise BiodistilError(f"kd.soft_loss sigmoid is binary KD; task {task.name} has {task.num_labels} "
                             f"{'tags' if task.kind == 'token_classification' else 'classes'}: use hinton or "
                             "logit_mse")


def pkd_pairs(cfg: KDOptions, student: PreTrainedModel, teacher_layers: int) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs of PatientKD (PKD-Skip or PKD-Last), [] without PatientKD."""
    if cfg.patient is None:
        return []
    layers = int(student.config.num_hidden_layers)
    pairs = (pkd_skip_map if cfg.patient.layer_map == "skip" else pkd_last_map)(layers, teacher_layers)
    if not pairs:
        raise BiodistilError(f"PatientKD maps the student's layers 1..M−1 to teacher layers; this student has "
                             f"{layers} layer(s), so there is nothing to map: use a deeper student or drop kd.patient")
    return pairs


def inverse_softplus(value: float) -> float:
    """x with softplus(x) = value, i.e. log(exp(value) − 1)."""
    return value + math.log(-math.expm1(-value))


# ------------------------------------------------------------------------------------------ module


@dataclass
class Outputs:
    """Logits and the [CLS] states of the PatientKD layers ([B, D] each); `cls_mask` [B] says which rows count."""

    logits: torch.Tensor
    cls: list[torch.Tensor] | None = None
    cls_mask: torch.Tensor | None = None


class KDModule(nn.Module):
    """What the engine trains in `kd`: the student classifier and, for MetaAdaptiveKD, the raw α and β.

    The teacher is held by reference and frozen, except under meta-learning, where it is registered (trained by
    the pre-step's optimizer, checkpointed) and kept in eval mode (no dropout). With cached teacher outputs no
    teacher is held at all: batches carry `teacher_logits` (and `teacher_cls` for PatientKD).
    """

    def __init__(self, student: PreTrainedModel, task: TaskSpec, cfg: KDOptions, teacher: PreTrainedModel | None = None,
                 pairs: list[tuple[int, int]] = (), trainable_teacher: bool = False, adaptive: bool = False):
        super().__init__()
        self.student = student
        self.kind = task.kind
        self.cfg = cfg
        self.pairs = list(pairs)
        self._teacher = (teacher,)
        if trainable_teacher:
            self.teacher_model = teacher
            teacher.eval()
        elif teacher is not None:
            freeze(teacher)
        self.adaptive = adaptive
        if adaptive:  # α = softplus(a), β = softplus(b): always positive
            self.raw_alpha = nn.Parameter(torch.tensor(inverse_softplus(cfg.alpha)))
            self.raw_beta = nn.Parameter(torch.tensor(inverse_softplus(cfg.beta)))

    @property
    def teacher(self) -> PreTrainedModel | None:
        return self._teacher[0]

    def train(self, mode: bool = True) -> "KDModule":
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def weights(self, detach: bool = False) -> tuple[Weight, Weight]:
        """(α, β): the recipe's values, or softplus of the learned raw values (MetaAdaptiveKD)."""
        if not self.adaptive:
            return self.cfg.alpha, self.cfg.beta
        alpha, beta = F.softplus(self.raw_alpha), F.softplus(self.raw_beta)
        return (alpha.detach(), beta.detach()) if detach else (alpha, beta)

    def student_outputs(self, batch: dict[str, torch.Tensor], params: dict[str, torch.Tensor] | None = None,
                        ) -> Outputs:
        """The student's logits (and [CLS] states); with `params`, a functional pass with those weights."""
        inputs = {**model_inputs(self.student, batch), "output_hidden_states": bool(self.pairs)}
        if params is None:
            out = self.student(**inputs)
        else:
            out = functional_call(self.student, params, args=(), kwargs=inputs)
        cls = [out.hidden_states[s][:, 0] for s, _ in self.pairs] if self.pairs else None
        return Outputs(out.logits, cls)

    def teacher_outputs(self, batch: dict[str, torch.Tensor], grad: bool = False) -> Outputs | None:
        """Cached outputs from the batch, else one teacher pass (with gradients only when `grad`)."""
        if "teacher_logits" in batch:
            cls = list(batch["teacher_cls"].unbind(1)) if "teacher_cls" in batch else None
            mask = batch["pkd_mask"].bool() if "pkd_mask" in batch else None
            return Outputs(batch["teacher_logits"], cls, mask)
        if self.teacher is None:
            return None
        with torch.set_grad_enabled(grad):
            logits, states = forward_teacher(self.teacher, model_inputs(self.teacher, batch), bool(self.pairs))
        cls = [states[t][:, 0] for _, t in self.pairs] if self.pairs else None
        return Outputs(logits, cls)

    def distill_loss(self, student: Outputs, teacher: Outputs | None, batch: dict[str, torch.Tensor],
                     alpha: Weight, beta: Weight) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = α·soft + β·CE + γ·PatientKD (soft_loss none: β·CE only)."""
        zero = student.logits.float().sum() * 0.0
        mask = batch["kd_mask"].bool() if "kd_mask" in batch else None
        soft = zero
        if teacher is not None and self.cfg.soft_loss != "none":
            soft = soft_term(self.kind, self.cfg.soft_loss, student.logits, teacher.logits, self.cfg.temperature, mask)
        ce = task_loss(self.kind, student.logits, batch["labels"]) if "labels" in batch else zero
        pkd = self._patient(student, teacher) if self.pairs and teacher is not None else zero
        loss = beta * ce + (alpha * soft if self.cfg.soft_loss != "none" else zero)
        if self.pairs:
            loss = loss + self.cfg.patient.gamma * pkd
        logs = {"soft": soft.detach(), "ce": ce.detach(), "pkd": pkd.detach(),
                "alpha": torch.as_tensor(alpha).detach().float(), "beta": torch.as_tensor(beta).detach().float()}
        return loss, logs

    def _patient(self, student: Outputs, teacher: Outputs) -> torch.Tensor:
        rows = teacher.cls_mask
        if rows is not None and not bool(rows.any()):
            return student.logits.float().sum() * 0.0
        pick = (lambda states: [s[rows] for s in states]) if rows is not None else (lambda states: states)
        return patient_kd_loss(pick(student.cls), [t.to(student.cls[0].dtype) for t in pick(teacher.cls)])

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        alpha, beta = self.weights(detach=True)
        return self.distill_loss(self.student_outputs(batch), self.teacher_outputs(batch), batch, alpha, beta)


@dataclass(frozen=True)
class KDCollator:
    """Pads model inputs and labels like fine-tuning, plus the teacher columns of cached outputs."""

    base: FeatureCollator

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.base([{k: v for k, v in f.items() if k not in TEACHER_KEYS} for f in features])
        length = batch["input_ids"].shape[1]
        first = features[0]
        if "teacher_logits" in first:
            batch["teacher_logits"] = torch.tensor(
                [_pad_rows(f["teacher_logits"], length) for f in features] if self.base.token_labels
                else [f["teacher_logits"] for f in features], dtype=torch.float32)
        if "kd_mask" in first:
            batch["kd_mask"] = torch.tensor([f["kd_mask"] + [0] * (length - len(f["kd_mask"])) for f in features])
        if "teacher_cls" in first:
            batch["teacher_cls"] = torch.tensor([f["teacher_cls"] for f in features], dtype=torch.float32)
            batch["pkd_mask"] = torch.tensor([f["pkd_mask"] for f in features])
        return batch


def _pad_rows(rows: list[list[float]], length: int) -> list[list[float]]:
    return rows + [[0.0] * len(rows[0])] * (length - len(rows))


def kd_features(task: TaskSpec, examples: list[Example], tokenizer: PreTrainedTokenizerBase,
                table: Any | None = None) -> list[dict[str, Any]]:
    """The student's features of the transfer examples: labels only when every example has one; token tasks get
    `kd_mask` (the labelled sub-word positions); cached teacher outputs are attached when `table` is given."""
    encoded = encode_split(task, with_placeholder_labels(examples, task), tokenizer)
    token_task = task.kind == "token_classification"
    positions = [[int(label != -100) for label in f["labels"]] for f in encoded.features] if token_task else None
    if table is not None:
        features = attach_teacher_outputs(encoded, table, task, positions)
    else:
        features = [dict(f) for f in encoded.features]
        for feature, mask in zip(features, positions or [], strict=False):
            feature["kd_mask"] = mask
    if not all(is_labelled(e) for e in examples):
        for feature in features:
            feature.pop("labels")
    return features


# ------------------------------------------------------------------------------------------ command


def run_kd(recipe: KDRecipe, resume: bool = False, stop_after: int | None = None) -> Path:
    """Distil the recipe's teacher into its student over the transfer set; score, export and report."""
    from accelerate.utils import set_seed

    from biodistil.models.loading import load_tokenizer
    from biodistil.training.engine import Engine, make_accelerator
    from biodistil.training.run import RunFolder

    started = time.perf_counter()
    accelerator = make_accelerator(recipe.train.precision, Path(recipe.run.output_dir), recipe.train.tensorboard)
    run = RunFolder(recipe.run.output_dir, recipe, resume, accelerator.is_main_process)
    teacher_path = recipe.teacher.name_or_path
    with accelerator.main_process_first():
        student_path = init_model_path(recipe.student.name_or_path, recipe.student.layers, run.path)
    task = fit_length_to_model(fit_length_to_model(task_spec(recipe.task), student_path), teacher_path)
    check_loss_fits_task(recipe.kd, task)
    with accelerator.main_process_first():
        transfer = transfer_examples(recipe, task, run.path, accelerator.is_main_process)
    train_examples, quiz_examples = split_quiz(recipe, task, transfer)
    tokenizer = load_tokenizer(student_path)
    test = load_task_split(task, recipe.task, "test")
    set_seed(recipe.run.seed)
    student = build_classifier(student_path, task)
    if recipe.meta is not None and accelerator.num_processes > 1:
        raise BiodistilError("Meta-learning (meta: ...) runs in one process: its teacher update is not distributed")
    init_scores = (_init_scores(run.path, student, task, test, tokenizer, recipe.train.batch_size * 2)
                   if accelerator.is_main_process else {})
    with accelerator.main_process_first():
        module, features, pre_step = build_training(recipe, task, student, tokenizer, train_examples, quiz_examples,
                                                    accelerator.device, run.path)
    cfg = recipe.train
    if recipe.kd.epochs is not None:
        per_step = cfg.batch_size * cfg.grad_accumulation * accelerator.num_processes
        cfg = cfg.model_copy(update={"max_steps": steps_for_epochs(len(features), per_step, recipe.kd.epochs)})
    evaluate_fn, selection, cfg = _dev_selection(recipe, task, tokenizer, cfg, len(features))
    engine = Engine(cfg, run.path, recipe.run.seed, accelerator)
    collate = KDCollator(collator_for(task, tokenizer))
    result = engine.fit(module, features, collate, resume=resume, stop_after=stop_after, evaluate_fn=evaluate_fn,
                        selection=selection, pre_step=pre_step)
    if not accelerator.is_main_process:
        return run.model_dir
    finished = stop_after is None or result.steps >= cfg.max_steps
    report = {"task": task.name, "metric": task.headline_key, "steps": result.steps, "finished": finished,
              "transfer": {"source": describe_source(recipe.transfer.source), "size": len(transfer),
                           "randomized": recipe.transfer.random is not None,
                           "fingerprint": fingerprint_examples(transfer)},
              "teacher_outputs": recipe.outputs_mode(), "result": asdict(result)}
    if finished:
        report.update(_final_scores(recipe, task, student, tokenizer, test, init_scores, run.path))
        if recipe.export.enabled:
            from biodistil.export.hf import export_model

            export_model(student, tokenizer, run.model_dir)
            report["model_dir"] = str(run.model_dir)
    if pre_step is not None:
        report["meta"] = pre_step.final_values()
    report["wall_seconds"] = round(time.perf_counter() - started, 1)  # this invocation (a resumed run: since resume)
    report = jsonable(report)
    atomic_write_json(run.path / "metrics.json", report)
    run.write_summary(report)
    run.write_report(f"Task-specific distillation on {task.name}", _report_rows(report))
    return run.model_dir


def transfer_examples(recipe: KDRecipe, task: TaskSpec, run_dir: Path, is_main: bool) -> list[Example]:
    """The run's transfer set: built from the recipe once and kept in `<run>/transfer_set` (reused on resume)."""
    folder = run_dir / "transfer_set"
    if (folder / "transfer.json").is_file():
        return load_transfer_set(folder)
    examples = build_transfer_set(recipe.transfer, task, recipe.task.data_dir, recipe.task.fold)
    if is_main:
        save_transfer_set(examples, folder, {"task": task.name, "source": describe_source(recipe.transfer.source),
                                             "randomized": recipe.transfer.random is not None})
    return examples


def split_quiz(recipe: KDRecipe, task: TaskSpec, examples: list[Example]) -> tuple[list[Example], list[Example]]:
    """(training examples, quiz examples): meta.quiz when given, else a seeded `quiz_fraction` of the transfer set."""
    meta = recipe.meta
    if meta is None:
        return examples, []
    if meta.quiz is not None:
        source = read_source(meta.quiz, task, recipe.task.data_dir, recipe.task.fold)
        pairs = any(isinstance(e, TextExample) and e.text_pair is not None for e in examples)
        quiz = map_labels(shape_for_task(source, task, pairs), task, recipe.transfer.label_map,
                          f"meta.quiz {describe_source(meta.quiz)}")
        return examples, quiz
    order = np.random.default_rng(recipe.run.seed).permutation(len(examples))
    size = max(1, math.ceil(meta.quiz_fraction * len(examples)))
    if len(examples) - size < recipe.train.batch_size:
        raise BiodistilError(f"The transfer set has {len(examples)} examples: too few to split a quiz set of {size} "
                             f"and keep a batch of {recipe.train.batch_size}; give meta.quiz or more data")
    quiz = set(order[:size].tolist())
    return ([e for i, e in enumerate(examples) if i not in quiz], [examples[i] for i in sorted(quiz)])


def build_training(recipe: KDRecipe, task: TaskSpec, student: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                   train_examples: list[Example], quiz_examples: list[Example], device: torch.device,
                   run_dir: Path) -> tuple[KDModule, list[dict[str, Any]], Any]:
    """The module, its training features and (meta-learning) the pre-step that updates the teacher."""
    if recipe.kd.soft_loss == "none":
        return KDModule(student, task, recipe.kd), kd_features(task, train_examples, tokenizer), None
    from transformers import AutoConfig

    teacher_path = recipe.teacher.name_or_path
    pairs = pkd_pairs(recipe.kd, student, int(AutoConfig.from_pretrained(teacher_path).num_hidden_layers))
    if recipe.outputs_mode() == "cached":
        request = TeacherRequest(task, tuple(t for _, t in pairs), recipe.train.batch_size * 2,
                                 recipe.train.progress_bar)
        table = cached_teacher_outputs(teacher_path, train_examples, request, recipe.kd.cache_dir, device)
        features = kd_features(task, train_examples, tokenizer, table)
        return KDModule(student, task, recipe.kd, None, pairs), features, None
    _check_same_tokenizer(teacher_path, tokenizer)
    teacher = load_teacher_classifier(teacher_path, task).to(device)
    meta = recipe.meta
    module = KDModule(student, task, recipe.kd, teacher, pairs, trainable_teacher=meta is not None,
                      adaptive=meta is not None and meta.mode == "adaptive")
    features = kd_features(task, train_examples, tokenizer)
    if meta is None:
        return module, features, None
    from biodistil.methods.meta import MetaTeacherUpdate

    quiz = kd_features(task, quiz_examples, tokenizer)
    pre_step = MetaTeacherUpdate(module, quiz, KDCollator(collator_for(task, tokenizer)), meta, recipe.train,
                                 recipe.run.seed, run_dir / "meta.jsonl")
    return module, features, pre_step


def _check_same_tokenizer(teacher_path: str, tokenizer: PreTrainedTokenizerBase) -> None:
    from biodistil.models.loading import load_tokenizer

    if load_tokenizer(teacher_path).get_vocab() != tokenizer.get_vocab():
        raise BiodistilError("Online teacher outputs (and meta-learning) feed the student's batches to the teacher, "
                             "so teacher and student must share a tokenizer; use kd.teacher_outputs: cached")


def _init_scores(run_dir: Path, student: PreTrainedModel, task: TaskSpec, test: list[Example],
                 tokenizer: PreTrainedTokenizerBase, batch_size: int) -> dict[str, float]:
    """S_init: the student's initialisation (fresh head, seeded) scored on the test set before any training."""
    path = run_dir / "init_scores.json"
    if path.is_file():
        return {key: number(value) for key, value in json.loads(path.read_text()).items()}
    scores = score_model(student, tokenizer, task, test, batch_size).scores if test else {}
    atomic_write_json(path, jsonable(scores))
    return scores


def _dev_selection(recipe: KDRecipe, task: TaskSpec, tokenizer, cfg, num_features: int):
    """With kd.select_on_dev: score the dev split with the task metric and keep the best weights."""
    if not recipe.kd.select_on_dev:
        return None, None, cfg
    from biodistil.training.engine import Selection

    dev = load_task_split(task, recipe.task, "dev")
    if not dev:
        raise BiodistilError(f"kd.select_on_dev: task {task.name} has no dev split")
    if cfg.eval_every == 0:
        cfg = cfg.model_copy(update={"eval_every": max(1, num_features // cfg.batch_size)})

    def evaluate_fn(module: KDModule) -> dict[str, float]:
        return score_model(module.student, tokenizer, task, dev, cfg.batch_size * 2).scores

    return evaluate_fn, Selection(metric=task.headline_key, mode="max"), cfg


def _final_scores(recipe: KDRecipe, task: TaskSpec, student: PreTrainedModel, tokenizer, test: list[Example],
                  init_scores: dict[str, float], run_dir: Path) -> dict[str, Any]:
    if not test:
        return {}
    scored = score_model(student, tokenizer, task, test, recipe.train.batch_size * 2)
    scores = scored.scores
    write_predictions(run_dir / "test_predictions.jsonl", test, scored.predictions)
    teacher = teacher_test_scores(recipe.teacher.name_or_path, task, test, recipe.kd.cache_dir,
                                  recipe.train.batch_size * 2)
    return {"test": scores, "init": init_scores, "teacher": teacher,
            "gap_closed": gap_closed(scores, init_scores, teacher)}


def _report_rows(report: dict[str, Any]) -> dict[str, object]:
    rows: dict[str, object] = {"task / metric": f"{report['task']} / {report['metric']}",
                               "transfer set": f"{report['transfer']['source']} ({report['transfer']['size']} "
                                               f"examples)", "teacher outputs": report["teacher_outputs"],
                               "steps": report["steps"]}
    for name in ("test", "init", "teacher", "gap_closed"):
        if name in report:
            rows[name] = ", ".join(f"{k} {number(v):.4f}" for k, v in report[name].items())
    if "meta" in report:
        rows["meta"] = ", ".join(f"{k} {number(v):.4g}" for k, v in report["meta"].items())
    rows["model"] = f"`{report['model_dir']}`" if "model_dir" in report else "not exported"
    return rows
