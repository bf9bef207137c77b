"""What one int8 matmul costs in ONNX Runtime by how its activations are quantised, against fp32, at one thread.

    python bench/research/int8_kernels.py --out docs/results/int8-kernels.json

One `x[1, M, K] @ W[K, N]` graph per way (M = 2,560 tokens: a batch of 64 sentences of 40; the demo student's FFN
shapes 384 → 1,536 and 1,536 → 384), timed in the same process on the same input:

- `fp32`: ONNX Runtime's MatMul;
- `per-tensor`: `export --int8`'s per-channel scheme (its `quantize_scheme`: per-channel int8 weights, activations
  by `DynamicQuantizeLinear`, which ONNX Runtime fuses into `DynamicQuantizeMatMul`) — what `export --int8` ships;
- `per-token`: symmetric int8 activations with one scale per token, written with ONNX operators (Abs, ReduceMax,
  Div, Round, Add, Cast, then `MatMulInteger` and the two scales; ONNX Runtime has no dynamic per-row kernel);
  `per-token-fused`: the same with the output scaling in `com.microsoft.MatMulIntegerToFloat`;
- `blockwise-B`: `MatMulNBits` at 8 bits, blocks of B along K, activations quantised per block at run time
  (accuracy level 4) — `export --int8-scheme blockwise` (its `quantize_scheme`) at B = 128.

Printed per way and shape: milliseconds per call (median of `--repeats`), speed against fp32, and the largest
absolute difference from fp32's output.
"""

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from biodistil.export.onnx import BLOCK_SIZE, quantize_scheme
from biodistil.training.machine import cpu_line


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2560)
    parser.add_argument("--shapes", nargs="+", default=["384x1536", "1536x384"], help="KxN per shape")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="also write the record as JSON")
    return parser.parse_args(argv)


def graph(nodes: list, initializers: list, k: int, opset: int = 21) -> onnx.ModelProto:
    body = helper.make_graph(nodes, "matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, k])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(body, opset_imports=[helper.make_opsetid("", opset),
                                                  helper.make_opsetid("com.microsoft", 1)])


def per_token(weight: np.ndarray, fused: bool) -> onnx.ModelProto:
    """Symmetric int8 per token as uint8 around a zero point of 128, weights symmetric int8 per column."""
    scales = np.abs(weight).max(0) / 127
    quantised = np.round(weight / scales).clip(-127, 127).astype(np.int8)
    nodes = [helper.make_node("Abs", ["x"], ["magnitude"]),
             helper.make_node("ReduceMax", ["magnitude", "last"], ["largest"], keepdims=1),
             helper.make_node("Mul", ["largest", "inverse_127"], ["scale"]),
             helper.make_node("Div", ["x", "scale"], ["scaled"]), helper.make_node("Round", ["scaled"], ["rounded"]),
             helper.make_node("Add", ["rounded", "offset"], ["shifted"]),
             helper.make_node("Cast", ["shifted"], ["xq"], to=TensorProto.UINT8)]
    if fused:
        nodes += [helper.make_node("MatMulIntegerToFloat", ["xq", "wq", "one", "w_scale", "zero"], ["unscaled"],
                                   domain="com.microsoft"),
                  helper.make_node("Mul", ["unscaled", "scale"], ["y"])]
    else:
        nodes += [helper.make_node("MatMulInteger", ["xq", "wq", "zero"], ["integer"]),
                  helper.make_node("Cast", ["integer"], ["unscaled"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["unscaled", "scale"], ["row_scaled"]),
                  helper.make_node("Mul", ["row_scaled", "w_scale"], ["y"])]
    constants = {"last": np.array([-1], np.int64), "inverse_127": np.float32(1 / 127), "offset": np.float32(128),
                 "wq": quantised, "zero": np.uint8(128), "w_scale": scales.astype(np.float32),
                 **({"one": np.float32(1)} if fused else {})}
    return graph(nodes, [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()], weight.shape[0])


def variants(weight: np.ndarray, scratch: Path) -> dict[str, onnx.ModelProto]:
    """The graphs of every way; the shipped ones quantised by the export's own `quantize_scheme`."""
    k = weight.shape[0]
    plain = graph([helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(weight, "w")], k, 17)
    onnx.save(plain, scratch / "fp32.onnx")

    def quantised(scheme: str, block_size: int = BLOCK_SIZE) -> onnx.ModelProto:
        target = scratch / f"{scheme}-{block_size}.onnx"
        quantize_scheme(scratch / "fp32.onnx", target, scheme, block_size)
        return onnx.load(target)

    return {"fp32": plain, "per-tensor": quantised("per-channel"),  # per-channel weights, per-tensor activations
            "per-token": per_token(weight, fused=False), "per-token-fused": per_token(weight, fused=True),
            **{f"blockwise-{block}": quantised("blockwise", block) for block in (32, 128)}}


def timed(model: onnx.ModelProto, x: np.ndarray, threads: int, repeats: int) -> tuple[float, np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    output = session.run(None, {"x": x})[0]
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3, output


def main() -> int:
    args = parse()
    logging.disable(logging.INFO)  # the quantisers' per-tensor chatter
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-kernels-") as scratch:
        for shape in args.shapes:
            k, n = (int(v) for v in shape.split("x"))
            weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
            x = rng.standard_normal((1, args.tokens, k)).astype(np.float32)
            baseline = None
            for name, model in variants(weight, Path(scratch)).items():
                ms, output = timed(model, x, args.threads, args.repeats)
                baseline = baseline or (ms, output)
                row = {"shape": f"{args.tokens}x{k} @ {k}x{n}", "way": name, "ms": round(ms, 2),
                       "speed_vs_fp32": round(baseline[0] / ms, 2),
                       "max_abs_diff": float(np.abs(output - baseline[1]).max())}
                print(json.dumps(row), flush=True)
                rows.append(row)
    record = {"threads": args.threads, "onnxruntime": onnxruntime.__version__, "cpu": cpu_line(), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
