"""The `deploy` stage of a pipeline: the chosen fine-tuned models exported to ONNX fp32 and int8 (`biodistil export
--int8`, the int8 graph checked on the task's dev split; `int8_smooth`: after SmoothQuant's migration), then every
model and export scored on the task's test split and the PyTorch models and int8 graphs timed side by side
(`biodistil evaluate --finetuned ... --bench`): parameters, score, batch-1 latency and batch-32 throughput of PyTorch
and ONNX int8 in one process; every graph's score minus its own PyTorch model's (and each model's minus the
first's) with a paired bootstrap interval over the test examples. The fp32 graphs are scored (their parity on the
test split), not timed: they are not what ships, and timing them took a third of the stage's benchmark. Its folder:

    DIR/onnx/<name>/            each export (export.json: the parity and dev-split checks)
    DIR/scored/                 results.json, bench.json, report.md (an evaluation run folder)
    DIR/seconds.json            the wall seconds of each export and of the scoring, as each finished
    DIR/deploy.json             the four together: the stage's record in pipeline.json

A re-run keeps the exports it finds and scores again only when the scores or timings are missing; seconds.json keeps
the seconds of what earlier invocations finished (an interrupted export's or scoring's are not counted).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import Field

from biodistil.config import LocalPath, RunConfig, Section
from biodistil.evaluation.finetuned import ScoringPlan, run_scoring
from biodistil.evaluation.recipe import BenchConfig
from biodistil.export.command import ExportOptions, run_export
from biodistil.export.deployed import Deployed
from biodistil.io import atomic_write_json, read_json
from biodistil.training.run import JobFolder

SECONDS_FILE = "seconds.json"


class DeployModel(Section):
    """One model of the stage: a fine-tuned model folder, and whether to export it."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    path: LocalPath
    export: bool = Field(True, description="export to ONNX fp32 and int8 and score and time the exports too")
    time: bool = Field(True, description="time it and its int8 graph; false: scored only (e.g. an arm's further "
                                         "seeds, as fast as its first)")


class DeployRecipe(Section):
    """`deploy` (a pipeline stage): exports, test scores and speed of fine-tuned models side by side."""

    run: RunConfig = Field(default_factory=RunConfig)
    task: str = Field(min_length=1, description="built-in task name or task file")
    data_dir: LocalPath | None = Field(None, description="the data folder (default: the task's own)")
    split: str = "test"
    models: list[DeployModel] = Field(min_length=1)
    int8_smooth: float | None = Field(None, gt=0, lt=1, description="SmoothQuant's α for every int8 graph (export "
                                      "--int8-smooth; calibrated on the task's training split, since the exports' "
                                      "gate scores dev)")
    bench: BenchConfig = Field(default_factory=lambda: BenchConfig(
        enabled=True, lengths=[128], latency_batch=1, throughput_batch=32, warmup=3, repeats=20, threads=1))


def run_deploy(recipe: DeployRecipe, resume: bool = False) -> Path:
    """Export, score and time (see the module docstring); returns the stage's folder."""
    out = Path(recipe.run.output_dir)
    JobFolder(out, recipe, what="deploy folder").record()
    exports = {model.name: _export(recipe, model, out) for model in recipe.models if model.export}
    scored = out / "scored"
    if not ((scored / "results.json").is_file() and (scored / "bench.json").is_file()):
        specs = [(model.name, str(model.path)) for model in recipe.models]
        specs += [(f"{name}-onnx", str(out / "onnx" / name)) for name in exports]
        untimed = {label for model in recipe.models if not model.time for label in (model.name, f"{model.name}-onnx")}
        with _timed(out, "scoring"):
            run_scoring(specs, ScoringPlan(recipe.task, recipe.split, data_root=_root(recipe)), scored, recipe.bench,
                        timed=lambda model: _shipped(model) and _source(model.label) not in untimed)
    record = {"exports": exports, "results": read_json(scored / "results.json"),
              "bench": read_json(scored / "bench.json"), "seconds": _seconds(out)}
    atomic_write_json(out / "deploy.json", record)
    return out


def _export(recipe: DeployRecipe, model: DeployModel, out: Path) -> dict[str, Any]:
    """The model's ONNX export (kept when a finished one is there), its record."""
    folder = out / "onnx" / model.name
    if not (folder / "export.json").is_file():
        with _timed(out, f"export {model.name}"):
            run_export(model.path, folder, ExportOptions(int8=True, task=recipe.task, split="dev",
                                                         data_root=_root(recipe), int8_smooth=recipe.int8_smooth))
    return read_json(folder / "export.json")


def _seconds(out: Path) -> dict[str, float]:
    path = out / SECONDS_FILE
    return read_json(path, "deploy stage's timings") if path.is_file() else {}


@contextmanager
def _timed(out: Path, part: str) -> Iterator[None]:
    """Add the wall seconds of the block, once it finishes, to seconds.json under `part`."""
    start = time.perf_counter()
    yield
    atomic_write_json(out / SECONDS_FILE, {**_seconds(out), part: round(time.perf_counter() - start, 1)})


def _shipped(model: Deployed) -> bool:
    """What the stage times: PyTorch models and int8 graphs (an export's fp32 graph is only scored)."""
    return model.runtime == "pytorch" or model.precision == "int8"


def _source(label: str) -> str:
    """The stage's name of the model a deployed variant comes from (an int8 graph's label ends in -int8)."""
    return label.removesuffix("-int8")


def _root(recipe: DeployRecipe) -> str | None:
    return None if recipe.data_dir is None else str(recipe.data_dir)
