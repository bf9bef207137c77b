"""What is deployed: a fine-tuned PyTorch folder and the ONNX graphs of its export (fp32, int8), named, loaded,
checked against a task and scored on a split without training, with the prediction and metric code of fine-tuning.

A MODEL is a fine-tuned Hugging Face folder (PyTorch fp32), an ONNX export folder (its fp32 graph under the
folder's name, its int8 graph under the name + `-int8`), or one `.onnx` file of an export; `NAME=PATH` names it.
`biodistil evaluate --finetuned` (`biodistil.evaluation.finetuned`), `biodistil bench` and `biodistil export` use
this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from biodistil.errors import BiodistilError
from biodistil.export.runtime import OnnxModel, is_export_folder, read_description, variant_of
from biodistil.io import load_yaml, read_text
from biodistil.paths import label_from_path, unique_labels
from biodistil.tasks.encoding import fit_length_to_model
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import Scored, score_model


@dataclass(frozen=True)
class Deployed:
    """One model as deployed: PyTorch (a model folder; fp32, or bf16 autocast when `predict` is asked for it) or an
    ONNX graph (a .onnx file of an export)."""

    label: str
    path: Path
    runtime: str  # "pytorch" | "onnxruntime"
    precision: str  # "fp32" | "int8" | "bf16"

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
    graphs = sorted(p.name for p in path.glob("*.onnx")) if path.is_dir() else []
    if graphs:
        raise BiodistilError(f"{path} holds ONNX graphs ({', '.join(graphs)}) but no export.json, which `biodistil "
                             "export` writes with them: an incomplete or damaged export folder. Export the model "
                             f"again (biodistil export MODEL --out {path}), or give one of its .onnx files")
    if path.is_dir() and not (path / "config.json").is_file():
        raise BiodistilError(f"{path} is neither a model folder (config.json) nor an ONNX export (export.json)")
    return [Deployed(label, path, "pytorch", "fp32")]  # a model folder, or a Hub id (which bench can load)


def task_data_root(given: str | None, models: Sequence[str | Path]) -> str | None:
    """The data folder to score a task in: `--data` when given, else the `task.data_dir` that the run which made the
    first model recorded (the run folder's config.yaml beside its model/; for an ONNX export, its source model's), else
    the default (None: $BIODISTIL_DATA, else ../shared/data). Says which, and why."""
    if given is not None:
        print(f"Data folder: {given} (--data)", flush=True)
        return given
    for model in models:
        recorded = (recorded_task(Path(model)) or {}).get("data_dir")
        if recorded:
            config = _run_config_of(Path(model))
            print(f"Data folder: {recorded} (task.data_dir of {config.resolve() if config else model})", flush=True)
            return str(recorded)
    print("Data folder: the default ($BIODISTIL_DATA, else ../shared/data; --data chooses another)", flush=True)
    return None


def recorded_task(model: Path) -> dict[str, Any] | None:
    """The `task:` section the run that made `model` recorded (its config.yaml beside model/; for an ONNX export, its
    source model's run), or None without a readable record."""
    config = _run_config_of(model)
    if config is None:
        return None
    try:
        task = (load_yaml(read_text(config, "run's recipe record")) or {}).get("task")
    except (BiodistilError, yaml.YAMLError, AttributeError):
        return None
    return task if isinstance(task, dict) else None


def _run_config_of(model: Path) -> Path | None:
    """The config.yaml of the run that made `model` (a run's model/ folder, or an ONNX export of one)."""
    if is_export_folder(model):
        source = read_description(model).get("source")
        model = Path(source) if source else model
    config = model.parent / "config.yaml"
    return config if model.name == "model" and config.is_file() else None


def load_deployed(item: Deployed, threads: int | None = None, device: str = "cpu") -> tuple[Any, Any, str]:
    """(model, tokenizer, head) of a deployed variant; the model answers `model(**batch).logits`. A PyTorch model
    goes to `device` (as `train.device` names one, given on the command line as --device); ONNX graphs run on the
    CPU."""
    from biodistil.export.onnx import head_of, load_model_folder
    from biodistil.models.loading import load_tokenizer
    from biodistil.training.machine import training_device

    if item.runtime == "pytorch":
        loaded = load_model_folder(item.path)
        return loaded.model.to(training_device(device, "--device")), loaded.tokenizer, loaded.head
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


def score_deployed(item: Deployed, task: TaskSpec, examples: Sequence[Any], threads: int | None = None,
                   device: str = "cpu") -> tuple[Scored, dict[str, int]]:
    """Load one deployed variant, check that it fits the task, score it (a PyTorch model on `device`, as
    `train.device` names one; ONNX graphs on the CPU); also its parameter counts."""
    model, tokenizer, head = load_deployed(item, threads, device)
    check_task_fits(task, head, model.config, item.path)
    scored = score_model(model, tokenizer, fit_length_to_model(task, item.folder), examples)
    return scored, parameter_counts(model)
