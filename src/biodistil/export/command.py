"""`biodistil export MODEL --out DIR [--int8] [--task NAME]`: the ONNX graphs of a fine-tuned model (or a
masked LM), checked before anything is written.

In a temporary folder beside DIR: export the fp32 graph (`biodistil.export.onnx`), check its outputs against
PyTorch's at several lengths (bounded by `atol`), quantise to int8 and measure its drift, and with a task
score PyTorch fp32, ONNX fp32 and ONNX int8 side by side on the task's split (the int8 drop is checked against
`max_int8_drop`). Only when every check passes does the folder replace DIR, in one rename, with the tokenizer,
config.json and export.json (inputs, outputs, labels, checks' figures, accuracy).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError
from biodistil.export.card import export_card
from biodistil.export.deployed import check_task_fits, parameter_counts
from biodistil.export.onnx import (
    OPSET,
    LoadedModel,
    check_graph,
    check_lengths,
    compare_outputs,
    export_fp32,
    load_model_folder,
    parity_batches,
    quantize_int8,
)
from biodistil.export.runtime import (
    DESCRIPTION_FILE,
    EXPORT_FORMAT,
    VARIANT_FILES,
    OnnxModel,
    is_export_folder,
    require_onnx,
)
from biodistil.io import atomic_directory, atomic_write_json, atomic_write_text
from biodistil.tasks.encoding import fit_length_to_model
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.scoring import score_model
from biodistil.tasks.splits import read_split


@dataclass(frozen=True)
class ExportOptions:
    """What `biodistil export` writes and checks."""

    int8: bool = False
    per_channel: bool = False
    atol: float = 1e-3  # bound on the largest |ONNX fp32 − PyTorch| logit difference
    task: str | None = None  # score PyTorch fp32 / ONNX fp32 / ONNX int8 on this task's split
    split: str = "test"
    fold: int | None = None
    max_examples: int | None = None
    data_root: str | None = None
    max_int8_drop: float | None = None  # fail when int8 scores more than this below PyTorch fp32 (0–1 scale)

    def validate(self) -> None:
        if self.max_int8_drop is not None and not (self.int8 and self.task):
            raise BiodistilError("--max-int8-drop needs --int8 and --task (the drop is measured on the task's split)")
        if self.atol <= 0:
            raise BiodistilError(f"--atol must be positive, got {self.atol}")


def run_export(model_dir: str | Path, out: str | Path, options: ExportOptions) -> dict[str, Any]:
    """Export, check and write DIR atomically; returns the content of its export.json."""
    require_onnx()
    options.validate()
    loaded = load_model_folder(model_dir)
    out = Path(out).expanduser()
    _check_target(out, loaded.folder)
    task_data = _task_data(loaded, options) if options.task else None
    description: dict[str, Any] = {}

    def fill(folder: Path) -> None:
        description.update(_build(loaded, folder, options, task_data))
        atomic_write_json(folder / DESCRIPTION_FILE, description)
        atomic_write_text(folder / "README.md", export_card(loaded.folder, description))

    atomic_directory(out, fill)
    return description


def _check_target(out: Path, source: Path) -> None:
    """DIR is replaced as a whole: it must be new, empty, or an earlier export (never the model's folder)."""
    if out.resolve() == source.resolve() or out.resolve() in source.resolve().parents:
        raise BiodistilError(f"--out {out} would replace the model folder {source}; choose another folder")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not is_export_folder(out))):
        raise BiodistilError(f"--out {out} exists and is not an ONNX export (no {DESCRIPTION_FILE}); it would be "
                             "replaced, so choose a new folder")


def _task_data(loaded: LoadedModel, options: ExportOptions) -> tuple[TaskSpec, list[Any]]:
    """The task (length capped at what the model allows) and the examples of its split, checked to fit."""
    task = get_task(options.task)
    check_task_fits(task, loaded.head, loaded.model.config, loaded.folder)
    examples = read_split(task, options.split, options.data_root, options.fold, options.max_examples)
    if not examples:
        raise BiodistilError(f"Task {task.name} has no {options.split} split (splits: {sorted(task.files)})")
    return fit_length_to_model(task, loaded.folder), examples


def _build(loaded: LoadedModel, folder: Path, options: ExportOptions,
           task_data: tuple[TaskSpec, list[Any]] | None) -> dict[str, Any]:
    """Everything in the (temporary) folder except export.json; returns export.json's content."""
    loaded.model.config.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    graph = export_fp32(loaded, folder / VARIANT_FILES["fp32"])
    check_graph(folder / VARIANT_FILES["fp32"])
    lengths = check_lengths(loaded.max_length)
    two_segments = getattr(loaded.model.config, "type_vocab_size", 1) > 1
    batches = parity_batches(loaded.tokenizer, loaded.input_names, lengths, two_segments)
    fp32 = OnnxModel(folder / VARIANT_FILES["fp32"])
    checks: dict[str, Any] = {"lengths": lengths, "atol": options.atol,
                              "fp32": compare_outputs(loaded.model, fp32, batches, loaded.head)}
    _check_parity(checks["fp32"], options.atol, loaded.folder)
    quantization = None
    models: dict[str, Any] = {"pytorch_fp32": loaded.model, "onnx_fp32": fp32}
    if options.int8:
        quantization = quantize_int8(folder / VARIANT_FILES["fp32"], folder / VARIANT_FILES["int8"],
                                     options.per_channel)
        models["onnx_int8"] = OnnxModel(folder / VARIANT_FILES["int8"])
        checks["int8"] = compare_outputs(loaded.model, models["onnx_int8"], batches, loaded.head)
    accuracy = _accuracy(models, loaded, task_data, options) if task_data else None
    files = {variant: VARIANT_FILES[variant] for variant in ("fp32", "int8") if f"onnx_{variant}" in models}
    return _description(loaded, graph, files, folder, checks, quantization, accuracy)


def _check_parity(found: dict[str, Any], atol: float, source: Path) -> None:
    if found["max_abs_diff"] <= atol:
        return
    worst = max(found["runs"], key=lambda r: r["max_abs_diff"])
    raise BiodistilError(
        f"{source}: ONNX fp32 logits differ from PyTorch's by up to {found['max_abs_diff']:.3g} (batch "
        f"{worst['batch']}, length {worst['length']}; bound {atol:g}); nothing written. A shape fixed at export or "
        "an unsupported operation is the usual cause; raise --atol only if the difference is numerical noise."
    )


def _accuracy(models: dict[str, Any], loaded: LoadedModel, task_data: tuple[TaskSpec, list[Any]],
              options: ExportOptions) -> dict[str, Any]:
    """PyTorch fp32, ONNX fp32 and ONNX int8 scored on the same examples with the same code; the int8 check."""
    task, examples = task_data
    scores = {name: score_model(model, loaded.tokenizer, task, examples).scores for name, model in models.items()}
    headline = task.headline_key
    result: dict[str, Any] = {"task": task.name, "split": options.split, "fold": options.fold,
                              "examples": len(examples), "metric": task.metric, "headline": headline, **scores}
    result["onnx_fp32_drop"] = scores["pytorch_fp32"][headline] - scores["onnx_fp32"][headline]
    if "onnx_int8" in scores:
        result["int8_drop"] = scores["pytorch_fp32"][headline] - scores["onnx_int8"][headline]
        result["max_int8_drop"] = options.max_int8_drop
        check_int8_drop(result, loaded.folder)
    return result


def check_int8_drop(accuracy: dict[str, Any], source: str | Path) -> None:
    """Fail (so that nothing is written) when int8 scores more than `max_int8_drop` below PyTorch fp32."""
    limit, key = accuracy["max_int8_drop"], accuracy["headline"]
    if limit is None or accuracy["int8_drop"] <= limit:
        return
    raise BiodistilError(
        f"{source}: the int8 model scores {key} {accuracy['onnx_int8'][key]:.4f} on {accuracy['task']} "
        f"{accuracy['split']}, {accuracy['int8_drop']:.4f} below PyTorch fp32 ({accuracy['pytorch_fp32'][key]:.4f}; "
        f"limit {limit:g}); nothing written. Try --per-channel, or deploy the fp32 graph (export without --int8)."
    )


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "onnxscript": onnxscript.__version__,
            "python": platform.python_version()}


def _description(loaded: LoadedModel, graph: dict[str, Any], files: dict[str, str], folder: Path,
                 checks: dict[str, Any], quantization: dict[str, Any] | None,
                 accuracy: dict[str, Any] | None) -> dict[str, Any]:
    config = loaded.model.config
    labels = None if loaded.head == "masked_lm" else [str(config.id2label[i]) for i in range(len(config.id2label))]
    return {
        "format": EXPORT_FORMAT, "source": str(loaded.folder), "head": loaded.head,
        "architecture": (config.architectures or [type(loaded.model).__name__])[0], "labels": labels,
        "max_length": loaded.max_length, "opset": OPSET, "exporter": "torch.onnx.export (dynamo)",
        "attention": getattr(config, "_attn_implementation", None), **graph, "files": files,
        "bytes": {variant: (folder / name).stat().st_size for variant, name in files.items()},
        "parameters": parameter_counts(loaded.model), "quantization": quantization, "checks": checks,
        "accuracy": accuracy, "versions": _versions(),
    }


def format_export(out: Path, description: dict[str, Any]) -> str:
    """A plain-text summary of an export, for the terminal."""
    checks = description["checks"]
    lines = [f"Wrote {out}: {', '.join(description['files'].values())} ({description['head']}, opset "
             f"{description['opset']}, inputs {[i['name'] for i in description['inputs']]})",
             f"fp32 parity at lengths {checks['lengths']}: max |ONNX − PyTorch| = {checks['fp32']['max_abs_diff']:.2e} "
             f"(bound {checks['atol']:g}), predictions equal {100 * checks['fp32']['min_agreement']:.1f}%"]
    if "int8" in checks:
        lines.append(f"int8 drift: max |int8 − PyTorch| = {checks['int8']['max_abs_diff']:.3g}, predictions equal "
                     f"(worst batch) {100 * checks['int8']['min_agreement']:.1f}%; size "
                     f"{description['bytes']['int8'] / 2**20:.1f} MB vs {description['bytes']['fp32'] / 2**20:.1f} MB")
    accuracy = description.get("accuracy")
    if accuracy:
        key = accuracy["headline"]
        found = ", ".join(f"{name} {accuracy[name][key]:.4f}" for name in ("pytorch_fp32", "onnx_fp32", "onnx_int8")
                          if name in accuracy)
        lines.append(f"{accuracy['task']} {accuracy['split']} ({accuracy['examples']} examples) {key}: {found}"
                     + (f"; int8 drop {accuracy['int8_drop']:+.4f}" if "int8_drop" in accuracy else ""))
    return "\n".join(lines)

