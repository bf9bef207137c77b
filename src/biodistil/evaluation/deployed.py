"""Accuracy of what is deployed: fine-tuned PyTorch folders and their ONNX exports (fp32, int8) scored on a
task's split without training, with the prediction and metric code of fine-tuning.

`biodistil evaluate --finetuned MODEL... --task NAME --out DIR` writes an evaluation run folder that
`biodistil report` reads like any other (one score per model: scoring is deterministic, there are no seeds):

    DIR/cells/<model>/<task>/scored/predictions.jsonl, metrics.json
    DIR/results.json, DIR/bench.json (with --bench), DIR/report.md, report.html, *.png

A MODEL is a fine-tuned Hugging Face folder (PyTorch fp32), an ONNX export folder (its fp32 graph under the
folder's name, its int8 graph under the name + `-int8`), or one `.onnx` file of an export; `NAME=PATH` names it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError
from biodistil.evaluation.recipe import METRIC_FAMILY, BenchConfig, label_from_path, unique_labels
from biodistil.evaluation.results import RESULTS_FILE, RESULTS_FORMAT
from biodistil.export.runtime import OnnxModel, is_export_folder, read_description, variant_of
from biodistil.io import atomic_write_json, atomic_write_text, lock_folder
from biodistil.tasks.encoding import fit_length_to_model
from biodistil.tasks.metrics import summarize_seeds
from biodistil.tasks.prediction import degenerate, prediction_rows
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.scoring import Scored, score_model
from biodistil.tasks.splits import read_split


@dataclass(frozen=True)
class Deployed:
    """One model as deployed: PyTorch fp32 (a model folder) or an ONNX graph (a .onnx file of an export)."""

    label: str
    path: Path
    runtime: str  # "pytorch" | "onnxruntime"
    precision: str  # "fp32" | "int8"

    @property
    def folder(self) -> Path:
        """The folder with config.json and the tokenizer."""
        return self.path if self.runtime == "pytorch" else self.path.parent

    def describe(self) -> str:
        return f"{self.label} ({'PyTorch' if self.runtime == 'pytorch' else 'ONNX Runtime'} {self.precision})"


def expand_models(specs: Sequence[tuple[str | None, str]]) -> list[Deployed]:
    """(name or None, path) → the deployed variants, named uniquely (see the module docstring)."""
    named: list[tuple[str | None, str]] = []
    for name, path in specs:
        local = Path(path).expanduser()
        if local.suffix == ".onnx":  # one graph: named after its export folder
            int8 = variant_of(local) == "int8"
            name = name or label_from_path(str(local.parent)) + ("-int8" if int8 else "")
        named.append((name, str(local)))
    try:
        labels = unique_labels(named)
    except ValueError as err:
        raise BiodistilError(f"{err} (use NAME=PATH)") from None
    deployed: list[Deployed] = []
    for label, (_, path) in zip(labels, named, strict=True):
        deployed += _variants(label, Path(path))
    clashes = sorted({d.label for d in deployed if [e.label for e in deployed].count(d.label) > 1})
    if clashes:
        raise BiodistilError(f"Models share the name(s) {clashes} after adding '-int8'; name them with NAME=PATH")
    return deployed


def _variants(label: str, path: Path) -> list[Deployed]:
    if path.suffix == ".onnx":
        if not path.is_file():
            raise BiodistilError(f"ONNX model {path} not found")
        return [Deployed(label, path, "onnxruntime", variant_of(path))]
    if is_export_folder(path):
        files = read_description(path)["files"]
        return [Deployed(label if variant == "fp32" else f"{label}-{variant}", path / name, "onnxruntime", variant)
                for variant, name in files.items()]
    if path.is_dir() and not (path / "config.json").is_file():
        raise BiodistilError(f"{path} is neither a model folder (config.json) nor an ONNX export (export.json)")
    return [Deployed(label, path, "pytorch", "fp32")]  # a model folder, or a Hub id (which bench can load)


def load_deployed(item: Deployed, threads: int | None = None) -> tuple[Any, Any, str]:
    """(model, tokenizer, head) of a deployed variant; the model answers `model(**batch).logits`."""
    from biodistil.export.onnx import head_of, load_model_folder
    from biodistil.models.loading import load_tokenizer

    if item.runtime == "pytorch":
        loaded = load_model_folder(item.path)
        return loaded.model, loaded.tokenizer, loaded.head
    model = OnnxModel(item.path, threads=threads)
    return model, load_tokenizer(str(item.folder)), head_of(model.config, item.folder)


# ------------------------------------------------------------------------------------------ scoring


def check_task_fits(task: TaskSpec, head: str, config: Any, where: str | Path) -> None:
    """The model's head and labels must be the task's, else its scores would mean nothing."""
    if head == "masked_lm":
        raise BiodistilError(f"{where}: a masked LM has no task head; score a model fine-tuned on {task.name} "
                             "(`biodistil finetune`), or its ONNX export")
    if head != task.kind:
        raise BiodistilError(f"{where}: a {head} model cannot be scored on {task.name}, a {task.kind} task")
    labels = [str(config.id2label[i]) for i in range(len(config.id2label))]
    if labels != task.labels:
        raise BiodistilError(f"{where}: the model's labels {labels} are not task {task.name}'s {task.labels}; was "
                             "it fine-tuned on this task?")


def parameter_counts(model: Any) -> dict[str, int]:
    """Encoder parameters (total, without embeddings), as `biodistil bench` and `evaluate` count them."""
    if isinstance(model, OnnxModel):
        return model.parameters_count
    from biodistil.models.size import count_parameters

    return count_parameters(getattr(model, "base_model", model))


def score_deployed(item: Deployed, task: TaskSpec, examples: Sequence[Any],
                   threads: int | None = None) -> tuple[Scored, dict[str, int]]:
    """Load one deployed variant, check that it fits the task, score it; also its parameter counts."""
    model, tokenizer, head = load_deployed(item, threads)
    check_task_fits(task, head, model.config, item.path)
    scored = score_model(model, tokenizer, fit_length_to_model(task, item.folder), examples)
    return scored, parameter_counts(model)


# ------------------------------------------------------------------------------------------ the run


@dataclass(frozen=True)
class ScoringPlan:
    """What `evaluate --finetuned` scores: which task and split, where the data is, how many examples."""

    task: str
    split: str = "test"
    fold: int | None = None
    max_examples: int | None = None
    data_root: str | None = None


def _record(item: Deployed, task: TaskSpec, plan: ScoringPlan, scored: Scored, examples: int,
            parameters: dict[str, int]) -> dict[str, Any]:
    return {"model": item.label, "path": str(item.path), "runtime": item.runtime, "precision": item.precision,
            "parameters": parameters, "task": task.name, "split": plan.split, "fold": plan.fold, "metric": task.metric,
            "headline": task.headline_key, "score": scored.scores[task.headline_key], "test": scored.scores,
            "truncated_examples": {plan.split: scored.truncated_examples},
            "unpredicted_words": scored.predictions.filled_words, "test_examples": examples,
            "degenerate": degenerate(task, scored.predictions)}


def _summary(record: dict[str, Any], family: str) -> dict[str, Any]:
    return {"family": family, "metric": record["metric"], "headline": record["headline"],
            **summarize_seeds([record["score"]]), "seeds": {}, "metrics_mean": record["test"],
            "truncated_examples": record["truncated_examples"], "unpredicted_words": record["unpredicted_words"],
            "degenerate": [record["degenerate"]] if record.get("degenerate") else [],
            "test_examples": record["test_examples"]}


def scored_results(items: Sequence[Deployed], task: TaskSpec, plan: ScoringPlan,
                   records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """results.json of a scoring run, in the format of `biodistil evaluate` (read by `biodistil report`)."""
    family = METRIC_FAMILY[task.metric]
    untrained = dict.fromkeys(("learning_rate", "batch_size", "epochs", "early_stopping_patience", "n_folds"))
    return {
        "format": RESULTS_FORMAT, "complete": True, "reference": items[0].label, "seeds": [],
        "models": [{"label": i.label, "path": str(i.path), "runtime": i.runtime, "precision": i.precision,
                    "parameters": r["parameters"]} for i, r in zip(items, records, strict=True)],
        "tasks": [{"name": task.name, "family": family, "metric": task.metric, "headline": task.headline_key,
                   "folds": None, **untrained, "label_policy": task.label_policy, "truncation": task.truncation,
                   "max_length": task.max_length, "max_examples": plan.max_examples}],
        "skipped_tasks": [], "summary": {r["model"]: {task.name: _summary(r, family)} for r in records},
        "cells": list(records),
        "notes": [f"Scored without training on the {plan.split} split"
                  f"{f' (fold {plan.fold})' if plan.fold else ''}: already fine-tuned models and their ONNX exports "
                  "(one deterministic score each, no seeds)."],
    }


def run_scoring(specs: Sequence[tuple[str | None, str]], plan: ScoringPlan, out: Path,
                bench: BenchConfig | None = None) -> Path:
    """Score every deployed variant of `specs` on the plan's split; write the run folder and its report."""
    lock_folder(out, "evaluation folder")
    if (out / "config.yaml").is_file():
        raise BiodistilError(f"{out} holds a `biodistil evaluate` recipe run; score into another --out folder")
    task = get_task(plan.task)
    items = expand_models(specs)
    examples = read_split(task, plan.split, plan.data_root, plan.fold, plan.max_examples)
    if not examples:
        raise BiodistilError(f"Task {task.name} has no {plan.split} split (splits: {sorted(task.files)})")
    records = []
    for item in items:
        scored, parameters = score_deployed(item, task, examples, bench.threads if bench else None)
        cell = out / "cells" / item.label / task.name / "scored"
        rows = prediction_rows(task, examples, scored.predictions)
        atomic_write_text(cell / "predictions.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        records.append(_record(item, task, plan, scored, len(examples), parameters))
        atomic_write_json(cell / "metrics.json", records[-1])
        flag = f" (degenerate: {records[-1]['degenerate']})" if records[-1]["degenerate"] else ""
        print(f"{item.describe()}: {task.name} {plan.split} {task.headline_key} = {records[-1]['score']:.4f}{flag}",
              flush=True)
    atomic_write_json(out / RESULTS_FILE, scored_results(items, task, plan, records))
    if bench is not None:
        from biodistil.evaluation.bench import run_bench, write_bench

        write_bench(run_bench([(i.label, str(i.path)) for i in items], bench), out / "bench.json")
    from biodistil.evaluation.report import build_report

    return build_report([out], out)
