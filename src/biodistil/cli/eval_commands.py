"""Evaluation commands: evaluate, report, bench (registered by `register`)."""

import argparse
from pathlib import Path

from biodistil.cli.common import RECIPE_HELP, processes_value, recipe_overrides
from biodistil.errors import BiodistilError


def _evaluate(args: argparse.Namespace) -> object:
    if args.finetuned:
        return _score_finetuned(args)
    if not args.recipe:
        raise BiodistilError("evaluate: give a RECIPE.yaml, or --finetuned MODEL... --task NAME to score models "
                             "without training")
    from biodistil.config import load_recipe
    from biodistil.evaluation.recipe import EvaluateRecipe
    from biodistil.evaluation.runner import run_evaluate

    overrides = recipe_overrides(args) + ([f"data.root={args.data}"] if args.data else [])
    recipe = load_recipe(EvaluateRecipe, args.recipe, overrides)
    return run_evaluate(recipe, resume=args.resume, processes=args.processes)


def _score_finetuned(args: argparse.Namespace) -> object:
    """`evaluate --finetuned`: score fine-tuned models and their ONNX exports without training."""
    from biodistil.config import validate_recipe
    from biodistil.evaluation.finetuned import ScoringPlan, run_scoring
    from biodistil.evaluation.recipe import BenchConfig
    from biodistil.training.run import single_process

    single_process("evaluate --finetuned")
    if args.recipe or args.overrides or args.resume:
        raise BiodistilError("evaluate --finetuned scores models without training: it takes no recipe, overrides "
                             "or --resume")
    if not args.task or not args.out:
        raise BiodistilError("evaluate --finetuned needs --task NAME and --out DIR")
    plan = ScoringPlan(task=args.task, split=args.split, fold=args.fold, max_examples=args.max_examples,
                       data_root=args.data, device=args.device)
    bench = None
    if args.bench:
        bench = validate_recipe(BenchConfig, {"device": "cpu", "threads": args.threads}, source="evaluate --bench")
    report = run_scoring([parse_model_spec(s) for s in args.finetuned], plan, Path(args.out), bench)
    return f"Wrote {report}"


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
    from biodistil.evaluation.recipe import BenchConfig
    from biodistil.export.deployed import expand_models
    from biodistil.training.run import single_process

    single_process("bench")  # timings of copies running side by side would measure each other
    models = [(item.label, str(item.path)) for item in expand_models([parse_model_spec(s) for s in args.models])]
    raw = {"lengths": args.lengths, "latency_batch": args.latency_batch, "throughput_batch": args.throughput_batch,
           "warmup": args.warmup, "repeats": args.repeats, "device": args.device, "threads": args.threads,
           "memory": args.memory}
    cfg = validate_recipe(BenchConfig, raw, source="bench options")
    result = run_bench(models, cfg)
    path = write_bench(result, Path(args.out))
    return f"{format_bench(result)}\n\nWrote {path} (pass it to `biodistil report RUN --bench {path}`)."


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    text = ("Fine-tune every model of the recipe on every task for N seeds (early stopping on dev), write "
            "predictions and metrics per (model, task, seed[, fold]), then the report; or, with --finetuned, score "
            "already fine-tuned models and their ONNX exports on a task without training")
    parser = sub.add_parser("evaluate", help=text, description=text + ". Examples: biodistil evaluate "
                            "recipes/eval-quick.yaml models=[runs/demo/teacher/model,runs/demo/student/model]; "
                            "biodistil evaluate --finetuned student=runs/ner/model student-onnx=runs/ner/onnx "
                            "--task ncbi_disease --out runs/deployed --bench")
    parser.add_argument("recipe", nargs="?", help=RECIPE_HELP)
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="recipe overrides, e.g. models=[a,b] tasks=[gad] num_seeds=1")
    parser.add_argument("--out", help="run folder (same as run.output_dir=...)")
    parser.add_argument("--data", help="data folder (same as data.root=...)")
    parser.add_argument("--resume", action="store_true", help="continue a run folder: finished cells are skipped")
    parser.add_argument("--processes", type=processes_value, default=1, metavar="N|auto",
                        help="fine-tune the cells N at a time in worker processes of this machine, the cores shared "
                        "between them (auto: one per idle core on a CPU machine; default 1: one after another)")
    scoring = parser.add_argument_group("scoring fine-tuned models without training (--finetuned)")
    scoring.add_argument("--finetuned", nargs="+", metavar="MODEL",
                         help="fine-tuned model folders (PyTorch fp32), ONNX export folders (their fp32 and int8 "
                         "graphs; the int8 one named NAME-int8) or .onnx files of an export; NAME=PATH names one")
    scoring.add_argument("--task", help="the task they were fine-tuned on (built-in name or task YAML)")
    scoring.add_argument("--split", choices=["dev", "test"], default="test", help="split to score (test)")
    scoring.add_argument("--fold", type=int, help="cross-validation tasks: the fold")
    scoring.add_argument("--max-examples", type=int, help="score a fixed subset of the split (quick checks)")
    scoring.add_argument("--bench", action="store_true", help="also benchmark them on the CPU (bench.json; the "
                         "report plots score against latency)")
    scoring.add_argument("--threads", type=int, help="CPU threads for torch and ONNX Runtime (default: torch's)")
    scoring.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                         help="where PyTorch models are scored: auto (default) = a CUDA GPU when one is visible; "
                         "ONNX graphs always run on the CPU (ONNX Runtime's CPU provider)")
    parser.set_defaults(run=_evaluate, continue_flag="--resume")


def _add_report(sub: argparse._SubParsersAction) -> None:
    text = "Build report.md, report.html and figures from evaluation run folders (and bench JSON files)"
    parser = sub.add_parser("report", help=text, description=text)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="output folders of `biodistil evaluate`")
    parser.add_argument("--out", help="folder for the report (default: the first RUN)")
    parser.add_argument("--bench", nargs="*", default=[], metavar="FILE", help="JSON files of `biodistil bench`")
    parser.add_argument("--reference", help="reference model name (default: the first run's reference)")
    parser.set_defaults(run=_report)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    text = ("Parameters, size on disk, latency, throughput and peak memory of models (PyTorch folders, ONNX exports), "
            "measured side by side: timings in one process, round robin; peak memory in a fresh process per model "
            "and shape")
    parser = sub.add_parser("bench", help=text, description=text + ". The first model is the reference of the "
                            "speedups.")
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="model folder or Hub id, ONNX export folder (fp32 and int8 graphs) or .onnx file, "
                        "or NAME=PATH")
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 512], help="sequence lengths (128 512)")
    parser.add_argument("--latency-batch", type=int, default=1, help="batch size of the latency runs (1)")
    parser.add_argument("--throughput-batch", type=int, default=32, help="batch size of the throughput runs (32)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per model and setting (2)")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per model and setting (10)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, help="CPU threads for torch and ONNX Runtime (default: torch's)")
    parser.add_argument("--memory", choices=["isolated", "in-process", "off"], default="isolated",
                        help="CPU peak memory: each model and shape in a fresh process (isolated, the default: an "
                        "allocator's arena cannot hide another model's needs), around one run in the timing process "
                        "(in-process), or not at all (off)")
    parser.add_argument("--out", default="bench.json", help="JSON output file (bench.json)")
    parser.set_defaults(run=_bench)


def _score(args: argparse.Namespace) -> object:
    from biodistil.documents.readers import guess_format, read_span_documents
    from biodistil.documents.scoring import character_scores, score_table
    from biodistil.io import atomic_write_json

    gold_format = args.gold_format or args.format or guess_format(args.gold)
    pred_format = args.pred_format or args.format or guess_format(args.predicted)
    gold = read_span_documents(gold_format, args.gold)
    predicted = read_span_documents(pred_format, args.predicted)
    scores = character_scores(gold, predicted, args.types)
    if args.out:
        atomic_write_json(Path(args.out), {"gold": str(args.gold), "predicted": str(args.predicted), **scores})
    return score_table(scores)


def _add_score(sub: argparse._SubParsersAction) -> None:
    text = ("Entity scores at the character level of predicted documents against gold ones (brat folders, PubTator, "
            "BioC or span JSON-lines files): strict (same span and type) and overlap (same type, a shared "
            "character), per type, micro and macro")
    parser = sub.add_parser("score", help=text, description=text + ". Example: biodistil score gold/ predicted/ "
                            "(two brat folders). Documents are matched by id; their texts must be the same.")
    parser.add_argument("gold", help="gold documents: a brat folder or a PubTator / BioC / span JSON-lines file")
    parser.add_argument("predicted", help="predicted documents, in the same or another span format")
    parser.add_argument("--format", choices=["bioc", "brat", "pubtator", "span_jsonl"],
                        help="the format of both (default: from each path: a folder is brat, .pubtator, .xml/.json "
                        "BioC, .jsonl span JSON lines)")
    parser.add_argument("--gold-format", choices=["bioc", "brat", "pubtator", "span_jsonl"])
    parser.add_argument("--pred-format", choices=["bioc", "brat", "pubtator", "span_jsonl"])
    parser.add_argument("--types", nargs="+", help="score these entity types only (default: every type either side "
                        "uses)")
    parser.add_argument("--out", help="also write the scores as JSON here")
    parser.set_defaults(run=_score)


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the `biodistil` parser."""
    _add_evaluate(sub)
    _add_score(sub)
    _add_report(sub)
    _add_bench(sub)
