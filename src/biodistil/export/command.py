"""`biodistil export MODEL --out DIR [--int8] [--task NAME]`: the ONNX graphs of a fine-tuned model (or a
masked LM), checked before anything is written.

In a temporary folder beside DIR: export the fp32 graph (fused by ONNX Runtime's transformer optimizer for BERT-family
models, `biodistil.export.fusion`; unfused with a note otherwise), check its outputs against PyTorch's at several
lengths (bounded by `atol`), quantise it to int8 per tensor and per channel and measure each one's drift, and with a
task score PyTorch fp32, ONNX fp32 and both int8 graphs side by side on the task's split (with `int8_smooth`, after
SmoothQuant's migration, `biodistil.export.smoothing`, calibrated on another split). The accuracy gate picks the
int8 graph that ships: the one with the smaller drop among those within `max_int8_drop` (without a task, the smaller
logit drift); when neither passes, only the fp32 graph is written, and the record says why. Only when every check
passes does the folder replace DIR, in one rename, with the tokenizer, config.json, export.json (inputs, outputs,
labels, fusion, quantisation choice, checks' figures, accuracy) and README.md (the export's model card).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError
from biodistil.export.card import export_card
from biodistil.export.deployed import check_task_fits, parameter_counts, task_data_root
from biodistil.export.fusion import FUSED_OPSET, export_fused, format_fusion, fusion_note, unfused
from biodistil.export.onnx import (
    FAST_INT8_SCHEMES,
    INT8_SCHEMES,
    OPSET,
    LoadedModel,
    check_graph,
    check_lengths,
    compare_outputs,
    describe_graph,
    export_fp32,
    load_model_folder,
    parity_batches,
    quantize_int8,
    scheme_description,
)
from biodistil.export.runtime import (
    DESCRIPTION_FILE,
    EXPORT_FORMAT,
    VARIANT_FILES,
    OnnxModel,
    is_export_folder,
    require_onnx,
)
from biodistil.export.smoothing import smooth_graph
from biodistil.io import atomic_directory, atomic_write_json, atomic_write_text
from biodistil.tasks.encoding import fit_length_to_model
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.scoring import score_model
from biodistil.tasks.splits import read_split
from biodistil.training.provenance import code_identity, model_identity

CALIBRATION_EXAMPLES = 512  # --int8-smooth: sentences (or documents) whose activation maxima set the migration


@dataclass(frozen=True)
class ExportOptions:
    """What `biodistil export` writes and checks."""

    int8: bool = False
    int8_scheme: str = "auto"  # auto (per-tensor and per-channel, the gate picks) | one of INT8_SCHEMES
    fuse: bool = True  # BERT-family graphs fused by ONNX Runtime's transformer optimizer
    atol: float = 1e-3  # bound on the largest |ONNX fp32 − PyTorch| logit difference
    task: str | None = None  # score PyTorch fp32 / ONNX fp32 / ONNX int8 on this task's split
    split: str = "test"
    fold: int | None = None
    max_examples: int | None = None
    data_root: str | None = None
    max_int8_drop: float | None = None  # ship no int8 graph scoring more than this below PyTorch fp32 (0–1 scale)
    int8_smooth: float | None = None  # SmoothQuant's α: migrate before quantising, calibrated on the task's dev split

    @property
    def schemes(self) -> list[str]:
        """The int8 schemes to make; after SmoothQuant's migration `auto` makes per-channel alone (per-tensor weights
        cannot hold the migrated rows: validate)."""
        if self.int8_scheme != "auto":
            return [self.int8_scheme]
        return ["per-channel"] if self.int8_smooth is not None else list(FAST_INT8_SCHEMES)

    def validate(self) -> None:
        if self.max_int8_drop is not None and not (self.int8 and self.task):
            raise BiodistilError("--max-int8-drop needs --int8 and --task (the drop is measured on the task's split)")
        if self.atol <= 0:
            raise BiodistilError(f"--atol must be positive, got {self.atol}")
        if self.int8_smooth is not None and not (self.int8 and self.task):
            raise BiodistilError("--int8-smooth needs --int8 and --task (it is calibrated on the task's dev split)")
        if self.int8_smooth is not None and not 0 < self.int8_smooth < 1:
            raise BiodistilError(f"--int8-smooth (SmoothQuant's α) must lie strictly between 0 and 1; got "
                                 f"{self.int8_smooth}")
        if self.int8_smooth is not None and self.int8_scheme == "per-tensor":
            raise BiodistilError("--int8-smooth needs int8 weights with a scale per column (--int8-scheme per-channel, "
                                 "blockwise or auto): one scale per weight tensor cannot hold the rows the migration "
                                 "scales up (Study 6's MPNet teacher: dev F1 0.774 -> 0.000)")
        if self.int8_scheme != "auto" and self.int8_scheme not in INT8_SCHEMES:
            raise BiodistilError(f"--int8-scheme must be auto, {', '.join(INT8_SCHEMES)}; got {self.int8_scheme}")


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
    data_root = task_data_root(options.data_root, [loaded.folder])
    examples = read_split(task, options.split, data_root, options.fold, options.max_examples)
    if not examples:
        raise BiodistilError(f"Task {task.name} has no {options.split} split (splits: {sorted(task.files)})")
    return fit_length_to_model(task, loaded.folder), examples


def _build(loaded: LoadedModel, folder: Path, options: ExportOptions,
           task_data: tuple[TaskSpec, list[Any]] | None) -> dict[str, Any]:
    """Everything in the (temporary) folder except export.json and README.md; returns export.json's content."""
    loaded.model.config.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    fp32_path = folder / VARIANT_FILES["fp32"]
    fusion = export_graph(loaded, fp32_path, options.fuse)
    check_graph(fp32_path)
    lengths = check_lengths(loaded.max_length)
    two_segments = getattr(loaded.model.config, "type_vocab_size", 1) > 1
    batches = parity_batches(loaded.tokenizer, loaded.input_names, lengths, two_segments)
    fp32 = OnnxModel(fp32_path)
    checks: dict[str, Any] = {"lengths": lengths, "atol": options.atol,
                              "fp32": compare_outputs(loaded.model, fp32, batches, loaded.head)}
    _check_parity(checks["fp32"], options.atol, loaded.folder)
    scores = _scores({"pytorch_fp32": loaded.model, "onnx_fp32": fp32}, loaded, task_data)
    quantization = int8_scores = None
    if options.int8:
        quantization, checks["int8"], int8_scores = _int8(loaded, folder, options, batches, fusion["applied"],
                                                          task_data, scores)
    accuracy = _accuracy(scores, int8_scores, quantization, task_data, options) if task_data else None
    files = {variant: name for variant, name in VARIANT_FILES.items() if (folder / name).is_file()}
    return _description(loaded, describe_graph(fp32_path), fusion, files, folder, checks, quantization, accuracy)


def export_graph(loaded: LoadedModel, path: Path, fuse: bool) -> dict[str, Any]:
    """The fp32 graph at `path`, fused where ONNX Runtime's optimizer supports the family; its fusion record."""
    note = fusion_note(loaded.model.config.model_type) if fuse else "unfused: exported with --no-fuse"
    if note is None:
        return export_fused(loaded, path)
    export_fp32(loaded, path)
    return unfused(note)


def _check_parity(found: dict[str, Any], atol: float, source: Path) -> None:
    if found["max_abs_diff"] <= atol:
        return
    worst = max(found["runs"], key=lambda r: r["max_abs_diff"])
    raise BiodistilError(
        f"{source}: ONNX fp32 logits differ from PyTorch's by up to {found['max_abs_diff']:.3g} (batch "
        f"{worst['batch']}, length {worst['length']}; bound {atol:g}); nothing written. A shape fixed at export or "
        "an unsupported operation is the usual cause; raise --atol only if the difference is numerical noise."
    )


def _scores(models: dict[str, Any], loaded: LoadedModel,
            task_data: tuple[TaskSpec, list[Any]] | None) -> dict[str, dict[str, float]]:
    """Each model scored on the task's examples with the same code (nothing without a task)."""
    if task_data is None:
        return {}
    task, examples = task_data
    return {name: score_model(model, loaded.tokenizer, task, examples).scores for name, model in models.items()}


# ------------------------------------------------------------------------------------------ int8


def _int8(loaded: LoadedModel, folder: Path, options: ExportOptions, batches: list[Any], fused: bool,
          task_data: tuple[TaskSpec, list[Any]] | None, scores: dict[str, dict[str, float]],
          ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, dict[str, float]]]:
    """Quantise with every scheme asked for, measure each (drift; drop on the task), keep the one the gate picks as
    model.int8.onnx (or none). Returns the quantisation record, the kept graph's drift and each scheme's scores."""
    paths = {scheme: folder / f".model.int8-{scheme}.onnx" for scheme in options.schemes}
    source, smoothing = folder / VARIANT_FILES["fp32"], None
    if options.int8_smooth is not None and task_data is not None:  # validate: no --int8-smooth without --task
        source = folder / ".model.smoothed.onnx"
        smoothing = _smooth(loaded, folder / VARIANT_FILES["fp32"], source, options.int8_smooth, options,
                            task_data[0])
    try:
        quantization = quantize_int8(source, paths, fused)
    finally:
        if smoothing:
            source.unlink(missing_ok=True)
    candidates: dict[str, dict[str, Any]] = {}
    drifts: dict[str, dict[str, Any]] = {}
    int8_scores: dict[str, dict[str, float]] = {}
    for scheme, path in paths.items():
        model = OnnxModel(path, variant="int8")
        drifts[scheme] = compare_outputs(loaded.model, model, batches, loaded.head)
        candidates[scheme] = {key: drifts[scheme][key] for key in ("max_abs_diff", "min_agreement")}
        if task_data:
            int8_scores[scheme] = _scores({scheme: model}, loaded, task_data)[scheme]
            headline = task_data[0].headline_key
            candidates[scheme]["drop"] = scores["pytorch_fp32"][headline] - int8_scores[scheme][headline]
    lone = ("the one scheme auto makes after SmoothQuant's migration" if smoothing and options.int8_scheme == "auto"
            else "the scheme asked for")
    chosen, reason = choose_int8(candidates, options.max_int8_drop, lone)
    if chosen:
        paths[chosen].replace(folder / VARIANT_FILES["int8"])
    for path in paths.values():
        path.unlink(missing_ok=True)
    quantization.update(scheme=chosen, **(scheme_description(chosen, smoothing) if chosen else {}), choice=reason,
                        candidates=candidates, smoothing=smoothing)
    return quantization, drifts[chosen] if chosen else None, int8_scores


def calibration_examples(task: TaskSpec, scored: str, data_root: str | Path | None,
                         fold: int | None = None) -> tuple[str, list[Any]]:
    """The split SmoothQuant's migration is calibrated on and CALIBRATION_EXAMPLES of it: the dev split, or the
    training split when dev is the one scored or the task has none (never the split scored)."""
    split = "dev" if "dev" in task.files and scored != "dev" else "train"
    examples = read_split(task, split, data_root, fold, CALIBRATION_EXAMPLES)
    if not examples:
        raise BiodistilError(f"Task {task.name}: no {split} split to calibrate --int8-smooth on")
    return split, examples


def _smooth(loaded: LoadedModel, fp32_path: Path, target: Path, alpha: float, options: ExportOptions,
            task: TaskSpec) -> dict[str, Any]:
    """The fp32 graph with SmoothQuant's migration at `alpha` written to `target` (`calibration_examples`)."""
    split, examples = calibration_examples(task, options.split, task_data_root(options.data_root, [loaded.folder]),
                                           options.fold)

    def calibrate(model: Any) -> None:
        score_model(model, loaded.tokenizer, task, examples)

    smoothing = smooth_graph(fp32_path, target, alpha, calibrate)
    return {**smoothing, "calibration": {"split": split, "examples": len(examples)}}


def choose_int8(candidates: dict[str, dict[str, Any]], limit: float | None,
                lone: str = "the scheme asked for") -> tuple[str | None, str]:
    """The int8 scheme to ship and why, from each candidate's `drop` (PyTorch fp32 − int8 on the task's split, when
    scored) and `max_abs_diff` (logit drift on the parity batches).

    Scored: among the candidates within `limit` (all, without one), the smaller drop, then the smaller drift; none
    within it: None (ship fp32 only). Not scored: the smaller drift. `lone` says why a single candidate was made.
    """
    def listed(names: list[str]) -> str:
        return ", ".join(f"{n} {candidates[n]['drop']:+.4f}" for n in names)

    if any("drop" not in c for c in candidates.values()):
        best = min(candidates, key=lambda n: candidates[n]["max_abs_diff"])
        why = ("the smaller logit drift against PyTorch on the parity batches" if len(candidates) > 1
               else lone)
        return best, f"{best}: {why} (not scored: give --task to let the accuracy gate choose)"
    passing = [n for n, c in candidates.items() if limit is None or c["drop"] <= limit]
    if not passing:
        return None, (f"no int8 graph: every scheme drops more than the limit {limit:g} below PyTorch fp32 "
                      f"({listed(list(candidates))}); the fp32 graph is the one to deploy")
    best = min(passing, key=lambda n: (candidates[n]["drop"], candidates[n]["max_abs_diff"]))
    why = "the smaller drop" if len(candidates) > 1 else lone
    within = f", within the limit {limit:g}" if limit is not None else ""
    return best, f"{best}: {why}{within} (drops {listed(list(candidates))})"


def _accuracy(scores: dict[str, dict[str, float]], int8_scores: dict[str, dict[str, float]] | None,
              quantization: dict[str, Any] | None, task_data: tuple[TaskSpec, list[Any]],
              options: ExportOptions) -> dict[str, Any]:
    """PyTorch fp32, ONNX fp32 and the shipped int8 graph scored on the same examples; every int8 candidate's."""
    task, examples = task_data
    headline = task.headline_key
    result: dict[str, Any] = {"task": task.name, "split": options.split, "fold": options.fold,
                              "examples": len(examples), "max_examples": options.max_examples, "metric": task.metric,
                              "headline": headline, **scores}
    result["onnx_fp32_drop"] = scores["pytorch_fp32"][headline] - scores["onnx_fp32"][headline]
    if quantization is None or int8_scores is None:
        return result
    result["max_int8_drop"] = options.max_int8_drop
    result["int8_candidates"] = int8_scores
    if quantization["scheme"]:
        result["onnx_int8"] = int8_scores[quantization["scheme"]]
        result["int8_drop"] = scores["pytorch_fp32"][headline] - result["onnx_int8"][headline]
    return result


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "onnxscript": onnxscript.__version__,
            "python": platform.python_version()}


def _description(loaded: LoadedModel, graph: dict[str, Any], fusion: dict[str, Any], files: dict[str, str],
                 folder: Path, checks: dict[str, Any], quantization: dict[str, Any] | None,
                 accuracy: dict[str, Any] | None) -> dict[str, Any]:
    config = loaded.model.config
    labels = None if loaded.head == "masked_lm" else [str(config.id2label[i]) for i in range(len(config.id2label))]
    if fusion["applied"]:
        exporter, opset, attention = fusion["exporter"], FUSED_OPSET, "eager, fused into Attention nodes"
    else:
        exporter, opset, attention = "torch.onnx.export (dynamo)", OPSET, getattr(config, "_attn_implementation", None)
    return {
        "format": EXPORT_FORMAT, "source": str(loaded.folder), "head": loaded.head,
        "architecture": (config.architectures or [type(loaded.model).__name__])[0], "labels": labels,
        "max_length": loaded.max_length, "opset": opset, "exporter": exporter, "attention": attention, **graph,
        "fusion": fusion, "files": files,
        "bytes": {variant: (folder / name).stat().st_size for variant, name in files.items()},
        "parameters": parameter_counts(loaded.model), "quantization": quantization, "checks": checks,
        "accuracy": accuracy, "versions": _versions(),
        "provenance": {"biodistil": code_identity(), "source": model_identity(str(loaded.folder))},
    }


def format_export(out: Path, description: dict[str, Any]) -> str:
    """A plain-text summary of an export, for the terminal."""
    checks = description["checks"]
    lines = [f"Wrote {out}: {', '.join(description['files'].values())} ({description['head']}, opset "
             f"{description['opset']}, inputs {[i['name'] for i in description['inputs']]})",
             format_fusion(description["fusion"]),
             f"fp32 parity at lengths {checks['lengths']}: max |ONNX − PyTorch| = {checks['fp32']['max_abs_diff']:.2e} "
             f"(bound {checks['atol']:g}), predictions equal {100 * checks['fp32']['min_agreement']:.1f}%"]
    quantization = description.get("quantization")
    if quantization:
        smoothing = quantization.get("smoothing")
        if smoothing:
            ratio = smoothing["outlier_ratio"]
            lines.append(f"SmoothQuant before int8 (α {smoothing['alpha']:g}): {smoothing['activations']} activations "
                         f"divided per channel, {smoothing['products']} products' weights scaled; calibrated on "
                         f"{smoothing['calibration']['examples']} {smoothing['calibration']['split']} examples; "
                         f"largest / median channel maximum {ratio['before']:g} → {ratio['after']:g}")
        lines.append(f"int8 ({', '.join(quantization['schemes'])}): {quantization['choice']}")
    if checks.get("int8"):
        lines.append(f"int8 drift: max |int8 − PyTorch| = {checks['int8']['max_abs_diff']:.3g}, predictions equal "
                     f"(worst batch) {100 * checks['int8']['min_agreement']:.1f}%; size "
                     f"{description['bytes']['int8'] / 2**20:.1f} MB vs {description['bytes']['fp32'] / 2**20:.1f} MB")
    accuracy = description.get("accuracy")
    if accuracy:
        key = accuracy["headline"]
        found = [f"{name} {accuracy[name][key]:.4f}" for name in ("pytorch_fp32", "onnx_fp32") if name in accuracy]
        found += [f"int8 {scheme} {scores[key]:.4f}" for scheme, scores in accuracy.get("int8_candidates", {}).items()]
        lines.append(f"{accuracy['task']} {accuracy['split']} ({accuracy['examples']} examples) {key}: "
                     f"{', '.join(found)}" + (f"; shipped int8 drop {accuracy['int8_drop']:+.4f}"
                                              if "int8_drop" in accuracy else ""))
    return "\n".join(lines)
