"""Evaluation results gathered for the report: run folders and bench files merged per model, and the numbers the
tables show (BLURB-style family averages, the share of the reference model's score).

The macro average is the mean of the family means (NER, PICO, relation extraction, document classification,
question answering; each family present weighs the same); a model's share of the reference is computed over
the tasks both have.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError
from biodistil.evaluation.recipe import FAMILIES
from biodistil.evaluation.results import read_results
from biodistil.io import read_json


@dataclass
class ModelResults:
    """One model's summaries, merged over the run folders that evaluated it."""

    label: str
    path: str
    parameters: dict[str, int] | None
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ReportData:
    """Everything the report shows, merged over run folders and bench files."""

    models: list[ModelResults]
    tasks: dict[str, dict[str, Any]]
    reference: str
    bench: dict[str, dict[str, Any]]
    bench_info: list[dict[str, Any]]
    notes: list[str]

    @property
    def families(self) -> dict[str, str]:
        return {name: task["family"] for name, task in self.tasks.items()}


# ------------------------------------------------------------------------------------------ loading


def _merge_run(data: ReportData, run: Path, results: dict[str, Any]) -> None:
    by_label = {m.label: m for m in data.models}
    for task in results["tasks"]:
        known = data.tasks.setdefault(task["name"], task)
        if known is not task and known != task:
            data.notes.append(f"Task {task['name']} was run with other settings in {run}; the settings table "
                              "shows the first run's. Compare its scores with care.")
    for entry in results["models"]:
        model = by_label.get(entry["label"])
        if model is None:
            model = ModelResults(entry["label"], entry["path"], entry.get("parameters"))
            data.models.append(model)
            by_label[model.label] = model
        for task, summary in results["summary"].get(entry["label"], {}).items():
            if task in model.tasks:
                data.notes.append(f"{model.label} / {task}: also in {run}; the first run's result is shown.")
                continue
            model.tasks[task] = summary
        model.parameters = model.parameters or entry.get("parameters")
    if not results.get("complete", True):
        data.notes.append(f"{run} is not finished (cells are missing); its table shows the cells done so far.")
    data.notes += [f"{run}: {note}" for note in results.get("notes", [])]
    for skipped in results.get("skipped_tasks", []):
        data.notes.append(f"Task {skipped['task']} skipped in {run}: {skipped['reason']}.")


def _merge_bench(data: ReportData, path: Path) -> None:
    bench = read_json(path)
    if not isinstance(bench, dict) or "models" not in bench:
        raise BiodistilError(f"{path}: not a biodistil bench result (expected the JSON that `biodistil bench` "
                             "writes)")
    data.bench_info.append({"path": str(path), **{k: bench.get(k) for k in ("device", "memory_method",
                                                                              "settings", "torch", "dtype")}})
    for row in bench["models"]:
        if row["label"] in data.bench:
            data.notes.append(f"Benchmark of {row['label']} also in {path}; the first one is shown.")
            continue
        data.bench[row["label"]] = {**row, "device": bench.get("device")}


def load_report_data(runs: list[Path], bench_files: list[Path] = (), reference: str | None = None) -> ReportData:
    """Merge evaluation run folders (and their bench.json) and extra bench files."""
    if not runs:
        raise BiodistilError("report: give at least one evaluation run folder")
    data = ReportData([], {}, "", {}, [], [])
    first_reference = None
    for run in map(Path, runs):
        results = read_results(run)
        first_reference = first_reference or results.get("reference")
        _merge_run(data, run, results)
        if (run / "bench.json").is_file():
            _merge_bench(data, run / "bench.json")
    for path in map(Path, bench_files):
        if not path.is_file():
            raise BiodistilError(f"report: bench file {path} not found (expected the JSON of `biodistil bench`)")
        _merge_bench(data, path)
    labels = [m.label for m in data.models]
    data.reference = reference or first_reference or labels[0]
    if data.reference not in labels:
        raise BiodistilError(f"report: reference model '{data.reference}' is not among the models {labels}")
    order = {family: index for index, family in enumerate(FAMILIES)}
    data.tasks = dict(sorted(data.tasks.items(), key=lambda item: order.get(item[1]["family"], len(order))))
    if len({info["device"] for info in data.bench_info}) > 1:
        data.notes.append("The benchmarks come from different devices; compare latencies only within a device.")
    return data


# ------------------------------------------------------------------------------------------ numbers


def family_average(scores: dict[str, float], families: dict[str, str]) -> tuple[float | None, dict[str, float]]:
    """BLURB-style macro average: the mean of the family means (each family present weighs the same)."""
    grouped: dict[str, list[float]] = defaultdict(list)
    for task, value in scores.items():
        grouped[families[task]].append(value)
    means = {family: statistics.fmean(grouped[family]) for family in [*FAMILIES, *sorted(grouped)]
             if family in grouped}
    return (statistics.fmean(means.values()) if means else None), means


def model_scores(model: ModelResults, statistic: str = "mean") -> dict[str, float]:
    """Task → headline score (the mean or the median over seeds)."""
    return {task: summary[statistic] for task, summary in model.tasks.items()}


def share_of_reference(model: ModelResults, reference: ModelResults, families: dict[str, str],
                       statistic: str = "mean") -> float | None:
    """The model's macro average over the tasks it shares with the reference, divided by the reference's."""
    mine, theirs = model_scores(model, statistic), model_scores(reference, statistic)
    common = sorted(set(mine) & set(theirs))
    if not common:
        return None
    own, _ = family_average({t: mine[t] for t in common}, families)
    ref, _ = family_average({t: theirs[t] for t in common}, families)
    return own / ref if ref else None


def model_parameters(data: ReportData, model: ModelResults) -> int | None:
    """The model's parameter count: from its benchmark when there is one, else from its results."""
    if model.label in data.bench:
        return data.bench[model.label]["parameters"]
    return (model.parameters or {}).get("total")
