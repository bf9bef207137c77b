"""Which int8 activation scheme could keep 99% of a student's entities? Simulated in PyTorch, before building a graph.

    python bench/research/int8_fakequant.py runs/demo/study/ncbi_disease/distilled/seed-1/model --task ncbi_disease \
        --schemes per-tensor per-token per-token,classifier=fp32 "per-tensor,layer.0.=fp32" \
        --smooth 0.5 0.7 --out docs/results/int8-fakequant.json

Every `nn.Linear` of the model runs on fake-quantised operands (quantised to int8/uint8 and back to float): weights
symmetric int8 with one scale per output channel, as `export --int8` quantises them; activations by the scheme's
rule, at run time, per batch:

- `per-tensor`: ONNX Runtime's `DynamicQuantizeLinear` — uint8, one scale and zero point for the whole batch tensor
  (what the shipped int8 graph does);
- `per-token`: uint8 with a scale and zero point per token (row), the granularity ONNX Runtime's dynamic kernels lack;
- `per-token-sym`: int8 symmetric per token (zero point fixed);
- `fp32`: not quantised.

A scheme is `BASE[,PATTERN=RULE...]`: the base rule, then rules for the layers whose module name contains PATTERN
(the last match wins; e.g. `per-tensor,layer.0.=fp32,classifier=fp32`). `--smooth ALPHA` adds SmoothQuant's
migration (Xiao et al. 2023, eq. 4: s_j = max|X_j|^α / max|W_j|^(1−α), X/s and W·s) to each scheme, with the
channel maxima read on the task's first 200 dev sentences; `--smooth-mode shared` gives the Linears that read one
input one migration (as a graph must), `foldable` migrates only those a LayerNorm feeds (what folds into weights).
Printed per scheme: the share of the fp32 model's test entities (or labels) the simulated model keeps, and the
predictions it adds. The simulation leaves out what the
graph does differently (fused attention's softmax and GELU kernels, int8 embedding tables, ONNX Runtime's
rounding); on this project's demo student it reads 96.4% for `per-tensor` where the graph itself reads 96.9%
(`bench/research/int8_layers.py`), so shares within half a point of a target do not settle it.
"""

import argparse
import json
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from int8_layers import predictions

from biodistil import Predictor
from biodistil.export.predict import Document
from biodistil.tasks.registry import get_task
from biodistil.tasks.splits import read_split
from biodistil.training.machine import cpu_line


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the fine-tuned PyTorch model folder")
    parser.add_argument("--task", required=True, help="built-in task name or task YAML")
    parser.add_argument("--data", help="data folder (default: the task's own)")
    parser.add_argument("--schemes", nargs="+", default=["per-tensor", "per-token", "per-token-sym"])
    parser.add_argument("--smooth", nargs="*", type=float, default=[], metavar="ALPHA",
                        help="also run every scheme with SmoothQuant's migration at these α")
    parser.add_argument("--smooth-mode", choices=("each", "shared", "foldable"), default="each",
                        help="each: every Linear its own migration; shared: one per input (Q, K and V share theirs); "
                        "foldable: shared, and only for Linears fed by a LayerNorm (what folds into its weights)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="also write the record as JSON")
    return parser.parse_args(argv)


def weight_int8(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric int8, one scale per output channel (row of an `nn.Linear` weight), back to float."""
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    return (weight / scale).round().clamp(-127, 127) * scale


def uint8_affine(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """uint8 with the range [min(low, 0), max(high, 0)] (zero exactly representable, as DynamicQuantizeLinear)."""
    low, high = low.clamp(max=0), high.clamp(min=0)
    scale = ((high - low) / 255).clamp(min=1e-12)
    zero = (-low / scale).round()
    return ((x / scale).round() + zero).clamp(0, 255).sub(zero) * scale


def activation(x: torch.Tensor, rule: str) -> torch.Tensor:
    if rule == "per-tensor":
        return uint8_affine(x, x.amin(), x.amax())
    if rule == "per-token":
        return uint8_affine(x, x.amin(-1, keepdim=True), x.amax(-1, keepdim=True))
    if rule == "per-token-sym":
        scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
        return (x / scale).round().clamp(-127, 127) * scale
    if rule == "fp32":
        return x
    raise SystemExit(f"unknown activation rule {rule!r}: per-tensor, per-token, per-token-sym or fp32")


def rule_for(scheme: str) -> Callable[[str], str]:
    base, *overrides = scheme.split(",")
    pairs = [override.split("=", 1) for override in overrides]

    def rule(name: str) -> str:
        chosen = base
        for pattern, value in pairs:
            if pattern in name:
                chosen = value
        return chosen
    return rule


@contextmanager
def fake_quantised(model: torch.nn.Module, rule: Callable[[str], str], maxima: dict[str, torch.Tensor] | None,
                   alpha: float, inputs: dict[str, tuple[int, bool]] | None = None, mode: str = "each"):
    """Every `nn.Linear` of `model` runs on fake-quantised operands while inside; with `maxima`, after SmoothQuant's
    migration: each Linear its own (`each`), or one per input (`shared`: the largest |W| per column over the Linears
    that read it, as a graph folding the migration needs), or that only where a LayerNorm feeds the input
    (`foldable`); `inputs` (from `linear_inputs`) says which Linears share an input and which a LayerNorm feeds."""
    linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    column_max, smoothed = migration_plan(linears, inputs, mode)
    originals = {}
    for name, module in linears.items():
        if rule(name) != "fp32":
            def forward(x, module=module, name=name):
                weight = module.weight
                if maxima is not None and name in smoothed:
                    migration = (maxima[name].clamp(min=1e-5) ** alpha
                                 / column_max[name].clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)
                    x, weight = x / migration, weight * migration
                return torch.nn.functional.linear(activation(x, rule(name)), weight_int8(weight), module.bias)
            originals[module] = module.forward
            module.forward = forward
    try:
        yield
    finally:
        for module, forward in originals.items():
            module.forward = forward


def migration_plan(linears: dict[str, torch.nn.Linear], inputs: dict[str, tuple[int, bool]] | None,
                   mode: str) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Per Linear, the max |W| per input column its migration divides by (`shared`/`foldable`: over every Linear
    reading the same input), and the Linears migrated (`foldable`: those a LayerNorm feeds)."""
    column_max = {name: module.weight.detach().abs().amax(0) for name, module in linears.items()}
    if mode != "each":
        for key in {key for key, _ in inputs.values()}:
            sharing = [name for name, (other, _) in inputs.items() if other == key]
            shared = torch.stack([column_max[name] for name in sharing]).amax(0)
            column_max.update(dict.fromkeys(sharing, shared))
    return column_max, {name for name in linears if mode != "foldable" or inputs.get(name, (None, False))[1]}


def channel_maxima(predictor: Predictor, documents: list[Document]) -> dict[str, torch.Tensor]:
    """Each `nn.Linear` input's largest |value| per channel over `documents`."""
    maxima: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in predictor.model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def record(_module, inputs, _output, name=name):
                seen = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0)
                maxima[name] = torch.maximum(maxima.get(name, seen), seen)
            hooks.append(module.register_forward_hook(record))
    predictor(documents)
    for hook in hooks:
        hook.remove()
    return maxima


def linear_inputs(model: torch.nn.Module, run: Callable[[], object]) -> dict[str, tuple[int, bool]]:
    """For each `nn.Linear`, during one `run()`: which tensor it reads (Linears reading the same tensor share a key)
    and whether a LayerNorm produced it."""
    found: dict[str, tuple[int, bool]] = {}
    normalised: set[int] = set()
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm):
            hooks.append(module.register_forward_hook(lambda _m, _i, output: normalised.add(output.data_ptr())))
        elif isinstance(module, torch.nn.Linear):
            def record(_module, inputs, _output, name=name):
                found.setdefault(name, (inputs[0].data_ptr(), inputs[0].data_ptr() in normalised))
            hooks.append(module.register_forward_hook(record))
    run()
    for hook in hooks:
        hook.remove()
    return found


def main() -> int:
    args = parse()
    task = get_task(args.task)
    documents = [Document.of(example) for example in read_split(task, "test", args.data)]
    predictor = Predictor(args.model, runtime="pytorch", threads=args.threads)
    reference = predictions(predictor(documents))
    maxima = inputs = None
    if args.smooth:
        dev = [Document.of(e) for e in read_split(task, "dev", args.data)[:200]]
        maxima = channel_maxima(predictor, dev)
        inputs = linear_inputs(predictor.model, lambda: predictor(dev[:1]))
    rows = []
    for alpha in [None, *args.smooth]:
        for scheme in args.schemes:
            with fake_quantised(predictor.model, rule_for(scheme), None if alpha is None else maxima, alpha or 0.0,
                                inputs, args.smooth_mode):
                found = predictions(predictor(documents))
            row = {"scheme": scheme, "smooth_alpha": alpha, "smooth_mode": None if alpha is None else args.smooth_mode,
                   "share_of_pytorch": round(len(found & reference) / max(1, len(reference)), 4),
                   "added": len(found - reference)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    record = {"model": args.model, "task": task.name, "records": len(documents),
              "pytorch_predictions": len(reference), "cpu": cpu_line(), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
