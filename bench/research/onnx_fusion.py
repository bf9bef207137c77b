"""Fused ONNX graphs and int8 against PyTorch, side by side, on a fine-tuned teacher and its student (issue 22).

    python bench/research/onnx_fusion.py TEACHER_MODEL STUDENT_MODEL --out DIR [--threads 1] [--lengths 128 512]
        [--repeats 10] [--warmup 2] [--task ncbi_disease --split dev] [--unfused]

TEACHER_MODEL and STUDENT_MODEL are fine-tuned model folders (e.g. the `model/` of `biodistil finetune` runs). Each is
exported into DIR (`biodistil export --int8`: the fp32 graph, fused where ONNX Runtime's transformer optimizer
supports the family, and the int8 graph its accuracy gate picks: with --task on that task's split, else by logit
drift), unless DIR already holds the export. The script prints the CPU's model and flags, the thread count, each
export's fused-node counts and int8 choice, then one `biodistil bench` run of PyTorch fp32, ONNX fp32 and ONNX int8 of
both models (timings round robin in this process; peak memory in a fresh process per model and shape, see
`biodistil.evaluation.bench`) as side-by-side tables with ratios against the PyTorch fp32 teacher and against each
model's own PyTorch fp32, and the issue's targets. `--unfused` adds the student's unfused graph (`--no-fuse`), to see
what the fusion itself brings. Timings are the machine's: no test asserts on them. The last line is JSON.
"""

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from biodistil.evaluation.bench import run_bench, side_by_side
from biodistil.evaluation.recipe import BenchConfig
from biodistil.export.command import ExportOptions, run_export
from biodistil.export.fusion import format_fusion
from biodistil.export.runtime import VARIANT_FILES, is_export_folder, read_description
from biodistil.training.machine import cpu_info

SHOWN_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teacher", help="fine-tuned teacher model folder")
    parser.add_argument("student", help="fine-tuned student model folder")
    parser.add_argument("--out", required=True, help="folder of the exports (reused when already there)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--task", help="the int8 gate's task (its split: --split); without it, the smaller drift")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--unfused", action="store_true", help="also bench the student's unfused graph")
    return parser.parse_args()


def exported(model: str, folder: Path, args: argparse.Namespace, fuse: bool = True) -> dict[str, Any]:
    """The export's description, exporting first when the folder holds none."""
    if not is_export_folder(folder):
        options = ExportOptions(int8=True, fuse=fuse, task=args.task, split=args.split)
        run_export(model, folder, options)
    return read_description(folder)


def models_to_bench(args: argparse.Namespace, exports: dict[str, Path]) -> list[tuple[str, str]]:
    """(label, path) rows: each model in PyTorch fp32, then its exported graphs."""
    rows = []
    for name, source in (("teacher", args.teacher), ("student", args.student)):
        rows.append((name, source))
        for key in [k for k in exports if k.startswith(name)]:
            files = read_description(exports[key])["files"]
            rows += [(f"{key}-{variant}", str(exports[key] / VARIANT_FILES[variant])) for variant in files]
    return rows


def targets(result: dict[str, Any], lengths: list[int]) -> list[str]:
    """The issue's targets, each figure with its verdict."""
    rows = {row["label"]: row for row in result["models"]}
    lines = []

    def ratio(label: str, ref: str, kind: str, length: str, key: str, inverse: bool) -> float | None:
        mine, base = rows[label][kind][length].get(key), rows[ref][kind][length].get(key)
        return None if not mine or not base else (base / mine if inverse else mine / base)

    for length in map(str, lengths):
        for model in ("teacher", "student"):
            fp32 = f"{model}-onnx-fp32"
            checks = [("batch-32 throughput ×", ratio(fp32, model, "throughput", length, "sequences_per_s", False), 1),
                      ("batch-1 speed ×", ratio(fp32, model, "latency", length, "median_ms", True), 1),
                      ("peak memory at batch 32 ÷", ratio(model, fp32, "throughput", length, "peak_memory_bytes",
                                                          False), 1)]
            lines += [_verdict(f"length {length}: {model} ONNX fp32 vs PyTorch fp32, {text}", value, goal)
                      for text, value, goal in checks]
        int8 = "student-onnx-int8"
        if int8 in rows:
            lines.append(_verdict(f"length {length}: student int8 vs PyTorch teacher, batch-1 speed ×",
                                  ratio(int8, "teacher", "latency", length, "median_ms", True), 5))
            lines.append(_verdict(f"length {length}: student int8 vs PyTorch teacher, batch-32 throughput ×",
                                  ratio(int8, "teacher", "throughput", length, "sequences_per_s", False), 3))
    return lines


def _verdict(text: str, value: float | None, goal: float) -> str:
    if value is None:
        return f"{text} n/a"
    return f"{text} {value:.2f} (target ≥ {goal:g}: {'met' if value >= goal else 'NOT met'})"


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    model, flags = cpu_info()
    print(f"CPU: {model}; flags: {' '.join(f for f in SHOWN_FLAGS if f in (flags or []))}")
    print(f"threads: {args.threads} (torch, and ONNX Runtime's intra-op threads)")
    exports = {"teacher-onnx": out / "teacher-onnx", "student-onnx": out / "student-onnx"}
    if args.unfused:
        exports["student-unfused"] = out / "student-unfused"
    descriptions = {}
    for key, folder in exports.items():
        source = args.teacher if key.startswith("teacher") else args.student
        descriptions[key] = exported(source, folder, args, fuse=key != "student-unfused")
        quantization = descriptions[key]["quantization"] or {}
        print(f"{key}: {format_fusion(descriptions[key]['fusion'])}; int8: {quantization.get('choice')}")
    cfg = BenchConfig(lengths=args.lengths, warmup=args.warmup, repeats=args.repeats, device="cpu",
                      threads=args.threads)
    result = run_bench(models_to_bench(args, exports), cfg)
    labels = [row["label"] for row in result["models"]]
    print(f"\nPeak memory: {result['memory_method']}.\n\nAgainst the PyTorch fp32 teacher:")
    print("\n".join(side_by_side(result, "teacher")))
    print("\nAgainst the PyTorch fp32 student:")
    print("\n".join(side_by_side(result, "student", [label for label in labels if label.startswith("student")])))
    print("\nTargets (issue 22):")
    print("\n".join(targets(result, args.lengths)))
    fused = {key: d["fusion"] for key, d in descriptions.items()}
    print(json.dumps({"cpu": model, "flags": [f for f in SHOWN_FLAGS if f in (flags or [])], "threads": args.threads,
                      "fusion": fused, "bench": result}))


if __name__ == "__main__":
    main()
