"""The model card of an ONNX export folder (its README.md): the source model's card header (written by
`biodistil.training.card`) with tags `onnx` and `int8`, then how the graph was built (fusion, int8 scheme and why)
and what the export checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from biodistil.errors import BiodistilError
from biodistil.export.fusion import format_fusion
from biodistil.io import read_text
from biodistil.training.card import model_index, pipeline_tag


def export_card(source: Path, description: dict[str, Any]) -> str:
    """The README.md of an ONNX export folder: the source model's card header (when it has one) with tags `onnx`
    (and `int8`), then the graphs, their parity with PyTorch and their accuracy side by side."""
    header: dict[str, Any] = {"library_name": "onnx", "tags": ["biodistil", "onnx"]}
    try:
        text = read_text(source / "README.md", "model card") if (source / "README.md").is_file() else ""
        found = yaml.safe_load(text.split("---\n", 2)[1]) if text.startswith("---\n") else None
    except (BiodistilError, yaml.YAMLError, IndexError) as err:
        print(f"{source / 'README.md'}: its header cannot be read ({str(err).splitlines()[0]}); the export's card "
              "starts without it", flush=True)
        found = None
    if isinstance(found, dict):  # its header, less the source run's scores: this card states its own
        header = {**{k: v for k, v in found.items() if k != "model-index"}, "library_name": "onnx"}
        header["tags"] = [*header.get("tags", []), "onnx"]
    pipeline = pipeline_tag({"architectures": [description.get("architecture") or ""]})
    if pipeline:
        header["pipeline_tag"] = pipeline
    accuracy = description.get("accuracy")
    if accuracy and pipeline:
        shipped = "onnx_int8" if "onnx_int8" in accuracy else "onnx_fp32"
        args = {"max_examples": accuracy["max_examples"]} if accuracy.get("max_examples") else None
        header["model-index"] = model_index(f"{source.name} ({shipped.replace('_', ' ')})", pipeline,
                                            accuracy["task"], accuracy["split"], accuracy[shipped], args)
    if "int8" in description.get("files", {}):
        header["tags"].append("int8")
    checks = description.get("checks", {})
    lines = [f"# ONNX export of `{source.name}`", "",
             f"Graphs ({description.get('exporter')}, opset {description.get('opset')}): "
             + ", ".join(f"`{name}` ({variant})" for variant, name in description.get("files", {}).items())
             + f"; {description.get('architecture')}, head `{description.get('head')}`, made with `biodistil export`.",
             "", *_building(description), "", "## Checks", "",
             f"- fp32 logits against PyTorch at lengths {checks.get('lengths')}: largest difference "
             f"{(checks.get('fp32') or {}).get('max_abs_diff')} (bound {checks.get('atol')})"]
    if checks.get("int8"):
        lines.append(f"- int8 logits against PyTorch: largest difference {checks['int8'].get('max_abs_diff')}")
    for scheme, found in ((description.get("quantization") or {}).get("candidates") or {}).items():
        drop = f", drop {found['drop']:+.4f} below PyTorch fp32" if "drop" in found else ""
        lines.append(f"- int8 {scheme} candidate: largest logit difference {found['max_abs_diff']:.3g}{drop}")
    if accuracy:
        key = accuracy["headline"]
        cap = f", the first {accuracy['max_examples']} (max_examples)" if accuracy.get("max_examples") else ""
        lines += ["", f"## Accuracy ({accuracy['task']}, {accuracy['split']} split, {accuracy['examples']} examples"
                  f"{cap})",
                  "", "| runtime | " + key + " |", "|---|---|"]
        lines += [f"| {name.replace('_', ' ')} | {accuracy[name][key]:.4f} |"
                  for name in ("pytorch_fp32", "onnx_fp32", "onnx_int8") if name in accuracy]
        lines += [f"| int8 {scheme} (candidate) | {scores[key]:.4f} |"
                  for scheme, scores in accuracy.get("int8_candidates", {}).items()]
    lines += ["", "## Provenance", "", *_provenance(description.get("provenance") or {}, source), ""]
    return "---\n" + yaml.safe_dump(header, sort_keys=False, allow_unicode=True) + "---\n\n" + "\n".join(lines)


def _provenance(record: dict[str, Any], source: Path) -> list[str]:
    """Who made the export from what: biodistil's version (and commit) and the source weights' sha256."""
    code = record.get("biodistil") or {}
    commit = f", commit {code['git_commit'][:12]}{' (with changes)' if code.get('git_dirty') else ''}" \
        if code.get("git_commit") else ""
    weights = (record.get("source") or {}).get("weights") or {}
    lines = [f"- made by biodistil {code.get('version', '?')}{commit} from `{source}`"]
    lines += [f"- source weights `{name}`: sha256 `{digest}`" for name, digest in weights.items()]
    if (source / "README.md").is_file():
        lines.append("- how the source model was made: the `README.md` of the model folder exported")
    return lines


def _building(description: dict[str, Any]) -> list[str]:
    """How the graphs were built: the fusion (or why there is none) and the int8 scheme with the reason."""
    lines = [f"- {format_fusion(description['fusion'])}."] if description.get("fusion") else []
    quantization = description.get("quantization")
    if quantization:
        how = (f"{quantization['method']} ({quantization['weights']} weights, activations "
               f"{quantization['activations']}); " if quantization.get("scheme") else "")
        lines.append(f"- int8: {how}schemes tried: {', '.join(quantization['schemes'])}; "
                     f"shipped: {quantization['choice']}.")
        smoothing = quantization.get("smoothing")
        if smoothing:
            ratio, calibration = smoothing["outlier_ratio"], smoothing["calibration"]
            lines.append(f"- SmoothQuant before quantising (α {smoothing['alpha']:g}): {smoothing['activations']} "
                         f"activations divided per channel before the {smoothing['products']} products that read "
                         f"them, calibrated on {calibration['examples']} examples of the {calibration['split']} split; "
                         f"largest over median channel maximum (median over the activations) {ratio['before']:g} → "
                         f"{ratio['after']:g}.")
    return ["## How the graphs were built", "", *lines] if lines else []
