"""How close does a dynamic-int8 graph come to its PyTorch model, and what does keeping some layers in fp32 buy?

    python bench/research/int8_layers.py runs/demo/study/ncbi_disease/distilled/seed-1/model runs/demo/student-onnx \
        --task ncbi_disease --keep none 0 1 2 0,1 head --threads 1 --out docs/results/int8-layers.json

For each `--keep` choice (encoder layers kept in fp32, comma-separated; `head`: the classifier; `embeddings`: the
embedding tables ONNX Runtime quantises too; `none`: the int8 graph as `export --int8` makes it, per-channel
weights), the export's fp32 graph is quantised again with `onnxruntime.quantization.quantize_dynamic(...,
nodes_to_exclude=...)` and run through `Predictor` on the task's test split (`--split dev` to choose settings on;
pre-tokenised sentences, as evaluation reads them). Printed per choice: the share of the PyTorch model's predictions
it keeps (token tasks: entities as (sentence, start, end, type); classifiers: labels), the predictions it adds, and
its seconds and records/s at the given threads (same process, same inputs).

`--greedy TARGET` searches node by node instead: starting from the shipped int8 graph, each round keeps in fp32 the
one quantisable node (a MatMul, fused Attention or Gemm) whose exclusion keeps the most of PyTorch's predictions,
until the share reaches TARGET (e.g. 0.99) or `--rounds` rounds; every candidate of every round is recorded.

`--schemes` compares whole quantisation schemes instead: `export --int8`'s own (`per-tensor`, `per-channel`,
`blockwise`: `biodistil.export.onnx.quantize_scheme`) and `static` (ONNX Runtime's `quantize_static`, per-channel
int8 weights, uint8 activations with scales calibrated (min-max) on the task's first 128 dev sentences — measured
to say why the export does not offer it). Rows: one per scheme, named in `keep_fp32`'s place by `scheme`.

`--smooth ALPHA ...` measures every row again on the graph `export --int8-smooth ALPHA` quantises: SmoothQuant's
migration (`biodistil.export.smoothing`) applied first, calibrated as the export calibrates (a seeded 512 sentences
of the task's dev split; of its training split with `--split dev`); each row records its `smooth` (null: none) and
`smooth_inputs` (`--smooth-inputs layernorm`: only the LayerNorm outputs migrate).
"""

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from biodistil import Predictor
from biodistil.export.predict import Document
from biodistil.tasks.registry import get_task
from biodistil.tasks.splits import read_split
from biodistil.training.machine import cpu_line

LAYER = re.compile(r"layers?\.(\d+)/|^Attention_(\d+)$")
SCOPED_LAYER = re.compile(r"\.layers?\.(\d+)'")  # 'model.mpnet.encoder.layer.3' in a node's name scopes


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the fine-tuned PyTorch model folder")
    parser.add_argument("export", help="its `biodistil export --int8` folder (model.onnx is quantised again)")
    parser.add_argument("--task", required=True, help="built-in task name or task YAML")
    parser.add_argument("--data", help="data folder (default: the task's own)")
    parser.add_argument("--split", choices=("dev", "test"), default="test",
                        help="the split whose sentences are compared (test; dev to choose settings on)")
    parser.add_argument("--keep", nargs="+", default=["none", "0", "0,1", "head"],
                        help="layers kept in fp32 per choice: none, 0, 0,1, head, ... (default: none 0 0,1 head)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--greedy", type=float, metavar="TARGET", help="node-by-node search up to this share")
    parser.add_argument("--rounds", type=int, default=3, help="--greedy: at most this many nodes kept in fp32")
    parser.add_argument("--schemes", nargs="+", choices=("per-tensor", "per-channel", "blockwise", "static"),
                        help="compare these quantisation schemes instead of fp32 layers or nodes")
    parser.add_argument("--smooth", nargs="*", type=float, default=[], metavar="ALPHA",
                        help="also measure every row after SmoothQuant's migration at these α")
    parser.add_argument("--smooth-inputs", nargs="+", choices=("all", "layernorm"), default=["all"],
                        help="--smooth: migrate every activation, or only LayerNorm outputs (each given: both)")
    parser.add_argument("--out", help="also write the record as JSON")
    return parser.parse_args(argv)


def predictions(records: list[dict]) -> set:
    """What a prediction run decided: entities (token tasks) or (id, label) pairs (classifiers)."""
    found = set()
    for record in records:
        if "entities" in record:
            found.update((record["id"], e["start"], e["end"], e["label"]) for e in record["entities"])
        else:
            labels = record.get("labels", [record.get("label")])
            found.update((record["id"], label) for label in labels)
    return found


def excluded_nodes(graph_path: Path, keep: str) -> list[str]:
    """The names of the nodes `keep` names: the MatMul / Attention / Gemm nodes of encoder layers (by number), of the
    head (`head`: those outside the layers) or the embeddings (`embeddings`: EmbedLayerNormalization, Gather); `none`:
    no node."""
    import onnx

    graph = onnx.load(str(graph_path)).graph
    matmuls = [n for n in graph.node if n.op_type in ("MatMul", "Attention", "Gemm")]
    embeddings = [n.name for n in graph.node if n.op_type in ("EmbedLayerNormalization", "Gather")]
    chosen = set()
    for part in keep.split(","):
        if part == "embeddings":
            chosen.update(embeddings)
        for node in matmuls:
            layer = node_layer(node)
            if (part == "head" and layer is None) or (part.isdigit() and layer == int(part)):
                chosen.add(node.name)
    return sorted(chosen)


def node_layer(node) -> int | None:
    """The encoder layer a node belongs to: from its name (the fused BERT graphs: `.../layer.3/...`, `Attention_3`)
    or, in the dynamo exporter's unfused graphs (`node_MatMul_70`), from the module scopes it records."""
    match = LAYER.search(node.name)
    if match is None:
        scopes = next((prop.value for prop in node.metadata_props if prop.key == "pkg.torch.onnx.name_scopes"), "")
        match = SCOPED_LAYER.search(scopes)
        return None if match is None else int(match.group(1))
    return int(match.group(1) or match.group(2))


def quantised_nodes(graph_path: Path) -> dict[str, int]:
    """How many nodes of each quantised operator type the graph holds (MatMulNBits, QAttention, QLinearMatMul, ...)."""
    import onnx

    found: dict[str, int] = {}
    for node in onnx.load(str(graph_path)).graph.node:
        if node.op_type.startswith(("Q", "MatMulInteger", "MatMulNBits", "DynamicQuantize")):
            found[node.op_type] = found.get(node.op_type, 0) + 1
    return dict(sorted(found.items()))


def greedy(prepared: Path, measure, target: float, rounds: int) -> list[dict]:
    """Node-by-node search (module docstring): the rows of every candidate, the chosen ones marked."""
    import onnx

    nodes = [n.name for n in onnx.load(str(prepared)).graph.node if n.op_type in ("MatMul", "Attention", "Gemm")]
    kept: list[str] = []
    rows = [measure("none", [])]
    best = rows[0]
    for _ in range(rounds):
        if best["share_of_pytorch"] >= target:
            break
        tried = [measure(",".join([*kept, node]), [*kept, node]) for node in nodes if node not in kept]
        best = max(tried, key=lambda row: (row["share_of_pytorch"], row["records_per_s"]))
        best["chosen"] = True
        kept = best["keep_fp32"].split(",")
        rows += tried
    return rows


def quantize_static_calibrated(prepared: Path, target: Path, folder: Path, examples: list) -> None:
    """ONNX Runtime's static quantisation (QOperator, per-channel weights, min-max activation scales) calibrated on
    `examples` (pre-tokenised sentences), one sentence per calibration batch."""
    import numpy as np
    import onnxruntime
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    names = [i.name for i in onnxruntime.InferenceSession(str(prepared)).get_inputs()]

    class Sentences(CalibrationDataReader):
        def __init__(self) -> None:
            encoded = (tokenizer(e.tokens, is_split_into_words=True, truncation=True, max_length=128,
                                 return_tensors="np") for e in examples)
            self.feeds = iter([{k: enc[k].astype(np.int64) for k in names} for enc in encoded])

        def get_next(self) -> dict | None:
            return next(self.feeds, None)

    quantize_static(str(prepared), str(target), Sentences(), quant_format=QuantFormat.QOperator, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8, op_types_to_quantize=["MatMul",
                    "Attention"])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from biodistil.export.command import calibration_examples
    from biodistil.export.onnx import quantize_scheme
    from biodistil.export.smoothing import smooth_graph
    from biodistil.models.loading import load_tokenizer
    from biodistil.tasks.scoring import score_model

    task = get_task(args.task)
    examples = read_split(task, args.split, args.data)
    documents = [Document.of(example) for example in examples]
    reference = predictions(Predictor(args.model, runtime="pytorch", threads=args.threads)(documents))
    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-layers-") as scratch:
        work = Path(scratch)
        for file in Path(args.export).iterdir():
            if file.is_file() and file.name != "model.int8.onnx":
                shutil.copy(file, work / file.name)
        fp32 = work / ".fp32.onnx"
        shutil.copy(work / "model.onnx", fp32)
        _, calibration = calibration_examples(task, args.split, args.data)  # as the export: never the compared split
        tokenizer = load_tokenizer(str(work))

        def prepare(alpha: float | None, inputs: str) -> Path:
            """The graph to quantise: the export's fp32 graph, after SmoothQuant's migration at `alpha` if given."""
            source = fp32
            if alpha is not None:
                source = work / f".smoothed-{alpha}-{inputs}.onnx"
                smooth_graph(fp32, source, alpha, lambda model: score_model(model, tokenizer, task, calibration),
                             inputs)
            prepared = work / f".prepared-{alpha}-{inputs}.onnx"
            quant_pre_process(str(source), str(prepared), skip_optimization=True, auto_merge=True)
            return prepared

        def measure(keep: str, excluded: list[str], scheme: str | None = None) -> dict:
            target = work / "model.int8.onnx"
            if scheme == "static":
                quantize_static_calibrated(prepared, target, work, read_split(task, "dev", args.data)[:128])
            elif scheme:
                quantize_scheme(prepared, target, scheme)
            else:
                quantize_dynamic(str(prepared), str(target), weight_type=QuantType.QInt8, per_channel=True,
                                 nodes_to_exclude=excluded)
            predictor = Predictor(work, runtime="onnx-int8", threads=args.threads)
            began = time.perf_counter()
            found = predictions(predictor(documents))
            seconds = time.perf_counter() - began
            row = {**({"scheme": scheme, "int8_nodes": quantised_nodes(target)} if scheme
                      else {"keep_fp32": keep, "nodes_kept_fp32": len(excluded)}), "smooth": alpha,
                   "smooth_inputs": inputs if alpha is not None else None,
                   "share_of_pytorch": round(len(found & reference) / max(1, len(reference)), 4),
                   "added": len(found - reference), "seconds": round(seconds, 2),
                   "records_per_s": round(len(documents) / seconds, 1)}
            print(json.dumps(row), flush=True)
            return row

        settings = [(None, "all")] + [(a, inputs) for a in args.smooth for inputs in args.smooth_inputs]
        for alpha, inputs in settings:
            prepared = prepare(alpha, inputs)
            if args.schemes:
                rows += [measure("none", [], scheme) for scheme in args.schemes]
            elif args.greedy is None:
                rows += [measure(keep, excluded_nodes(prepared, keep)) for keep in args.keep]
            else:
                rows += greedy(prepared, measure, args.greedy, args.rounds)
    record = {"model": args.model, "export": args.export, "task": task.name, "split": args.split,
              "records": len(documents),
              "pytorch_predictions": len(reference), "threads": args.threads, "cpu": cpu_line(), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
