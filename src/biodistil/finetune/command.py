"""`biodistil finetune`: an encoder fine-tuned on a task (`finetune_on_task`), its untrained score (S_init), the
model exported in Hugging Face format with its card, metrics, test predictions and a report.

Under `accelerate launch` / `torchrun` the processes train together (DDP, `train.batch_size` per process); the main
process alone scores, exports and writes the run folder."""

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import Field

from biodistil.config import ExportConfig, ModelConfig, RunConfig, Section, TrainConfig
from biodistil.errors import BiodistilError
from biodistil.finetune.init_model import init_model_path
from biodistil.finetune.on_task import FinetuneOutcome, finetune_on_task
from biodistil.finetune.selection import SPAN_RECORD, write_dev_predictions, write_test_results
from biodistil.io import jsonable
from biodistil.paths import recorded
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.encoding import fit_length_to_model
from biodistil.tasks.metrics import format_metric
from biodistil.tasks.recipe import TaskConfig, load_task_split, task_spec
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score_model


class FinetuneOptions(Section):
    """How long to fine-tune and whether to score the untrained model (S_init of the gap closed)."""

    epochs: float | None = Field(None, gt=0, description="set train.max_steps from the training-set size")
    patience: int | None = Field(None, ge=1, description="dev evaluations without gain before stopping")
    score_init: bool = Field(True, description="also score the model before training on the test set")


class FinetuneRecipe(Section):
    """`biodistil finetune`: fine-tune an encoder on a task; save a Hugging Face model, metrics, predictions."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig
    task: TaskConfig
    finetune: FinetuneOptions = Field(default_factory=FinetuneOptions)
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)


def run_finetune(recipe: FinetuneRecipe, resume: bool = False, stop_after: int | None = None) -> Path:
    """Fine-tune the recipe's encoder on its task: model selection on dev, scores and predictions on test,
    the untrained model's test scores (S_init), and the model exported in Hugging Face format."""
    from biodistil.models.saving import export_model
    from biodistil.training.run import Report, open_run

    if stop_after is not None:
        raise BiodistilError("finetune: --stop-after is not supported (interrupt it and continue with --resume)")
    started = time.perf_counter()
    run, accelerator = open_run(recipe, resume, [(recipe.model.name_or_path, "model.name_or_path", False)])
    with accelerator.main_process_first():
        path = init_model_path(recipe.model.name_or_path, recipe.model.layers, run.path, recipe.model.reinitialise,
                               recipe.run.seed)
    task = fit_length_to_model(task_spec(recipe.task), path)
    init = _init_scores(recipe, task, path) if accelerator.is_main_process else {}
    outcome = finetune_on_task(path, task, recipe.task.data_dir, recipe.train, run.path, recipe.run.seed,
                               recipe.task.fold, recipe.finetune.epochs, recipe.finetune.patience,
                               recipe.task.max_examples, resume=run.resume,
                               train_examples=recipe.task.train_examples, accelerator=accelerator)
    if not accelerator.is_main_process:  # the main process writes the run folder
        return run.model_dir
    seconds = round(time.perf_counter() - started + outcome.train.earlier_seconds, 1)  # as kd's (run_kd)
    written = write_test_results(run.path, task, outcome.test_examples, outcome.test_predictions, outcome.truncated,
                                 outcome.markers_cut, recipe.task.data_dir, recipe.task.fold)
    write_dev_predictions(run.path, outcome.dev_examples, outcome.dev_predictions)
    metrics = _metrics(task, outcome, init, written["degenerate"], seconds)
    metrics["test"].update(written.get("character_f1", {}))  # a span task: beside the token-level entity F1
    metrics.update({key: written[key] for key in SPAN_RECORD if key in written})
    save_model = None
    if recipe.export.enabled:
        save_model = lambda folder: export_model(outcome.model, outcome.tokenizer, folder)  # noqa: E731
        metrics["model_dir"] = recorded(run.model_dir, run.path)
    metrics["notes"] = written["notes"]
    report = Report(f"Fine-tuning on {task.name}", _report_rows(metrics, outcome, run.model_dir),
                    [f"**Warning:** {note}" for note in written["notes"]], outcome.train)
    run.finish(metrics, report, metrics=metrics, save_model=save_model)
    return run.model_dir


def _init_scores(recipe: FinetuneRecipe, task: TaskSpec, path: str) -> dict[str, float]:
    """S_init: the model with a fresh head (seeded) scored on the test set before training (when asked)."""
    from accelerate.utils import set_seed

    from biodistil.models.loading import load_tokenizer

    if not recipe.finetune.score_init:
        return {}
    set_seed(recipe.run.seed)
    test = load_task_split(task, recipe.task, "test")
    return score_model(build_classifier(path, task), load_tokenizer(path), task, test).scores if test else {}


def _metrics(task: TaskSpec, outcome: FinetuneOutcome, init: dict[str, float], degenerate: str,
             seconds: float) -> dict[str, Any]:
    """metrics.json of a finetune run (without the exported model's folder and the notes)."""
    return jsonable({"task": task.name, "metric": task.headline_key, "test": outcome.test_scores,
                     "dev": outcome.dev_scores, "init": init, "train": asdict(outcome.train),
                     "truncated_examples": outcome.truncated, "markers_cut": outcome.markers_cut,
                     "unpredicted_words": outcome.test_predictions.filled_words, "degenerate": degenerate,
                     "wall_seconds": seconds})


def _report_rows(metrics: dict[str, Any], outcome: FinetuneOutcome, model_dir: Path) -> dict[str, object]:
    rows: dict[str, object] = {"task / metric": f"{metrics['task']} / {metrics['metric']}",
                               "steps": outcome.train.steps}
    for name in ("dev", "test", "init"):
        if metrics[name]:
            rows[name] = ", ".join(f"{k} {format_metric(k, v)}" for k, v in metrics[name].items())
    if metrics["degenerate"]:
        rows["test"] = f"{rows.get('test', '')} (degenerate: {metrics['degenerate']})"
    rows["model"] = f"`{model_dir}`" if "model_dir" in metrics else "not exported"
    return rows
