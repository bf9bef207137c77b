"""ONNX export of fine-tuned task models and masked LMs, dynamic int8 quantisation, and the parity checks.

* Export: BERT-family models are traced for ONNX Runtime's transformer optimizer and fused (`fusion`). Other
  families (ModernBERT) use `export_fp32`: `torch.onnx.export` with the dynamo exporter, opset 18, batch and
  sequence length dynamic, SDPA attention kept. Either graph maps `input_ids`, `attention_mask` (and
  `token_type_ids` where the model takes it) to `logits`; an exporter has been seen to fix shapes silently, so
  parity is checked at lengths and batch sizes other than the traced ones (2 × 17), and a fixed shape fails the check.
* int8: ONNX Runtime's recommended pre-processing (`quant_pre_process`: symbolic shape inference — ONNX's own where
  it fails —, basic graph optimisation unless the graph is already fused, ONNX shape inference), then one
  quantisation per scheme:
  `per-tensor` and `per-channel` (`quantize_dynamic`: int8 weights, each activation tensor quantised whole per
  batch at run time — the fast choice for transformers on CPU, no calibration data); `blockwise` (every MatMul with
  constant weights becomes ONNX Runtime's `MatMulNBits` at 8 bits, weights and activations quantised in blocks of
  128 along the reduction, int8 arithmetic; fused Attention nodes as per-channel — slower, closer to fp32: an
  outlier in one channel costs one block its resolution, not the whole tensor). Calibrated static quantisation was
  measured and dropped (docs/deployment.md). Which scheme ships is decided by `biodistil.export.command`.
* Checks: outputs of the ONNX graph against PyTorch's on real biomedical sentences cut or repeated to several
  lengths, with a padded row; the largest absolute logit difference (over non-padding positions) and the
  share of equal predictions (argmax, or sign for multi-label).

The ONNX packages are the optional extra `export`; they are imported only in this package.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from biodistil.errors import BiodistilError
from biodistil.export.runtime import require_onnx
from biodistil.models.families import position_limit

OPSET = 18
TRACE_BATCH, TRACE_LENGTH = 2, 17  # traced shapes; the checks use others
CHECK_LENGTHS = (9, 64, 512)  # capped at what the model allows
INT8_SCHEMES = ("per-tensor", "per-channel", "blockwise")
FAST_INT8_SCHEMES = ("per-tensor", "per-channel")  # what --int8-scheme auto tries
BLOCK_SIZE = 128  # blockwise: weights and activations quantised per 128 values along the reduction
MAX_PROTO_BYTES = 1_900_000_000  # a single-file ONNX graph must stay under protobuf's 2 GB
HEAD_SUFFIXES = {
    "ForTokenClassification": "token_classification",
    "ForSequenceClassification": "sequence_classification",
    "ForMaskedLM": "masked_lm",
}
TOKEN_LEVEL = ("token_classification", "masked_lm")
# Real sentences (cut or repeated to each checked length), so that the checks see realistic activations.
PARITY_TEXTS = (
    "Germline mutations in BRCA1 raise the lifetime risk of breast and ovarian cancer in carriers .",
    "Loss of CFTR function causes cystic fibrosis , an autosomal recessive disorder of epithelial transport .",
    "Patients with type 2 diabetes mellitus received metformin at a daily dose of 1000 mg for 12 weeks .",
    "The tumour suppressor p53 induces apoptosis in human fibroblasts after DNA damage .",
    "Huntington disease is caused by an expanded CAG repeat in exon 1 of the huntingtin gene .",
    "Serum interleukin-6 levels were raised in patients with active rheumatoid arthritis .",
)


@dataclass
class LoadedModel:
    """A model folder loaded for export: the PyTorch model (eval mode), its tokenizer and its head."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    head: str  # token_classification | sequence_classification | multilabel_classification | masked_lm
    folder: Path

    @property
    def input_names(self) -> list[str]:
        """input_ids, attention_mask, and token_type_ids where both the model and its tokenizer use them."""
        import inspect

        segments = ("token_type_ids" in inspect.signature(self.model.forward).parameters
                    and "token_type_ids" in self.tokenizer.model_input_names)
        return ["input_ids", "attention_mask", *(["token_type_ids"] if segments else [])]

    @property
    def max_length(self) -> int:
        return position_limit(self.model.config)


# ------------------------------------------------------------------------------------------ loading


def head_of(config: PretrainedConfig, where: str | Path) -> str:
    """The head of a saved model from its architecture; anything else is an error listing what is supported."""
    architectures = list(getattr(config, "architectures", None) or [])
    for architecture in architectures:
        for suffix, head in HEAD_SUFFIXES.items():
            if architecture.endswith(suffix):
                multilabel = getattr(config, "problem_type", None) == "multi_label_classification"
                return "multilabel_classification" if head == "sequence_classification" and multilabel else head
    raise BiodistilError(
        f"{where}: cannot export architecture {architectures or '(none recorded in config.json)'}; supported heads: "
        f"*{', *'.join(HEAD_SUFFIXES)} (a fine-tuned token, sequence or multi-label classifier, or a masked LM). "
        "Fine-tune the model first (`biodistil finetune`) or export its masked-LM folder."
    )


def load_model_folder(path: str | Path) -> LoadedModel:
    """A Hugging Face model folder with a supported head, loaded for export or scoring."""
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

    from biodistil.models.loading import load_tokenizer

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise BiodistilError(f"'{path}' is not a folder; expected a Hugging Face model folder (config.json, weights "
                             "and tokenizer), e.g. the `model/` folder of a fine-tuning run")
    if not (folder / "config.json").is_file():
        raise BiodistilError(f"{folder} has no config.json; expected a Hugging Face model folder, e.g. the `model/` "
                             "folder of a fine-tuning run")
    config = AutoConfig.from_pretrained(str(folder))
    head = head_of(config, folder)
    factory = {"token_classification": AutoModelForTokenClassification,
               "masked_lm": AutoModelForMaskedLM}.get(head, AutoModelForSequenceClassification)
    try:
        with _quiet_loading():
            model = factory.from_pretrained(str(folder))  # transformers' default: SDPA where the family has it
    except SafetensorError as err:
        files = ", ".join(str(path) for path in sorted(folder.glob("*.safetensors"))) or str(folder)
        raise BiodistilError(f"{files}: the weights file is corrupt or truncated ({str(err).splitlines()[0]}); export "
                             "or download the model again") from None
    except (OSError, ValueError) as err:
        raise BiodistilError(f"Could not load {head} model from {folder}: {str(err).splitlines()[0]}") from None
    return LoadedModel(model.eval(), load_tokenizer(str(folder)), head, folder)


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """No loading report and no 'Loading weights' progress bar from transformers (restored afterwards)."""
    verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()


# ------------------------------------------------------------------------------------------ export


class Logits(nn.Module):
    """The model with tensor inputs and the logits as its one output (what the ONNX graph computes).

    In eval mode from the start: the TorchScript exporter puts the module it exported back in the mode it found it
    in, recursively, and a wrapper left in training mode turned the model's dropout on for everything after."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits


@contextlib.contextmanager
def logger_at(name: str, level: int) -> Iterator[None]:
    """The named logger at `level` for the block, its own level restored after."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporter's progress lines, deprecation warnings and 'torchvision not installed' notes, silenced."""
    with logger_at("torch.onnx._internal.exporter._registration", logging.ERROR), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def trace_inputs(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    """The example an exporter traces (TRACE_BATCH × TRACE_LENGTH random ids), after checking that the graph fits in
    one file."""
    require_onnx()
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    if weight_bytes > MAX_PROTO_BYTES:
        raise BiodistilError(f"{loaded.folder}: {weight_bytes / 2**30:.1f} GiB of weights; ONNX export here writes "
                             "one file, which protobuf limits to 2 GB (models up to BERT-large fit)")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, int(loaded.model.config.vocab_size), (TRACE_BATCH, TRACE_LENGTH), generator=generator)
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return {name: example[name] for name in loaded.input_names}


def export_fp32(loaded: LoadedModel, path: Path) -> None:
    """Write the unfused fp32 ONNX graph (dynamo exporter, SDPA attention) to `path`."""
    example, names = trace_inputs(loaded), loaded.input_names
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=loaded.max_length)
    try:
        with quiet_exporter():
            torch.onnx.export(Logits(loaded.model), (), str(path), kwargs=example, dynamo=True, opset_version=OPSET,
                              input_names=names, output_names=["logits"], external_data=False, verbose=False,
                              dynamic_shapes={name: {0: batch, 1: sequence} for name in names})
    except Exception as err:  # the exporter raises many types; the message names the model and the cause
        raise BiodistilError(f"ONNX export of {loaded.folder} failed ({type(err).__name__}: "
                             f"{str(err).strip().splitlines()[0] if str(err).strip() else 'no message'})") from err


def describe_graph(path: Path) -> dict[str, Any]:
    """Names, element types and shapes (symbolic axes by name) of a graph's inputs and outputs."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def entry(value: Any) -> dict[str, Any]:
        tensor = value.type.tensor_type
        return {"name": value.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name,
                "shape": [d.dim_param or d.dim_value for d in tensor.shape.dim]}

    return {"inputs": [entry(v) for v in graph.input], "outputs": [entry(v) for v in graph.output]}


def check_graph(path: Path) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as err:
        raise BiodistilError(f"{path}: the exported graph is not valid ONNX ({str(err).splitlines()[0]})") from None


def quantize_int8(fp32_path: Path, targets: dict[str, Path], fused: bool) -> dict[str, Any]:
    """Pre-process an fp32 graph once, then quantise it to int8 once per scheme of `targets` (scheme → output file);
    returns how it was done. A fused graph skips the pre-processing's graph optimisation (it is already optimised,
    and its fused nodes are what `quantize_dynamic` maps to QAttention)."""
    require_onnx("int8 quantisation")
    with tempfile.TemporaryDirectory(prefix=".quant-", dir=fp32_path.parent) as tmp:
        prepared = Path(tmp) / "preprocessed.onnx"
        try:
            shapes = pre_process(fp32_path, prepared, fused)
            for scheme, target in targets.items():
                quantize_scheme(prepared, target, scheme)
        except Exception as err:  # ONNX Runtime's tools raise bare Exceptions
            raise BiodistilError(f"int8 quantisation of {fp32_path} failed ({type(err).__name__}: {err})"
                                 f"{low_disk_note(fp32_path)}; export without --int8 to keep the fp32 graph") from err
    optimisation = "skipped (the graph is fused already)" if fused else "ORT basic optimisation"
    return {"schemes": list(targets), "pre_process": f"quant_pre_process: {shapes}, {optimisation}, "
                                                     "ONNX shape inference"}


def low_disk_note(graph: Path) -> str:
    """A note for the error when the disk holding `graph` has less free space than a few copies of it: ONNX's shape
    inference writes its output in C++ and, on a full disk, leaves a truncated file that fails later to parse
    ("DecodeError: ... Wire format was corrupt") instead of saying the disk is full."""
    try:
        free, size = shutil.disk_usage(graph.parent).free, graph.stat().st_size
    except OSError:  # the note must never hide the error it annotates
        return ""
    if free >= 4 * size:
        return ""
    return (f". The disk holding {graph.parent} has only {free / 2**20:,.0f} MiB free (the quantisation writes "
            f"about 3 copies of the {size / 2**20:,.0f} MiB graph): a full disk truncates ONNX Runtime's intermediate "
            "files; free space and export again")


def pre_process(fp32_path: Path, prepared: Path, fused: bool) -> str:
    """ONNX Runtime's pre-processing for quantisation; returns how the shapes were inferred. Its symbolic shape
    inference fails on some exporters' graphs (an MPNet graph of PyTorch 2.11's exporter: a `Range` whose limit is
    not a scalar, an AssertionError), and is only an aid to the quantiser: then ONNX's own shape inference serves."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        # auto_merge: the dynamo graph's mask arithmetic leaves symbolic dims that must be merged
        quant_pre_process(str(fp32_path), str(prepared), skip_optimization=fused, auto_merge=True)
        return "symbolic shape inference (auto_merge)"
    except Exception as err:  # ONNX Runtime's shape inference raises bare AssertionErrors and Exceptions
        quant_pre_process(str(fp32_path), str(prepared), skip_optimization=fused, skip_symbolic_shape=True)
        return (f"symbolic shape inference failed ({type(err).__name__}"
                f"{': ' + str(err).splitlines()[0] if str(err).strip() else ''}), ONNX shape inference only")


def quantize_scheme(prepared: Path, target: Path, scheme: str, block_size: int = BLOCK_SIZE) -> None:
    """Quantise the pre-processed graph `prepared` to `target` with one of `INT8_SCHEMES` (module docstring);
    `block_size`: blockwise's block along the reduction (the export's `BLOCK_SIZE`; other sizes for benches)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if scheme not in INT8_SCHEMES:
        raise BiodistilError(f"int8 scheme must be one of {', '.join(INT8_SCHEMES)}; got {scheme!r}")
    if scheme != "blockwise":
        quantize_dynamic(str(prepared), str(target), weight_type=QuantType.QInt8, per_channel=scheme == "per-channel")
        return
    blocked = target.with_name(target.name + ".blocked")
    try:
        _matmuls_to_nbits(prepared, blocked, block_size)
        # the fused Attention nodes (no MatMul for MatMulNBits to take) as per-channel; embeddings stay fp32
        quantize_dynamic(str(blocked), str(target), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["Attention"])
    finally:
        blocked.unlink(missing_ok=True)


def _matmuls_to_nbits(source: Path, target: Path, block_size: int) -> None:
    """Every MatMul with constant weights → MatMulNBits: 8-bit symmetric weights per block of `block_size`, int8
    compute with activations quantised per block (accuracy level 4)."""
    import onnx

    nbits = _nbits_module()
    config = nbits.DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=4, bits=8)
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(source)), bits=8, block_size=block_size,
                                           is_symmetric=True, accuracy_level=4, algo_config=config)
    with logger_at("onnxruntime.quantization.matmul_nbits_quantizer", logging.WARNING):  # a line per node at INFO
        quantizer.process()
    quantizer.model.save_model_to_file(str(target), False)


def _nbits_module() -> Any:
    """ONNX Runtime's `matmul_nbits_quantizer`, imported without the root-logger set-up its import does."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization import matmul_nbits_quantizer

    root.handlers[:] = handlers
    root.setLevel(level)
    return matmul_nbits_quantizer


def scheme_description(scheme: str, smoothing: dict[str, Any] | None = None) -> dict[str, str]:
    """How one int8 scheme quantises: method, weights and activations (for export.json and the card); `smoothing`:
    the record of SmoothQuant's migration made before, if any."""
    described = _scheme_description(scheme)
    if smoothing:
        described["activations"] += f", after SmoothQuant's migration (α {smoothing['alpha']:g})"
    return described


def _scheme_description(scheme: str) -> dict[str, str]:
    if scheme == "blockwise":
        return {"method": f"onnxruntime MatMulNBits for MatMul (8 bits, symmetric, block {BLOCK_SIZE}, accuracy "
                          "level 4), quantize_dynamic per-channel for fused Attention",
                "weights": f"int8 per block of {BLOCK_SIZE} (per column in fused Attention)",
                "activations": f"int8 per block of {BLOCK_SIZE}, quantised at run time (uint8 per tensor in fused "
                               "Attention)"}
    return {"method": "onnxruntime.quantization.quantize_dynamic",
            "weights": f"int8 (QInt8) per {'column' if scheme == 'per-channel' else 'tensor'}",
            "activations": "uint8, quantised per tensor and batch at run time"}


# ------------------------------------------------------------------------------------------ checks


def check_lengths(limit: int) -> list[int]:
    """Sequence lengths of the parity checks: short, medium and the longest allowed (none is the traced one)."""
    return sorted({min(n, limit) for n in CHECK_LENGTHS} - {TRACE_LENGTH})


def _ids_of_length(tokenizer: PreTrainedTokenizerBase, start: int, length: int) -> list[int]:
    """Token ids of exactly `length` (special tokens included) from the parity texts, from text `start` on."""
    texts: list[str] = []
    while True:
        texts.append(PARITY_TEXTS[(start + len(texts)) % len(PARITY_TEXTS)])
        ids = tokenizer(" ".join(texts), truncation=True, max_length=length)["input_ids"]
        if len(ids) == length:
            return ids


def parity_batches(tokenizer: PreTrainedTokenizerBase, names: Sequence[str], lengths: Sequence[int],
                   two_segments: bool = True) -> list[dict[str, torch.Tensor]]:
    """Per length: a batch of 2 (one full row, with two segments if the model has them; one padded to the length
    from half of it), and one batch of 1 at the first length."""
    batches = []
    for index, length in enumerate(lengths):
        full = _ids_of_length(tokenizer, index, length)
        short = _ids_of_length(tokenizer, index + 1, max(2, length // 2))
        pad = tokenizer.pad_token_id or 0
        ids = torch.tensor([full, short + [pad] * (length - len(short))])
        mask = torch.tensor([[1] * length, [1] * len(short) + [0] * (length - len(short))])
        segments = torch.zeros_like(ids)
        segments[0, length // 2:] = int(two_segments)
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": segments})
    batches.append({key: value[:1] for key, value in batches[0].items()})
    return [{key: value for key, value in batch.items() if key in names} for batch in batches]


def compare_outputs(reference: Callable[..., Any], candidate: Callable[..., Any],
                    batches: Sequence[dict[str, torch.Tensor]], head: str) -> dict[str, Any]:
    """Largest absolute logit difference and share of equal predictions, per batch and overall.

    Token-level outputs are compared at non-padding positions only; predictions are the argmax, or the sign of
    each logit for multi-label heads.
    """
    runs = []
    for batch in batches:
        with torch.inference_mode():
            want = reference(**batch).logits.float()
        got = candidate(**batch).logits.float()
        if head in TOKEN_LEVEL:
            keep = batch["attention_mask"].bool()
            want, got = want[keep], got[keep]
        if head == "multilabel_classification":
            agree = ((want > 0) == (got > 0)).float().mean()
        else:
            agree = (want.argmax(-1) == got.argmax(-1)).float().mean()
        batch_size, length = batch["input_ids"].shape
        runs.append({"batch": batch_size, "length": length, "max_abs_diff": float((want - got).abs().max()),
                     "agreement": float(agree)})
    return {"max_abs_diff": max(r["max_abs_diff"] for r in runs),
            "min_agreement": min(r["agreement"] for r in runs), "runs": runs}
