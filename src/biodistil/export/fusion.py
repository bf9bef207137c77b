"""Fused ONNX graphs of BERT-family models: the graph that ONNX Runtime's transformer optimizer fuses.

ONNX Runtime's optimizer (`onnxruntime.transformers.optimizer.optimize_model`, model type `bert`) rewrites the
subgraphs of a BERT layer into fused CPU kernels: self-attention (Q/K/V projection, scores, mask, softmax and context
in one `Attention` node, `QAttention` once quantised), residual + LayerNorm (`SkipLayerNormalization`), bias + GELU
(`BiasGelu`) and the embeddings' sum + LayerNorm (`EmbedLayerNormalization`). Its attention fusion matches the graph of
the TorchScript exporter with eager attention; the dynamo exporter's graph keeps its attention unfused whichever
attention it traces (checked with onnxruntime 1.32 and torch 2.13), so a fused graph is traced with
`torch.onnx.export(dynamo=False)` (opset 17, eager attention, batch and length dynamic).

* The attention mask stays a raw 0/1 mask (`use_raw_attention_mask`): the optimizer's default turns it into sequence
  lengths, which assumes right padding (a left-padded row or a mask with holes gave logits 0.45 off).
* opt_level 1 (ONNX Runtime's basic, hardware-independent rewrites): the saved graph stays portable and quantisable;
  the session applies its extended rewrites when it loads the graph.
* Families without a model type in the optimizer (ModernBERT, MobileBERT) are exported unfused with a note
  (`unfused`); the optimizer's BERT fusions fail on ModernBERT's bias-free LayerNorms.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from biodistil.errors import BiodistilError
from biodistil.export.onnx import TOKEN_LEVEL, LoadedModel, Logits, quiet_exporter, trace_inputs

FUSED_OPSET = 17
OPT_LEVEL = 1
# Hugging Face model types whose graph the optimizer's `bert` model type fuses (the embeddings differ; the layers are
# BERT's). The Attention count is checked after fusion: a graph whose attention did not fuse says so.
FUSED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert")
KEY_FUSIONS = ("Attention", "SkipLayerNormalization", "BiasGelu", "EmbedLayerNormalization")


def fusion_note(model_type: str) -> str | None:
    """Why a model type is exported unfused, or None when the optimizer fuses it."""
    if model_type in FUSED_MODEL_TYPES:
        return None
    return (f"unfused: ONNX Runtime's transformer optimizer has no model type for {model_type} (its BERT fusions "
            f"cover {', '.join(FUSED_MODEL_TYPES)}); the graph runs with ONNX Runtime's generic operators")


def unfused(note: str) -> dict[str, Any]:
    """The fusion record of a graph exported without fusion."""
    return {"applied": False, "note": note, "fused_operators": {}}


def export_fused(loaded: LoadedModel, path: Path) -> dict[str, Any]:
    """Trace the model (TorchScript exporter, eager attention), fuse the graph and write it to `path`; returns the
    fusion record: exporter, optimizer, the fused operators' counts and the node counts before and after."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    config = loaded.model.config
    with tempfile.TemporaryDirectory(prefix=".fuse-", dir=path.parent) as tmp:
        traced = Path(tmp) / "traced.onnx"
        _trace(loaded, traced)
        options = FusionOptions("bert")
        options.use_raw_attention_mask(True)
        try:
            optimized = optimize_model(str(traced), model_type="bert", num_heads=config.num_attention_heads,
                                       hidden_size=config.hidden_size, optimization_options=options,
                                       opt_level=OPT_LEVEL)
        except Exception as err:  # the optimizer raises bare exceptions from its pattern matchers
            raise BiodistilError(f"{loaded.folder}: ONNX Runtime's transformer optimizer failed on the graph "
                                 f"({type(err).__name__}: {err}); export with --no-fuse for the unfused graph") from err
        before = _node_count(traced)
        optimized.save_model_to_file(str(path))
    counts = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
    record: dict[str, Any] = {
        "applied": True, "exporter": "torch.onnx.export (TorchScript, eager attention)", "opset": FUSED_OPSET,
        "optimizer": f"onnxruntime.transformers.optimizer.optimize_model (model type bert, opt_level {OPT_LEVEL}, "
                     "raw attention mask)",
        "fused_operators": counts, "nodes": {"traced": before, "fused": len(optimized.model.graph.node)},
    }
    if not counts.get("Attention"):
        record["note"] = "the optimizer fused no Attention node: attention runs unfused"
    return record


def format_fusion(fusion: dict[str, Any]) -> str:
    """One line for the terminal and the model card: the fused operators, or why the graph is unfused."""
    if not fusion.get("applied"):
        return f"graph {fusion['note']}"
    counts = fusion["fused_operators"]
    shown = [f"{op} {counts.get(op, 0)}" for op in KEY_FUSIONS]
    shown += [f"{op} {n}" for op, n in counts.items() if op not in KEY_FUSIONS]
    nodes = fusion["nodes"]
    note = f" ({fusion['note']})" if fusion.get("note") else ""
    return (f"graph fused by ONNX Runtime's transformer optimizer: {', '.join(shown)}; {nodes['traced']} → "
            f"{nodes['fused']} nodes{note}")


def _trace(loaded: LoadedModel, path: Path) -> None:
    """The TorchScript export: inputs [batch, sequence] int64, logits with the same dynamic axes."""
    names, example = loaded.input_names, trace_inputs(loaded)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes["logits"] = {0: "batch", 1: "sequence"} if loaded.head in TOKEN_LEVEL else {0: "batch"}
    try:
        with quiet_exporter(), _eager_attention(loaded.model):
            torch.onnx.export(Logits(loaded.model), tuple(example.values()), str(path), dynamo=False,
                              opset_version=FUSED_OPSET, input_names=names, output_names=["logits"],
                              dynamic_axes=axes, do_constant_folding=True)
    except Exception as err:  # the exporter raises many types; the message names the model and the cause
        first = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
        raise BiodistilError(f"ONNX export (TorchScript, for fusion) of {loaded.folder} failed ({type(err).__name__}: "
                             f"{first}); export with --no-fuse for the unfused dynamo graph") from err


@contextlib.contextmanager
def _eager_attention(model: PreTrainedModel) -> Iterator[None]:
    """The model with eager attention (the pattern the optimizer fuses) while traced; its own attention after."""
    kept = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(kept)


def _node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)
