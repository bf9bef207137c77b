"""`biodistil evaluate --finetuned MODEL... --task NAME --out DIR`: fine-tuned models and their ONNX exports
(`biodistil.export.deployed`) scored on a task's split without training, written as an evaluation run folder that
`biodistil report` reads like any other (one score per model: scoring is deterministic, there are no seeds):

    DIR/cells/<model>/<task>/scored/predictions.jsonl, metrics.json
    DIR/results.json, DIR/bench.json (with --bench), DIR/report.md, report.html, *.png

Each model after the first is compared with the first (the reference: a PyTorch model before its ONNX graphs, as
`expand_models` lists them) on the same examples: its headline score minus the reference's with a 95% interval of a
paired bootstrap over the examples (`tasks.bootstrap`), in results.json's `differences` and the report's notes. An
ONNX graph whose source model (its export.json's `source`) is scored too, and is not the first, is also compared with
that model: the int8 − PyTorch difference of every exported model, not only of the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError
from biodistil.evaluation.recipe import METRIC_FAMILY, BenchConfig
from biodistil.evaluation.results import RESULTS_FILE, RESULTS_FORMAT
from biodistil.export.deployed import Deployed, expand_models, score_deployed, task_data_root
from biodistil.export.runtime import is_export_folder, read_description
from biodistil.finetune.selection import print_span_record
from biodistil.io import atomic_write_json, atomic_write_jsonl
from biodistil.tasks.bootstrap import ScoredRun, difference_interval, scored_run
from biodistil.tasks.metrics import summarize_seeds
from biodistil.tasks.prediction import degenerate, prediction_rows, scored_rows
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.scoring import Scored, positive_index, span_task_record
from biodistil.tasks.splits import read_split
from biodistil.training.run import JobFolder


@dataclass(frozen=True)
class ScoringPlan:
    """What `evaluate --finetuned` scores: which task and split, where the data is, how many examples."""

    task: str
    split: str = "test"
    fold: int | None = None
    max_examples: int | None = None
    data_root: str | None = None
    device: str = "auto"  # PyTorch models: auto = a CUDA GPU when one is visible; ONNX graphs run on the CPU


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


def scored_results(items: Sequence[Deployed], task: TaskSpec, plan: ScoringPlan, records: Sequence[dict[str, Any]],
                   differences: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
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
                  "(one deterministic score each, no seeds).", *map(_difference_line, differences)],
        "differences": list(differences),
    }


def _differences(items: Sequence[Deployed], runs: Sequence[ScoredRun], task: TaskSpec) -> list[dict[str, Any]]:
    """Each model after the first minus the first, then each ONNX graph minus its source model where that is scored
    and is not the first, on the same examples, with their paired bootstrap intervals."""
    pytorch = {item.path.resolve(): index for index, item in enumerate(items) if item.runtime == "pytorch"}
    pairs = [(index, 0) for index in range(1, len(items))]
    sources = [pytorch.get(source) if source else None for source in map(_export_source, items)]
    pairs += [(index, source) for index, source in enumerate(sources) if source not in (None, 0)]  # 0: paired above
    return [{"model": items[index].label, "reference": items[reference].label, "task": task.name,
             "metric": task.headline_key, "examples": len(runs[index].ids),
             **difference_interval([runs[index]], [runs[reference]]).as_record()} for index, reference in pairs]


def _export_source(item: Deployed) -> Path | None:
    """The model folder an ONNX graph was exported from (its export.json's `source`), or None."""
    if item.runtime != "onnxruntime" or not is_export_folder(item.folder):
        return None
    source = read_description(item.folder).get("source")
    return Path(source).expanduser().resolve() if source else None


def _difference_line(difference: dict[str, Any]) -> str:
    return (f"{difference['model']} − {difference['reference']} on {difference['task']}: "
            f"{100 * difference['estimate']:+.2f} {difference['metric']} ×100 (95% interval "
            f"{100 * difference['low']:+.2f} to {100 * difference['high']:+.2f}; paired bootstrap over the "
            f"{difference['examples']} examples, {difference['resamples']} resamples).")


def run_scoring(specs: Sequence[tuple[str | None, str]], plan: ScoringPlan, out: Path,
                bench: BenchConfig | None = None, timed: Callable[[Deployed], bool] | None = None) -> Path:
    """Score every deployed variant of `specs` on the plan's split; write the run folder and its report. With
    `bench`, time them side by side too (those `timed` accepts, when given)."""
    JobFolder(out, None, setting="--out", what="evaluation folder")
    if (out / "config.yaml").is_file():
        raise BiodistilError(f"{out} holds a `biodistil evaluate` recipe run; score into another --out folder")
    task = get_task(plan.task)
    items = expand_models(specs)
    root = task_data_root(plan.data_root, [item.path for item in items])
    examples = read_split(task, plan.split, root, plan.fold, plan.max_examples)
    if not examples:
        raise BiodistilError(f"Task {task.name} has no {plan.split} split (splits: {sorted(task.files)})")
    threads = bench.threads if bench else None
    cells = [_score_cell(item, task, plan, examples, out, threads, root) for item in items]
    records, runs = [record for record, _ in cells], [run for _, run in cells]
    atomic_write_json(out / RESULTS_FILE, scored_results(items, task, plan, records, _differences(items, runs, task)))
    if bench is not None:
        from biodistil.evaluation.bench import run_bench, write_bench

        chosen = [item for item in items if timed is None or timed(item)]
        write_bench(run_bench([(i.label, str(i.path)) for i in chosen], bench), out / "bench.json")
    from biodistil.evaluation.report import build_report

    return build_report([out], out)


def _score_cell(item: Deployed, task: TaskSpec, plan: ScoringPlan, examples: Sequence[Any], out: Path,
                threads: int | None, data_root: Any = None) -> tuple[dict[str, Any], ScoredRun]:
    """Score one deployed variant; write its cell (predictions.jsonl, metrics.json) and print its score. A span
    task's cell also records its gold entities' counts and the character-level scores on the original documents.
    Returns its record and its predictions as a bootstrap reads them."""
    scored, parameters = score_deployed(item, task, examples, threads, plan.device)
    cell = out / "cells" / item.label / task.name / "scored"
    rows = prediction_rows(task, examples, scored.predictions)
    atomic_write_jsonl(cell / "predictions.jsonl", rows)
    record = _record(item, task, plan, scored, len(examples), parameters)
    if task.is_span_task:
        spans = span_task_record(task, examples, scored.predictions.labels, plan.split, data_root, plan.fold)
        print_span_record(spans)
        record["test"] = {**record["test"], **spans.get("character_f1", {})}
        record.update(spans)
    atomic_write_json(cell / "metrics.json", record)
    flag = f" (degenerate: {record['degenerate']})" if record["degenerate"] else ""
    print(f"{item.describe()}: {task.name} {plan.split} {task.headline_key} = {record['score']:.4f}{flag}",
          flush=True)
    positive_at = positive_index(task) if task.kind != "token_classification" else None
    return record, scored_run(scored_rows(examples, scored.predictions), task.metric, task.headline_key, positive_at,
                              str(cell), **task.metric_options)
