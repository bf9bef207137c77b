"""`biodistil <command> RECIPE.yaml [key.sub=value ...]`."""

import argparse
import os
import sys
from collections.abc import Callable

from biodistil.errors import BiodistilError

RECIPE_HELP = "YAML recipe (see recipes/); later `key.sub=value` arguments override its values"


def _recipe_command(sub, name: str, help_text: str, runner: Callable[[argparse.Namespace], object]) -> None:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("recipe", help=RECIPE_HELP)
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="recipe overrides")
    parser.add_argument("--out", help="run folder (same as run.output_dir=...)")
    parser.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    parser.add_argument("--stop-after", type=int, metavar="STEP",
                        help="checkpoint and stop at this step (resume later with --resume)")
    parser.set_defaults(run=runner)


def _overrides(args: argparse.Namespace) -> list[str]:
    return [*args.overrides, *([f"run.output_dir={args.out}"] if args.out else [])]


def _pretrain(args: argparse.Namespace) -> object:
    from biodistil.config import PretrainRecipe, load_recipe
    from biodistil.methods.task_agnostic import run_pretrain

    recipe = load_recipe(PretrainRecipe, args.recipe, _overrides(args))
    return run_pretrain(recipe, resume=args.resume, stop_after=args.stop_after)


def _distill(args: argparse.Namespace) -> object:
    from biodistil.config import DistillRecipe, load_recipe
    from biodistil.methods.task_agnostic import run_distill

    recipe = load_recipe(DistillRecipe, args.recipe, _overrides(args))
    return run_distill(recipe, resume=args.resume, stop_after=args.stop_after)


def _demo(args: argparse.Namespace) -> object:
    from biodistil.demo import run_demo

    return run_demo(args.out, data=args.data, quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="biodistil",
        description="Distil large biomedical language models into small, fast students, and prove they still work.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _recipe_command(sub, "pretrain", "MLM pre-training: from scratch with a corpus vocabulary, or continual", _pretrain)
    _recipe_command(sub, "distill", "Task-agnostic distillation of a masked-LM teacher into a student", _distill)
    demo = sub.add_parser(
        "demo", help="Offline end-to-end demo: pre-train a teacher, distil, fine-tune on NCBI-disease, report",
        description="Offline demo on 2 CPU cores: pre-trains a small teacher on corpus/biomed.txt, distils it into "
        "a half-depth student, fine-tunes teacher, student and a same-size baseline on NCBI-disease, and writes "
        "DIR/report.md and DIR/report.json.",
    )
    demo.add_argument("--out", required=True, help="output folder")
    demo.add_argument("--data", help="data folder (default: $BIODISTIL_DATA, else ../shared/data beside the repo)")
    demo.add_argument("--quick", action="store_true", help="a few steps of everything (a smoke test, minutes)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args)
    except BiodistilError as err:
        print(f"biodistil {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("Interrupted; continue with --resume.", file=sys.stderr)
        return 130
    if result is not None and os.environ.get("LOCAL_RANK", "0") == "0":
        print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
