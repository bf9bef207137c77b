"""`biodistil evaluate`: fine-tune every model on every task for N seeds (and folds), write predictions and
metrics per cell, summarise over seeds, optionally benchmark, and build the report.

Run folder:

    <out>/config.yaml                      the resolved recipe
    <out>/cells/<model>/<task>/seed-<s>[/fold-<k>]/
        predictions.jsonl                  test set, one line per example, with its id
        metrics.json                       written last (atomically): its presence marks the cell finished
        train/metrics.jsonl                the fine-tuning curve (checkpoints are deleted after the cell)
        model/                             the fine-tuned model, only with `save_models: true`
    <out>/results.json                     every finished cell + per model/task summaries over seeds
    <out>/bench.json                       with `bench.enabled: true`
    <out>/report.md, report.html, *.png

`--resume` skips finished cells and starts unfinished ones again from scratch; a finished cell whose
settings differ from the recipe's is an error (use another output folder).

Under `accelerate launch` / `torchrun` with P processes the cells are shared out: the main process prepares the
folder (lock, config.yaml, init_models) and lists the unfinished cells; `training.processes.assign` gives each to one
process, the most expensive first, to the process with the least expected work (`expected_costs`); each process
fine-tunes its cells one after the other on its own device, without DDP, writing only their folders. After every
process is done, the main process writes results.json, the bench and the report: the same as one process's, since
each cell's result depends on its seed alone. Resuming works with any number of processes (the unfinished cells are
shared out again).

In one process, `--processes N|auto` runs the unfinished cells N at a time in worker processes of this machine
instead (`training.pool`: each worker at a fixed share of the cores, each cell's console output in
`<out>/logs/<cell>.log`); results.json, the bench and the report are then written as above, once every cell is done.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from biodistil.data.paths import resolve_data_root
from biodistil.errors import BiodistilError
from biodistil.evaluation.recipe import METRIC_FAMILY, EvaluateRecipe, TaskEntry
from biodistil.evaluation.results import RESULTS_FILE, RESULTS_FORMAT
from biodistil.finetune.init_model import init_model_path
from biodistil.io import atomic_write_json, atomic_write_jsonl, read_record
from biodistil.models.loading import check_model
from biodistil.paths import looks_like_path
from biodistil.tasks.encoding import fit_length_to_model
from biodistil.tasks.metrics import aggregate_folds, summarize_seeds
from biodistil.tasks.prediction import degenerate, prediction_rows
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.scoring import span_task_record
from biodistil.tasks.splits import read_split
from biodistil.training.pool import run_in_workers, side_by_side_plan
from biodistil.training.processes import Launch, assign
from biodistil.training.run import JobFolder, finished, run_stage

CELL_RECORD = "metrics.json"  # a cell's record, written last: the marker `finished` reads

# Train settings that do not change a cell's result (left out of the resume check).
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_COSMETIC = {"progress_bar", "log_every", "tensorboard", "keep_checkpoints", "save_every"}


@dataclass(frozen=True)
class PlannedTask:
    """A task with every setting of its cells resolved (recipe entry > recipe train section > task)."""

    spec: TaskSpec
    family: str
    learning_rate: float
    batch_size: int
    epochs: float
    patience: int | None
    max_examples: int | None
    folds: tuple[int | None, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    def settings(self) -> dict[str, Any]:
        """What determines the task's cells (besides model, seed and fold)."""
        spec = self.spec
        return {"learning_rate": self.learning_rate, "batch_size": self.batch_size, "epochs": self.epochs,
                "early_stopping_patience": self.patience, "max_examples": self.max_examples,
                "label_policy": spec.label_policy, "truncation": spec.truncation, "max_length": spec.max_length,
                "n_folds": len([f for f in self.folds if f is not None]) or None}


@dataclass(frozen=True)
class Cell:
    """One fine-tuning run: a model on a task with a seed (and a cross-validation fold)."""

    label: str
    path: str
    task: PlannedTask
    seed: int
    fold: int | None

    def folder(self, out: Path) -> Path:
        folder = out / "cells" / self.label / self.task.name / f"seed-{self.seed}"
        return folder / f"fold-{self.fold}" if self.fold is not None else folder

    def describe(self) -> str:
        fold = f" fold {self.fold}" if self.fold is not None else ""
        return f"{self.label} · {self.task.name} · seed {self.seed}{fold}"


# ------------------------------------------------------------------------------------------- planning


def _first(*values: Any) -> Any:
    """The first value that is not None."""
    return next((v for v in values if v is not None), None)


def _override_task(spec: TaskSpec, entry: TaskEntry) -> TaskSpec:
    """The task with the entry's label_policy / truncation / max_length, validated like a task file."""
    updates = {key: getattr(entry, key) for key in ("label_policy", "truncation", "max_length")}
    updates = {key: value for key, value in updates.items() if value is not None}
    if not updates:
        return spec
    try:
        return TaskSpec.model_validate({**spec.model_dump(), **updates})
    except ValidationError as err:
        problems = "; ".join(e["msg"] for e in err.errors())
        raise BiodistilError(f"Recipe tasks entry '{entry.name}': {problems}") from None


def plan_task(entry: TaskEntry, recipe: EvaluateRecipe) -> PlannedTask:
    """Resolve one recipe task entry against its task definition."""
    spec = _override_task(get_task(entry.name), entry)
    defaults, train, data = spec.hyperparameters, recipe.train, recipe.data
    patience = _first(entry.early_stopping_patience, train.early_stopping_patience, defaults.early_stopping_patience)
    max_folds = _first(entry.max_folds, data.max_folds)
    folds: tuple[int | None, ...] = tuple(spec.folds[:max_folds] if max_folds else spec.folds) or (None,)
    return PlannedTask(spec=spec,
                       family=entry.family or METRIC_FAMILY[spec.metric],
                       learning_rate=_first(entry.learning_rate, train.learning_rate, defaults.learning_rate),
                       batch_size=_first(entry.batch_size, train.batch_size, defaults.batch_size),
                       epochs=_first(entry.epochs, train.epochs, defaults.epochs),
                       patience=patience or None,
                       max_examples=_first(entry.max_examples, data.max_examples),
                       folds=folds)


def plan_tasks(recipe: EvaluateRecipe) -> tuple[list[PlannedTask], list[dict[str, str]]]:
    """The recipe's tasks whose data is present, and a note for each skipped one."""
    planned, skipped = [], []
    for entry in recipe.tasks:
        task = plan_task(entry, recipe)
        missing = task.spec.missing_files(recipe.data.root)
        if missing and recipe.data.skip_missing:
            skipped.append({"task": task.name, "reason": f"data absent ({', '.join(missing[:3])}"
                            f"{', ...' if len(missing) > 3 else ''})"})
            continue
        if missing:
            raise BiodistilError(f"Task '{task.name}': files absent: {missing} (set data.skip_missing=true to skip)")
        planned.append(task)
    names = [t.name for t in planned]
    unsafe = [n for n in names if not _SAFE_NAME.fullmatch(n)]
    if unsafe:
        raise BiodistilError(f"Task name(s) {unsafe} cannot name a folder; use letters, digits, '.', '_', '-'")
    if len(set(names)) != len(names):
        raise BiodistilError(f"Recipe tasks: two entries define the same task name ({names}); rename one")
    return planned, skipped


def check_models(recipe: EvaluateRecipe, out: Path) -> list[tuple[str, str]]:
    """(label, path) of every model, after checking that local folders exist and hold a model; an entry with
    `layers` or `reinitialise` is written once as that model to <out>/init_models/<label>."""
    models = []
    for label, entry in zip(recipe.model_labels(), recipe.models, strict=True):
        local = Path(entry.path).expanduser()
        if local.is_dir() and not (local / "config.json").is_file():
            raise BiodistilError(f"Recipe models: folder {local} has no config.json (expected a Hugging Face model)")
        if local.exists() and not local.is_dir():
            raise BiodistilError(f"Recipe models: '{entry.path}' is a file; expected a model folder or a Hub id")
        if not local.exists() and looks_like_path(entry.path):
            raise BiodistilError(f"Recipe models: model folder '{entry.path}' not found (expected a folder with "
                                 "config.json, or a Hub id such as dmis-lab/biobert-base-cased-v1.2)")
        check_model(entry.path, f"Recipe models: {label}")
        models.append((label, init_model_path(entry.path, entry.layers, out / "init_models" / label,
                                              entry.reinitialise, recipe.run.seed)))
    return models


def plan_cells(models: Sequence[tuple[str, str]], tasks: Sequence[PlannedTask], seeds: Sequence[int]) -> list[Cell]:
    """Every cell, task by task and seed by seed, so that models are compared early in a long run."""
    return [Cell(label, path, task, seed, fold)
            for task in tasks for seed in seeds for label, path in models for fold in task.folds]


# ------------------------------------------------------------------------------------------ one cell


def cell_settings(cell: Cell, recipe: EvaluateRecipe) -> dict[str, Any]:
    """Everything that determines a cell's result, as JSON values (compared on resume)."""
    train = recipe.train.for_cell(cell.task.learning_rate, cell.task.batch_size).model_dump(mode="json")
    settings = {"model_path": cell.path, **cell.task.settings(),
                "train": {k: v for k, v in train.items() if k not in _COSMETIC and k not in ("max_steps",)}}
    return json.loads(json.dumps(settings))


def _finished(cell: Cell, out: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a finished cell (None if unfinished); an error if it was run with other settings."""
    record = finished(cell.folder(out), CELL_RECORD)
    if record is not None:
        _same_settings(record, cell, out, settings)
    return record


def _same_settings(record: dict[str, Any], cell: Cell, out: Path, settings: dict[str, Any]) -> None:
    """Refuse a finished cell that was run with other settings, naming them."""
    old = record.get("settings", {})
    if old != settings:
        changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        raise BiodistilError(
            f"{cell.folder(out) / CELL_RECORD}: this finished cell was run with other settings ({', '.join(changed)}: "
            f"{[old.get(k) for k in changed]} then, {[settings.get(k) for k in changed]} now). "
            "Use another output folder, or delete the cell to run it again."
        )


def _parameters(model: Any) -> dict[str, int]:
    from biodistil.models.size import count_parameters

    return count_parameters(getattr(model, "base_model", model))


def run_cell(cell: Cell, out: Path, recipe: EvaluateRecipe, settings: dict[str, Any]) -> dict[str, Any]:
    """Fine-tune and score one cell in its (empty) folder; write predictions.jsonl and, last, metrics.json."""
    from biodistil.finetune.on_task import finetune_on_task

    started = time.perf_counter()
    folder = cell.folder(out)
    task = cell.task
    cfg = recipe.train.for_cell(task.learning_rate, task.batch_size)
    outcome = finetune_on_task(cell.path, task.spec, recipe.data.root, cfg, folder / "train", cell.seed,
                               fold=cell.fold, epochs=task.epochs, patience=task.patience,
                               max_examples=task.max_examples)
    rows = prediction_rows(task.spec, outcome.test_examples, outcome.test_predictions)
    atomic_write_jsonl(folder / "predictions.jsonl", rows)
    if recipe.save_models:
        from biodistil.models.saving import export_model

        export_model(outcome.model, outcome.tokenizer, folder / "model")
    for leftover in ("checkpoints", "best"):
        shutil.rmtree(folder / "train" / leftover, ignore_errors=True)
    record = {
        "model": cell.label, "task": task.name, "seed": cell.seed, "fold": cell.fold, "family": task.family,
        "metric": task.spec.metric, "headline": task.spec.headline_key,
        "score": outcome.test_scores[task.spec.headline_key], "test": outcome.test_scores,
        "dev": outcome.dev_scores, "truncated_examples": outcome.truncated, "markers_cut": outcome.markers_cut,
        "degenerate": degenerate(task.spec, outcome.test_predictions),
        "unpredicted_words": outcome.test_predictions.filled_words, "test_examples": len(outcome.test_examples),
        "max_length_used": fit_length_to_model(task.spec, cell.path).max_length,
        "parameters": _parameters(outcome.model),
        "train": {"steps": outcome.train.steps, "best_step": outcome.train.best_step,
                  "best_dev_score": outcome.train.best_score, "seconds": round(outcome.train.seconds, 2),
                  "tokens_per_second": round(outcome.train.tokens_per_second, 1)},
        "settings": settings, "wall_seconds": round(time.perf_counter() - started, 1),
    }
    if task.spec.is_span_task:  # its gold entities' counts and the character-level scores beside the token-level ones
        spans = span_task_record(task.spec, outcome.test_examples, outcome.test_predictions.labels, "test",
                                 recipe.data.root, cell.fold)
        record["test"] = {**record["test"], **spans.get("character_f1", {})}
        record.update(spans)
    atomic_write_json(folder / CELL_RECORD, record)
    return record


# ------------------------------------------------------------------------------------------ summaries


def _seed_metrics(records: list[dict[str, Any]], n_folds: int | None) -> dict[str, float] | None:
    """Test metrics of one seed: the cell's, or the mean over folds (None while folds are missing)."""
    if n_folds is None:
        return dict(records[0]["test"])
    if len(records) < n_folds:
        return None
    return aggregate_folds([r["test"] for r in sorted(records, key=lambda r: r["fold"])])


def summarize_task(records: list[dict[str, Any]], task: PlannedTask) -> dict[str, Any] | None:
    """Per-seed headline scores of one (model, task) and their median, mean, std; None if no seed is done."""
    by_seed: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_seed[record["seed"]].append(record)
    headline = task.spec.headline_key
    per_seed = {seed: _seed_metrics(group, task.settings()["n_folds"]) for seed, group in sorted(by_seed.items())}
    per_seed = {seed: metrics for seed, metrics in per_seed.items() if metrics is not None}
    if not per_seed:
        return None
    keys = [k for k in next(iter(per_seed.values())) if all(k in m for m in per_seed.values())]
    return {
        "family": task.family, "metric": task.spec.metric, "headline": headline,
        **summarize_seeds([m[headline] for m in per_seed.values()]),
        "seeds": {str(seed): m[headline] for seed, m in per_seed.items()},
        "metrics_mean": {k: statistics.fmean(m[k] for m in per_seed.values()) for k in keys},
        "truncated_examples": _sum_counts(r["truncated_examples"] for r in records),
        "unpredicted_words": sum(r["unpredicted_words"] for r in records),
        "markers_cut": _sum_counts(r.get("markers_cut", {}) for r in records),
        "degenerate": sorted({r["degenerate"] for r in records if r.get("degenerate")}),
        "test_examples": records[0]["test_examples"],
    }


def _sum_counts(counts: Any) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for count in counts:
        for split, value in count.items():
            total[split] += int(value)
    return dict(total)


def build_results(recipe: EvaluateRecipe, models: Sequence[tuple[str, str]], tasks: Sequence[PlannedTask],
                  skipped: list[dict[str, str]], records: list[dict[str, Any]], complete: bool) -> dict[str, Any]:
    """The content of results.json."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        grouped[record["model"], record["task"]].append(record)
    summary: dict[str, dict[str, Any]] = {}
    for label, _ in models:
        found = {t.name: summarize_task(grouped[label, t.name], t) for t in tasks if grouped[label, t.name]}
        summary[label] = {name: value for name, value in found.items() if value is not None}
    parameters = {r["model"]: r["parameters"] for r in records}
    return {
        "format": RESULTS_FORMAT, "complete": complete, "reference": recipe.reference_label(),
        "seeds": recipe.seeds,
        "models": [{"label": label, "path": path, "parameters": parameters.get(label)} for label, path in models],
        "tasks": [{"name": t.name, "family": t.family, "metric": t.spec.metric, "headline": t.spec.headline_key,
                   "folds": [f for f in t.folds if f is not None] or None, **t.settings()} for t in tasks],
        "skipped_tasks": skipped, "summary": summary,
        "cells": [{k: v for k, v in r.items() if k != "settings"} for r in records],
    }


# ------------------------------------------------------------------------------------------ the run


def _check_output(out: Path, resume: bool) -> None:
    if resume or not (out / "cells").is_dir() or not any((out / "cells").iterdir()):
        return
    raise BiodistilError(f"{out} already holds evaluation cells; pass --resume to continue (finished cells are "
                         "skipped) or choose another --out")


def run_evaluate(recipe: EvaluateRecipe, resume: bool = False, processes: int | Literal["auto"] = 1) -> Path:
    """Run every cell of the recipe (skipping finished ones), then bench (if asked) and report; launched as several
    processes, share the cells out over them; in one process, `processes` other than 1 runs the cells side by side in
    worker processes (see the module docstring)."""
    launch = Launch.current()
    out = Path(recipe.run.output_dir)
    with launch.main_first():
        models, tasks, skipped = _prepare(recipe, out, resume, launch.is_main)
    cells = plan_cells(models, tasks, recipe.seeds)
    mine = launch.from_main(lambda: _share_cells(cells, out, recipe, launch.count))[launch.index]
    runs = [CellRun(cells[position], out, recipe, _counter(position, len(cells), launch)) for position in mine]
    plan = side_by_side_plan(processes if launch.count == 1 else 1, len(runs))
    if plan is not None:
        run_in_workers([run.run for run in runs], [run.cell.describe() for run in runs],
                       [out / "logs" / f"{run.log_name()}.log" for run in runs], plan)
    else:
        for run in runs:
            run.run()
            if launch.is_main:
                _write_results(recipe, models, tasks, skipped, cells, out)
    launch.wait()
    if not launch.is_main:
        return out / "report.md"
    _write_results(recipe, models, tasks, skipped, cells, out)
    if recipe.bench.enabled:
        _bench(models, recipe, out, resume)
    from biodistil.evaluation.report import build_report

    return build_report([out], out)


@dataclass(frozen=True)
class CellRun:
    """One cell as a worker process runs it (`run_in_workers` pickles `run`)."""

    cell: Cell
    out: Path
    recipe: EvaluateRecipe
    counter: str

    def run(self) -> None:
        _run_cell_stage(self.cell, self.out, self.recipe, self.counter)

    def log_name(self) -> str:
        fold = f"-fold-{self.cell.fold}" if self.cell.fold is not None else ""
        return f"{self.cell.label}-{self.cell.task.name}-seed-{self.cell.seed}{fold}"


def _prepare(recipe: EvaluateRecipe, out: Path, resume: bool,
             is_main: bool) -> tuple[list[tuple[str, str]], list[PlannedTask], list[dict[str, str]]]:
    """The models, the tasks with their data and the skipped ones; the main process also takes the folder (lock,
    no cells of another run unless resuming), writes the init_models and config.yaml and prints the notes."""
    job = JobFolder(out, recipe, is_main, what="evaluation folder")
    if is_main:
        _check_output(out, resume)
    if recipe.data.root is not None:
        resolve_data_root(recipe.data.root)  # a wrong --data is an error, not a reason to skip every task
    models = check_models(recipe, out)
    tasks, skipped = plan_tasks(recipe)
    for note in skipped if is_main else []:
        print(f"Skipping task {note['task']}: {note['reason']}", flush=True)
    if not tasks:
        raise BiodistilError("No task of the recipe has its data; see the notes above (pass --data DIR)")
    if is_main:
        job.record()
    return models, tasks, skipped


def _share_cells(cells: Sequence[Cell], out: Path, recipe: EvaluateRecipe, processes: int) -> list[list[int]]:
    """The positions of the unfinished cells each process runs (finished ones, with the same settings, are skipped
    and said so)."""
    pending = []
    for position, cell in enumerate(cells):
        if _finished(cell, out, cell_settings(cell, recipe)) is None:
            pending.append(position)
        else:
            print(f"[{position + 1}/{len(cells)}] {cell.describe()}: finished before, skipped", flush=True)
    costs = expected_costs([cells[p] for p in pending], recipe.data.root) if processes > 1 else [1.0] * len(pending)
    owners = assign(costs, processes)
    return [[p for p, owner in zip(pending, owners, strict=True) if owner == index] for index in range(processes)]


def expected_costs(cells: Sequence[Cell], data_root: str | Path | None) -> list[float]:
    """Each cell's expected training work, to share cells out evenly: the model's multiply-adds per token × the
    training examples it sees (after max_examples, times the epochs) × the task's max_length for that model.
    Early stopping and the examples' real lengths make the actual work differ."""
    per_token = {path: _work_per_token(path) for path in dict.fromkeys(cell.path for cell in cells)}
    examples: dict[tuple[str, int | None], int] = {}
    costs = []
    for cell in cells:
        task, key = cell.task, (cell.task.name, cell.fold)
        if key not in examples:
            examples[key] = len(read_split(task.spec, "train", data_root, cell.fold, task.max_examples))
        length = fit_length_to_model(task.spec, cell.path).max_length
        costs.append(per_token[cell.path] * examples[key] * task.epochs * length)
    return costs


def _work_per_token(model: str) -> float:
    """Multiply-adds per token of an encoder's layers (attention projections and feed-forward), from its config."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    hidden = int(getattr(config, "hidden_size", 768))
    intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    return float(getattr(config, "num_hidden_layers", 12)) * hidden * (4 * hidden + 2 * intermediate)


def _counter(position: int, total: int, launch: Launch) -> str:
    where = f", process {launch.index}" if launch.count > 1 else ""
    return f"[{position + 1}/{total}{where}]"


def _write_results(recipe: EvaluateRecipe, models: Sequence[tuple[str, str]], tasks: Sequence[PlannedTask],
                   skipped: list[dict[str, str]], cells: Sequence[Cell], out: Path) -> None:
    """results.json from every finished cell in plan order (whichever process ran it); complete when all are."""
    found = [finished(cell.folder(out), CELL_RECORD) for cell in cells]
    records = [record for record in found if isinstance(record, dict)]
    results = build_results(recipe, models, tasks, skipped, records, complete=len(records) == len(cells))
    atomic_write_json(out / RESULTS_FILE, results)


def _run_cell_stage(cell: Cell, out: Path, recipe: EvaluateRecipe, counter: str) -> None:
    """One cell as a stage of the run: fine-tuned from scratch in an emptied folder (cells do not resume: their
    checkpoints are deleted when they finish), or skipped when it is finished with the same settings."""
    settings = cell_settings(cell, recipe)

    def fine_tune(resume: bool) -> None:
        say(f"{counter} {cell.describe()}: fine-tuning")
        record = run_cell(cell, out, recipe, settings)
        flag = f" (degenerate: {record['degenerate']})" if record.get("degenerate") else ""
        say(f"{counter} {cell.describe()}: test {record['headline']} = {record['score']:.4f}{flag}")
        cut = {split: n for split, n in record["truncated_examples"].items() if n}
        if cut or record["unpredicted_words"]:
            say(f"{counter} {cell.describe()}: long examples cut {cut}, test words without prediction "
                f"{record['unpredicted_words']} (see the report's Long inputs)")

    if not run_stage(cell.folder(out), fine_tune, resumable=False, marker=CELL_RECORD,  # a damaged record: named
                     check=lambda record: _same_settings(record, cell, out, settings), quiet=True):  # by _share_cells
        say(f"{counter} {cell.describe()}: finished before, skipped")


def say(line: str) -> None:
    """A progress line in one write, newline included: the processes of a launch share the console, and unbuffered
    (PYTHONUNBUFFERED) a print writes its text and its newline apart, so lines of two processes could interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _bench(models: Sequence[tuple[str, str]], recipe: EvaluateRecipe, out: Path, resume: bool) -> None:
    from biodistil.evaluation.bench import run_bench, write_bench

    path = out / "bench.json"
    old = read_record(path) if resume else None
    labels = [m.get("label") for m in old.get("models", [])] if isinstance(old, dict) else None
    if labels == [label for label, _ in models]:
        print(f"Benchmark: {path} exists for these models, kept", flush=True)
        return
    write_bench(run_bench(models, recipe.bench), path)
