"""Running an ONNX export with ONNX Runtime behind the call interface of the Hugging Face model it came from.

`OnnxModel(**batch).logits` is what `model(**batch).logits` is for the PyTorch model, so prediction, scoring
and benchmarking code takes either. The ONNX packages are an optional extra, imported only when used.

An export folder (written by `biodistil export`) holds:

    model.onnx          fp32 graph (inputs: input_ids, attention_mask[, token_type_ids]; output: logits), fused
                        by ONNX Runtime's transformer optimizer for BERT-family models
    model.int8.onnx     the same graph with int8 weights (with --int8; the scheme — per-tensor or per-channel,
                        chosen by the export's accuracy gate, or blockwise when asked for — in export.json)
    export.json         inputs, outputs, labels, the checks' figures and the accuracy side by side
    config.json, tokenizer files
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biodistil.errors import BiodistilError
from biodistil.io import read_json

EXPORT_FORMAT = "biodistil-onnx/1"
DESCRIPTION_FILE = "export.json"
VARIANT_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
MAX_ATTENTION_MB = 16.0  # attention scores one session run may hold (OnnxModel)
EXTRA_HINT = 'pip install -e ".[export]" (or pip install onnx onnxruntime onnxscript)'


def require_onnx(purpose: str = "ONNX export") -> None:
    """Import the optional ONNX packages, or say which extra installs them."""
    missing = []
    for name in ("onnx", "onnxruntime", "onnxscript"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise BiodistilError(f"{purpose} needs the optional extra 'export' ({', '.join(missing)} not installed): "
                             f"{EXTRA_HINT}")


def is_export_folder(path: str | Path) -> bool:
    return (Path(path) / DESCRIPTION_FILE).is_file()


def read_description(folder: str | Path) -> dict[str, Any]:
    """The export.json of an export folder, checked to be one."""
    path = Path(folder) / DESCRIPTION_FILE
    data = read_json(path, "export description", "expected a folder written by `biodistil export` (export the "
                     "model again)")
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise BiodistilError(f"{path}: not a biodistil ONNX export (expected format {EXPORT_FORMAT})")
    return data


def variant_of(onnx_file: str | Path) -> str:
    """'fp32' or 'int8' from the file name of an export's graph."""
    name = Path(onnx_file).name
    for variant, file_name in VARIANT_FILES.items():
        if name == file_name:
            return variant
    raise BiodistilError(f"{onnx_file}: not a graph of a biodistil export (expected "
                         f"{' or '.join(VARIANT_FILES.values())} in a folder written by `biodistil export`)")


@dataclass
class OnnxOutput:
    """What the Hugging Face model returns, as far as prediction needs it."""

    logits: torch.Tensor


class OnnxModel:
    """An ONNX graph in an ONNX Runtime CPU session, called like the PyTorch model: `model(**batch).logits`.

    Inputs may be torch tensors or numpy arrays; `token_type_ids`, when the graph takes it and the batch lacks
    it, is all zeros (what the PyTorch model assumes). Keys the graph does not take are ignored.

    A batch whose attention scores ([rows, heads, length, length] float32, what ONNX Runtime's CPU attention holds:
    it has no tiled kernel for a padding mask) would exceed `max_attention_mb` runs as consecutive slices of rows;
    the outputs are the same, and at 32 × 512 tokens the peak memory drops from 1 GB to 32 MB for a 3 × 384 BERT,
    no slower (docs/deployment.md). None runs every batch whole.
    """

    def __init__(self, onnx_file: str | Path, threads: int | None = None, memory_arena: bool = True,
                 max_attention_mb: float | None = MAX_ATTENTION_MB, variant: str | None = None):
        require_onnx("Running an ONNX model")
        import onnxruntime as ort
        from transformers import AutoConfig

        self.path = Path(onnx_file)
        if not self.path.is_file():
            raise BiodistilError(f"ONNX model {self.path} not found (expected a folder written by `biodistil "
                                 "export`, or a .onnx file in one)")
        self.folder = self.path.parent
        self.variant = variant or variant_of(self.path)
        self.config = AutoConfig.from_pretrained(str(self.folder))  # written beside the graph by the export
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = memory_arena
        # ONNX Runtime's idle threads spin on the CPU after every run: beside PyTorch in one process (a benchmark
        # side by side, scoring inside a training job) they took the cores PyTorch's next run needed (a 2-thread
        # PyTorch teacher timed 2x slower after an ONNX model had run). A serving process may turn it back on.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.threads = threads
        self.max_attention_mb = max_attention_mb
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # ONNX Runtime raises its own classes (InvalidProtobuf, Fail, ...), all Exceptions
            raise BiodistilError(f"{self.path}: ONNX Runtime cannot load this graph ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0][:200]}); it is cut short or damaged: export the model "
                                 "again (biodistil export MODEL --out FOLDER)") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.device = torch.device("cpu")

    @classmethod
    def from_export(cls, folder: str | Path, variant: str = "fp32", **kwargs: Any) -> OnnxModel:
        if variant not in VARIANT_FILES:
            raise BiodistilError(f"Unknown ONNX variant '{variant}'; choose one of {sorted(VARIANT_FILES)}")
        return cls(Path(folder) / VARIANT_FILES[variant], **kwargs)

    @property
    def runtime(self) -> str:
        import onnxruntime as ort

        threads = f", {self.threads} thread{'s' * (self.threads != 1)}" if self.threads else ""
        return f"onnxruntime {ort.__version__} CPU ({self.variant}{threads})"

    @property
    def parameters_count(self) -> dict[str, int]:
        """Parameters of the encoder the graph was exported from (as counted for PyTorch models)."""
        return dict(read_description(self.folder)["parameters"])

    def eval(self) -> OnnxModel:
        return self

    def to(self, device: torch.device | str) -> OnnxModel:
        if torch.device(device).type != "cpu":
            raise BiodistilError(f"{self.path}: ONNX models run on the CPU here (ONNX Runtime's CPU provider); "
                                 f"asked for {device}")
        return self

    def rows_per_run(self, rows: int, length: int) -> int:
        """How many of a batch's rows one session run takes (see the class docstring)."""
        if self.max_attention_mb is None:
            return rows
        heads = int(getattr(self.config, "num_attention_heads", 1))
        return max(1, min(rows, int(self.max_attention_mb * 2**20) // (4 * heads * length * length)))

    def feed(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """The session's inputs from a batch (see the class docstring)."""
        feed = {}
        for name in self.input_names:
            if name in inputs:
                feed[name] = _int64(inputs[name])
            elif name == "token_type_ids" and "input_ids" in inputs:
                feed[name] = np.zeros_like(_int64(inputs["input_ids"]))
            else:
                raise BiodistilError(f"{self.path}: the graph needs input '{name}' (inputs: {self.input_names})")
        return feed

    def run_rows(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """The logits of one session run over a slice of a batch's rows."""
        return self.session.run(["logits"], feed)[0]

    def __call__(self, **inputs: Any) -> OnnxOutput:
        feed = self.feed(inputs)
        rows, length = feed[self.input_names[0]].shape[:2]
        step = self.rows_per_run(rows, length)
        parts = [self.run_rows({k: v[start:start + step] for k, v in feed.items()}) for start in range(0, rows, step)]
        return OnnxOutput(torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts)))


def _int64(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(value, dtype=np.int64)
