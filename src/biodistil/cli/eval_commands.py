"""Evaluation commands: evaluate, report, bench (registered by `register`)."""

import argparse
from pathlib import Path

from biodistil.cli.common import RECIPE_HELP, recipe_overrides
from biodistil.errors import BiodistilError


def _evaluate(args: argparse.Namespace) -> object:
    from biodistil.config import load_recipe
    from biodistil.evaluation.recipe import EvaluateRecipe
    from biodistil.evaluation.runner import run_evaluate

    overrides = recipe_overrides(args) + ([f"data.root={args.data}"] if args.data else [])
    recipe = load_recipe(EvaluateRecipe, args.recipe, overrides)
    return run_evaluate(recipe, resume=args.resume)


def _report(args: argparse.Namespace) -> object:
    from biodistil.evaluation.report import build_report

    return build_report([Path(r) for r in args.runs], Path(args.out) if args.out else None,
                        [Path(b) for b in args.bench], args.reference)


def parse_model_spec(spec: str) -> tuple[str | None, str]:
    """`NAME=PATH` or `PATH` → (name or None, path)."""
    name, sep, path = spec.partition("=")
    if not sep:
        return None, spec
    if not name or not path:
        raise BiodistilError(f"bench: model '{spec}' must be PATH, HUB_ID or NAME=PATH")
    return name, path


def _bench(args: argparse.Namespace) -> object:
    from biodistil.config import validate_recipe
    from biodistil.evaluation.bench import format_bench, run_bench, write_bench
    from biodistil.evaluation.recipe import BenchConfig, unique_labels

    specs = [parse_model_spec(s) for s in args.models]
    try:
        labels = unique_labels(specs)
    except ValueError as err:
        raise BiodistilError(f"bench: {err} (use NAME=PATH)") from None
    raw = {"lengths": args.lengths, "latency_batch": args.latency_batch, "throughput_batch": args.throughput_batch,
           "warmup": args.warmup, "repeats": args.repeats, "device": args.device, "threads": args.threads}
    cfg = validate_recipe(BenchConfig, raw, source="bench options")
    result = run_bench(list(zip(labels, [path for _, path in specs], strict=True)), cfg)
    path = write_bench(result, Path(args.out))
    return f"{format_bench(result)}\n\nWrote {path} (pass it to `biodistil report RUN --bench {path}`)."


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    text = ("Fine-tune every model of the recipe on every task for N seeds (early stopping on dev), write "
            "predictions and metrics per (model, task, seed[, fold]), then the report")
    parser = sub.add_parser("evaluate", help=text, description=text + ". Example: biodistil evaluate "
                            "recipes/eval-quick.yaml models=[runs/demo/teacher/model,runs/demo/student/model]")
    parser.add_argument("recipe", help=RECIPE_HELP)
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="recipe overrides, e.g. models=[a,b] tasks=[gad] num_seeds=1")
    parser.add_argument("--out", help="run folder (same as run.output_dir=...)")
    parser.add_argument("--data", help="data folder (same as data.root=...)")
    parser.add_argument("--resume", action="store_true", help="continue a run folder: finished cells are skipped")
    parser.set_defaults(run=_evaluate)


def _add_report(sub: argparse._SubParsersAction) -> None:
    text = "Build report.md, report.html and figures from evaluation run folders (and bench JSON files)"
    parser = sub.add_parser("report", help=text, description=text)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="output folders of `biodistil evaluate`")
    parser.add_argument("--out", help="folder for the report (default: the first RUN)")
    parser.add_argument("--bench", nargs="*", default=[], metavar="FILE", help="JSON files of `biodistil bench`")
    parser.add_argument("--reference", help="reference model name (default: the first run's reference)")
    parser.set_defaults(run=_report)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    text = ("Parameters, size on disk, latency, throughput and peak memory of models, measured side by side "
            "in one process")
    parser = sub.add_parser("bench", help=text, description=text + ". The first model is the reference of the "
                            "speedups.")
    parser.add_argument("models", nargs="+", metavar="MODEL", help="model folder or Hub id, or NAME=PATH")
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 512], help="sequence lengths (128 512)")
    parser.add_argument("--latency-batch", type=int, default=1, help="batch size of the latency runs (1)")
    parser.add_argument("--throughput-batch", type=int, default=32, help="batch size of the throughput runs (32)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per model and setting (2)")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per model and setting (10)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--out", default="bench.json", help="JSON output file (bench.json)")
    parser.set_defaults(run=_bench)


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the `biodistil` parser."""
    _add_evaluate(sub)
    _add_report(sub)
    _add_bench(sub)
