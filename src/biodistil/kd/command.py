"""`biodistil kd`: train a student on a fine-tuned teacher's outputs over a transfer set, with the one engine.

Reading order: the transfer set (`biodistil.kd.transfer`), the teacher signal (`biodistil.teachers.signal`: outputs
stored once by `biodistil.teachers.task_cache`, or the teacher run online), the module and its loss as terms of the
objective registry (`biodistil.kd.module`, `biodistil.kd.objective`): L = α·soft + β·CE + γ·PatientKD. With
`meta`, MetaDistil or MetaAdaptiveKD (`biodistil.kd.meta`) updates the teacher (and α, β) before every student
step. After training, the student is scored on the task's test set beside its initialisation and the teacher,
and the share of the gap it closes, (S − S_init)/(T − S_init), is reported.
"""

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerBase

from biodistil.config import TrainConfig
from biodistil.data.formats import Example, TextExample
from biodistil.errors import BiodistilError
from biodistil.finetune.init_model import init_model_path
from biodistil.finetune.on_task import steps_for_epochs
from biodistil.finetune.selection import (
    DevSelection,
    ScoringSplit,
    select_on_dev,
    write_dev_predictions,
    write_test_results,
)
from biodistil.io import atomic_write_json, jsonable, number, read_record
from biodistil.kd.meta import MetaTeacherUpdate
from biodistil.kd.module import KDModule, kd_data
from biodistil.kd.objective import check_loss_fits_task, kd_terms, pkd_pairs
from biodistil.kd.recipe import KDRecipe
from biodistil.kd.transfer import (
    build_transfer_set,
    describe_source,
    describe_transfer,
    fingerprint_examples,
    is_labelled,
    load_transfer_set,
    map_labels,
    read_source,
    save_transfer_set,
    shape_for_task,
)
from biodistil.methods.cross_tokenizer import refuse_unsupported, term_support, tokenizer_pair
from biodistil.methods.several_teachers import Teachers, render_teacher_table, teacher_table
from biodistil.models.loading import load_tokenizer
from biodistil.models.saving import export_model
from biodistil.paths import recorded
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.encoding import fit_length_to_model
from biodistil.tasks.metrics import format_metric
from biodistil.tasks.recipe import load_task_split, task_spec
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score_model
from biodistil.teachers.loading import check_teacher_for_task, load_teacher_classifier
from biodistil.teachers.signal import CachedTeacher, OnlineTeacher, TeacherSignal, classifier_forward
from biodistil.teachers.task_cache import TeacherRequest, cached_teacher_outputs, teacher_test_scores
from biodistil.training.engine import Collate, Engine, HeldOut, TrainData, TrainResult
from biodistil.training.machine import teacher_dtype
from biodistil.training.run import Report, RunFolder, open_run


@dataclass
class KDSetup:
    """Everything a kd run trains and scores, built from the recipe before the engine starts."""

    task: TaskSpec
    tokenizer: PreTrainedTokenizerBase
    student: PreTrainedModel
    transfer: list[Example]
    test: list[Example]
    init_scores: dict[str, float]
    module: KDModule
    features: list[dict[str, Any]]
    collate: Collate
    pre_step: MetaTeacherUpdate | None
    teachers: list[dict[str, Any]]  # several teachers: the pre-flight table (teacher × term); one teacher: []


def run_kd(recipe: KDRecipe, resume: bool = False, stop_after: int | None = None) -> Path:
    """Distil the recipe's teacher into its student over the transfer set; score, export and report."""
    started = time.perf_counter()
    teachers = [(entry.name_or_path, f"{recipe.teacher_field(k)}.name_or_path", False)
                for k, entry in enumerate(recipe.teacher_entries())]
    run, accelerator = open_run(recipe, resume, [*teachers, (recipe.student.name_or_path, "student.name_or_path",
                                                             False)])
    setup = setup_kd(recipe, run.path, accelerator)
    cfg = _train_config(recipe, len(setup.features), accelerator.num_processes)
    evaluate_fn, selection, cfg = _dev_selection(recipe, setup.task, setup.tokenizer, cfg, len(setup.features),
                                                 accelerator.num_processes)
    engine = Engine(cfg, run.path, recipe.run.seed, accelerator)
    result = engine.fit(setup.module, TrainData(setup.features, setup.collate), HeldOut(evaluate_fn, selection),
                        resume=run.resume, stop_after=stop_after, pre_step=setup.pre_step)
    if not accelerator.is_main_process:
        return run.model_dir
    report = _report(recipe, setup, result, run, finished=stop_after is None or result.steps >= cfg.max_steps)
    # this invocation, plus a resumed run's training before the checkpoint it resumed (not that segment's set-up)
    report["wall_seconds"] = round(time.perf_counter() - started + result.earlier_seconds, 1)
    report = jsonable(report)
    return run.finish(report, Report(f"Task-specific distillation on {setup.task.name}", _report_rows(report),
                                     [f"**Warning:** {note}" for note in report.get("notes", [])], result),
                      metrics=report)


def setup_kd(recipe: KDRecipe, run_dir: Path, accelerator: Any) -> KDSetup:
    """The task (lengths fit to both models), the transfer set, the student (seeded fresh head) and its score
    before training, and the module with its teacher signal and features."""
    from accelerate.utils import set_seed

    with accelerator.main_process_first():
        student_path = init_model_path(recipe.student.name_or_path, recipe.student.layers, run_dir,
                                       recipe.student.reinitialise, recipe.run.seed)
    task = kd_task(recipe, student_path)
    teachers = _teacher_table(recipe, task) if recipe.teachers is not None else []
    if accelerator.is_local_main_process and teachers:
        print(render_teacher_table(teachers), flush=True)
    with accelerator.main_process_first():
        transfer = transfer_examples(recipe, task, run_dir, accelerator.is_main_process)
    if accelerator.is_local_main_process:
        cap = f", capped at task.max_examples={recipe.task.max_examples}" if recipe.task.max_examples and \
            recipe.transfer.source.kind == "in_domain" else ""
        print(f"Transfer set: {len(transfer):,} examples from {describe_transfer(recipe.transfer)}{cap}; "
              f"{sum(map(is_labelled, transfer)):,} keep a gold label", flush=True)
    train_examples, quiz_examples = split_quiz(recipe, task, transfer)
    tokenizer = load_tokenizer(student_path)
    test = load_task_split(task, recipe.task, "test")
    set_seed(recipe.run.seed)
    student = build_classifier(student_path, task)
    if recipe.meta is not None and accelerator.num_processes > 1:
        raise BiodistilError("Meta-learning (meta: ...) runs in one process: its teacher update is not distributed")
    init_scores = (_init_scores(run_dir, student, task, test, tokenizer, recipe.train.batch_size * 2)
                   if accelerator.is_main_process else {})
    with accelerator.main_process_first():
        module, (features, collate), pre_step = build_training(
            recipe, task, student, tokenizer, train_examples, quiz_examples, accelerator.device, run_dir)
    return KDSetup(task, tokenizer, student, transfer, test, init_scores, module, features, collate, pre_step,
                   teachers)


def _train_config(recipe: KDRecipe, num_features: int, processes: int) -> TrainConfig:
    """The recipe's train section, with max_steps from kd.epochs when given."""
    cfg = recipe.train
    if recipe.kd.epochs is None:
        return cfg
    per_step = cfg.batch_size * cfg.grad_accumulation * processes
    return cfg.model_copy(update={"max_steps": steps_for_epochs(num_features, per_step, recipe.kd.epochs)})


def _teacher_table(recipe: KDRecipe, task: TaskSpec) -> list[dict[str, Any]]:
    """The pre-flight table (one row per teacher: its model, λ, tokens, and per teacher term what it contributes),
    after refusing a teacher whose head or labels are not the task's, naming it and the mismatch."""
    student_tokenizer = load_tokenizer(recipe.student.name_or_path)
    entries = recipe.teacher_entries()
    about = []
    for index, entry in enumerate(entries):
        with recipe.naming_teacher(index):
            check_teacher_for_task(entry.name_or_path, task)
        same = tokenizer_pair(student_tokenizer, load_tokenizer(entry.name_or_path)) == "same"
        dtype = "" if entry.dtype == "float32" else f" ({entry.dtype})"
        about.append({"teacher": f"{entry.name_or_path}{dtype}", "tokens": "the student's" if same else (
            "its own: outputs stored per word" if recipe.outputs_mode() == "cached" else "its own")})
    teachers = Teachers(tuple(entry.weight for entry in entries), recipe.kd)
    return teacher_table(teachers, {t.name: t.spec for t in kd_terms(recipe.kd) if t.spec.needs_teacher}, about)


def _report(recipe: KDRecipe, setup: KDSetup, result: TrainResult, run: RunFolder, finished: bool) -> dict[str, Any]:
    """metrics.json: the run, its transfer set and, once finished, the scores (and the exported model)."""
    report = {"task": setup.task.name, "metric": setup.task.headline_key, "steps": result.steps, "finished": finished,
              "transfer": {"source": describe_transfer(recipe.transfer), "size": len(setup.transfer),
                           "labelled": sum(map(is_labelled, setup.transfer)),
                           "randomized": recipe.transfer.random is not None,
                           "fingerprint": fingerprint_examples(setup.transfer)},
              "teacher_outputs": recipe.outputs_mode(), "result": asdict(result),
              **({"teachers": setup.teachers, "combine": recipe.kd.combine, "confidence": recipe.kd.confidence}
                 if setup.teachers else {})}
    if finished:
        report.update(_final_scores(recipe, setup.task, setup.student, setup.tokenizer, setup.test,
                                    setup.init_scores, run.path))
        if recipe.export.enabled:
            export_model(setup.student, setup.tokenizer, run.model_dir)
            report["model_dir"] = recorded(run.model_dir, run.path)
    if setup.pre_step is not None:
        report["meta"] = setup.pre_step.final_values()
    return report


def _transfer_row(transfer: dict[str, Any]) -> str:
    labelled = f", {transfer['labelled']:,} with a gold label" if "labelled" in transfer else ""
    return f"{transfer['source']} ({transfer['size']:,} examples{labelled})"


def transfer_examples(recipe: KDRecipe, task: TaskSpec, run_dir: Path, is_main: bool) -> list[Example]:
    """The run's transfer set: built from the recipe once and kept in `<run>/transfer_set` (reused on resume)."""
    folder = run_dir / "transfer_set"
    if (folder / "transfer.json").is_file():
        try:
            return load_transfer_set(folder)
        except BiodistilError as err:  # the run's own copy, damaged: built again from the recipe
            print(f"{err}; building the run's transfer set again", flush=True)
    examples = build_transfer_set(recipe.transfer, task, recipe.task.data_dir, recipe.task.fold,
                                  recipe.task.max_examples)
    if is_main:
        save_transfer_set(examples, folder, {"task": task.name, "source": describe_transfer(recipe.transfer),
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
                   run_dir: Path) -> tuple[KDModule, tuple[list[dict[str, Any]], Collate], MetaTeacherUpdate | None]:
    """The module with its teacher signal, its training features and their collate, and (meta-learning) the
    pre-step that updates the teacher."""
    pairs: list[tuple[int, int]] = []
    signals: list[TeacherSignal] = []
    entries = recipe.teacher_entries()
    if recipe.kd.soft_loss != "none":
        pairs, signals = teacher_signals(recipe, task, int(student.config.num_hidden_layers), train_examples, device)
    signal = signals[0] if len(signals) == 1 else signals or None
    meta = recipe.meta
    module = KDModule(student, task, recipe.kd, signal, pairs, trainable_teacher=meta is not None,
                      adaptive=meta is not None and meta.mode == "adaptive",
                      teacher_weights=[entry.weight for entry in entries])
    teacher_tokenizer = online_teacher_tokenizer(recipe, task, tokenizer, signals)
    data = kd_data(task, train_examples, tokenizer, signal, teacher_tokenizer)
    if meta is None:
        return module, data, None
    quiz, quiz_collate = kd_data(task, quiz_examples, tokenizer, signal, teacher_tokenizer)
    pre_step = MetaTeacherUpdate(module, quiz, quiz_collate, meta, recipe.train, recipe.run.seed,
                                 run_dir / "meta.jsonl")
    return module, data, pre_step


def kd_task(recipe: KDRecipe, student_path: str) -> TaskSpec:
    """The recipe's task with its length fit to the student and every teacher, its loss checked against it."""
    task = fit_length_to_model(task_spec(recipe.task), student_path)
    for entry in recipe.teacher_entries():
        task = fit_length_to_model(task, entry.name_or_path)
    check_loss_fits_task(recipe.kd, task)
    return task


def teacher_signals(recipe: KDRecipe, task: TaskSpec, student_layers: int, train_examples: list[Example],
                    device: torch.device) -> tuple[list[tuple[int, int]], list[TeacherSignal]]:
    """PatientKD's layer pairs and each teacher's signal (cached ones built in the store if missing)."""
    entries = recipe.teacher_entries()
    depths = [int(AutoConfig.from_pretrained(entry.name_or_path).num_hidden_layers) for entry in entries]
    pairs = pkd_pairs(recipe.kd, student_layers, depths[0])
    cls_layers = [t for _, t in pairs]
    return pairs, [teacher_signal(recipe, entry.name_or_path, task, train_examples, cls_layers, depth, device, slot,
                                  teacher_dtype(entry.dtype, device))
                   for slot, (entry, depth) in enumerate(zip(entries, depths, strict=True))]


def prepare_teacher_outputs(recipe: KDRecipe) -> bool:
    """Build, in the store, the cached teacher outputs the kd run of `recipe` will read — as the run itself would,
    on the CPU — and say whether it did (or found them there). A study runs this before running its runs side by
    side, so that each cache entry is built once with every core instead of by every run that needs it at once, each
    on its share of the cores. Nothing to do (False) for online teachers, a student built from chosen layers (its
    folder is made inside the run), or on a GPU machine (where the runs would compute them on the GPU, perhaps in
    another dtype)."""
    if (recipe.outputs_mode() != "cached" or recipe.kd.soft_loss == "none" or recipe.student.layers is not None
            or recipe.student.reinitialise or torch.cuda.is_available()):
        return False
    task = kd_task(recipe, recipe.student.name_or_path)
    examples = build_transfer_set(recipe.transfer, task, recipe.task.data_dir, recipe.task.fold,
                                  recipe.task.max_examples)
    student_layers = int(AutoConfig.from_pretrained(recipe.student.name_or_path).num_hidden_layers)
    teacher_signals(recipe, task, student_layers, split_quiz(recipe, task, examples)[0], torch.device("cpu"))
    return True


def teacher_signal(recipe: KDRecipe, teacher_path: str, task: TaskSpec, examples: list[Example],
                   cls_layers: list[int], teacher_layers: int, device: torch.device, slot: int = 0,
                   dtype: torch.dtype = torch.float32) -> TeacherSignal:
    """One teacher's source of outputs: cached once over the transfer examples (its own cache entry, keyed by what
    the teacher is), or the teacher online, in `dtype`; `slot`: its payload in each batch (several teachers: their
    order)."""
    if recipe.outputs_mode() == "cached":
        request = TeacherRequest(task, tuple(cls_layers), recipe.train.batch_size * 2, recipe.train.progress_bar,
                                 teacher_layers, dtype)
        outputs = cached_teacher_outputs(teacher_path, examples, request, recipe.kd.cache_dir, device)
        return CachedTeacher(outputs, slot=slot)
    model = load_teacher_classifier(teacher_path, task).to(device, dtype=dtype)
    return OnlineTeacher(model, classifier_forward, slot)


def online_teacher_tokenizer(recipe: KDRecipe, task: TaskSpec, tokenizer: PreTrainedTokenizerBase,
                             signals: list[TeacherSignal]) -> PreTrainedTokenizerBase | None:
    """The online teacher's tokenizer when it is not the student's (the batches then carry the teacher's own tokens
    of each text: `kd_features`), after the pre-flight of the kd terms for the pair; None otherwise. Several online
    teachers must share the student's tokenizer (cached teachers need not: their outputs are stored per word)."""
    if not signals or signals[0].model is None:
        return None
    entries = recipe.teacher_entries()
    tokenizers = [load_tokenizer(entry.name_or_path) for entry in entries]
    differ = [entry.name_or_path for entry, other in zip(entries, tokenizers, strict=True)
              if tokenizer_pair(tokenizer, other) != "same"]
    if not differ:
        return None
    if len(entries) > 1:
        raise BiodistilError(f"Several online teachers read the student's tokens; {differ} tokenize differently: "
                             "use kd.teacher_outputs: cached (each teacher's outputs are stored per word)")
    teacher_tokenizer = tokenizers[0]
    head = "token" if task.kind == "token_classification" else "sequence"
    refuse_unsupported(term_support(tokenizer, teacher_tokenizer, [t.cfg for t in kd_terms(recipe.kd)], head))
    return teacher_tokenizer


def _init_scores(run_dir: Path, student: PreTrainedModel, task: TaskSpec, test: list[Example],
                 tokenizer: PreTrainedTokenizerBase, batch_size: int) -> dict[str, float]:
    """S_init: the student's initialisation (fresh head, seeded) scored on the test set before any training."""
    path = run_dir / "init_scores.json"
    found = read_record(path, note="scored again")
    if isinstance(found, dict):
        return {key: number(value) for key, value in found.items()}
    scores = score_model(student, tokenizer, task, test, batch_size).scores if test else {}
    atomic_write_json(path, jsonable(scores))
    return scores


def _dev_selection(recipe: KDRecipe, task: TaskSpec, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig,
                   num_features: int, processes: int) -> DevSelection:
    """With kd.select_on_dev: score the dev split with the task metric and keep the best weights."""
    if not recipe.kd.select_on_dev:
        return DevSelection(None, None, cfg)
    dev = load_task_split(task, recipe.task, "dev")
    if not dev:
        raise BiodistilError(f"kd.select_on_dev: task {task.name} has no dev split")
    return select_on_dev(ScoringSplit.encode(task, dev, tokenizer), cfg, num_features, _student, processes=processes)


def _student(module: KDModule) -> PreTrainedModel:
    return module.student


def _final_scores(recipe: KDRecipe, task: TaskSpec, student: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  test: list[Example], init_scores: dict[str, float], run_dir: Path) -> dict[str, Any]:
    """The student's test scores (predictions written, notes printed) beside its initialisation and the teacher."""
    if not test:
        return {}
    scored = ScoringSplit.encode(task, test, tokenizer).scored(student, recipe.train.batch_size * 2)
    written = write_test_results(run_dir, task, test, scored.predictions, {"test": scored.truncated_examples},
                                 data_root=recipe.task.data_dir, fold=recipe.task.fold)
    scores = {**scored.scores, **written.get("character_f1", {})}
    _dev_predictions(recipe, task, student, tokenizer, run_dir)
    teachers = [teacher_test_scores(entry.name_or_path, task, test, recipe.kd.cache_dir, recipe.train.batch_size * 2)
                for entry in recipe.teacher_entries()]
    teacher = max(teachers, key=lambda found: found.get(task.headline_key, -math.inf))  # the best one, with several
    several = {"teachers_test": teachers} if len(teachers) > 1 else {}
    return {"test": scores, "init": init_scores, "teacher": teacher,
            "gap_closed": gap_closed(scores, init_scores, teacher), **several, **written}


def _dev_predictions(recipe: KDRecipe, task: TaskSpec, student: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     run_dir: Path) -> None:
    """The final student's dev predictions beside its test ones (a study's share of the teacher on dev)."""
    dev = load_task_split(task, recipe.task, "dev")
    if dev:
        scored = ScoringSplit.encode(task, dev, tokenizer).scored(student, recipe.train.batch_size * 2)
        write_dev_predictions(run_dir, dev, scored.predictions)


def _report_rows(report: dict[str, Any]) -> dict[str, object]:
    rows: dict[str, object] = {"task / metric": f"{report['task']} / {report['metric']}",
                               "transfer set": _transfer_row(report["transfer"]),
                               "teacher outputs": report["teacher_outputs"], "steps": report["steps"]}
    for name in ("test", "init", "teacher", "gap_closed"):
        if name in report:
            rows[name] = ", ".join(f"{k} {format_metric(k, v)}" for k, v in report[name].items())
    if "meta" in report:
        rows["meta"] = ", ".join(f"{k} {number(v):.4g}" for k, v in report["meta"].items())
    if report.get("teachers"):
        how = f"{report['combine']}" + (", confidence-weighted" if report.get("confidence") else "")
        rows["teachers"] = f"{how}: " + "; ".join(f"{row['teacher']} (λ {row['weight']:.2f})"
                                                   for row in report["teachers"])
        rows["teacher"] = f"the best of the teachers: {rows.get('teacher', '')}"
    if report.get("degenerate"):
        rows["test"] = f"{rows['test']} (degenerate: {report['degenerate']})"
    rows["model"] = f"`{report['model_dir']}`" if "model_dir" in report else "not exported"
    return rows


def gap_closed(student: dict[str, float], init: dict[str, float], teacher: dict[str, float]) -> dict[str, float]:
    """(S − S_init)/(T − S_init) per metric key: the share of the initialisation–teacher gap the student closes
    (NaN where the teacher does not beat the initialisation by a margin)."""
    gaps = {}
    for key in student.keys() & init.keys() & teacher.keys():
        span = teacher[key] - init[key]
        finite = all(math.isfinite(v) for v in (student[key], init[key], teacher[key]))
        gaps[key] = (student[key] - init[key]) / span if finite and abs(span) > 1e-12 else math.nan
    return dict(sorted(gaps.items()))
