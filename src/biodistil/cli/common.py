"""Helpers shared by the command modules: the `COMMAND RECIPE.yaml [key=value ...]` shape."""

import argparse
from collections.abc import Callable

RECIPE_HELP = "YAML recipe (see recipes/); later `key.sub=value` arguments override its values"


def add_recipe_command(sub, name: str, help_text: str, runner: Callable[[argparse.Namespace], object],
                       resume: bool = True, stop_after: bool = True) -> argparse.ArgumentParser:
    """A subcommand taking a recipe, overrides, --out and (where the command has them) --resume and --stop-after;
    `runner(args)` runs it."""
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("recipe", help=RECIPE_HELP)
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="recipe overrides")
    parser.add_argument("--out", help="run folder (same as run.output_dir=...)")
    if resume:
        parser.add_argument("--resume", action="store_true",
                            help="continue from the run folder's latest checkpoint (a run that stopped before its "
                            "first checkpoint starts again)")
    if stop_after:
        parser.add_argument("--stop-after", type=int, metavar="STEP",
                            help="checkpoint and stop at this step (resume later with --resume)")
    parser.set_defaults(run=runner, resume=False, stop_after=None, continue_flag="--resume" if resume else None)
    return parser


def recipe_overrides(args: argparse.Namespace) -> list[str]:
    """The command line's `key.sub=value` overrides, with `--out DIR` as `run.output_dir=DIR`."""
    return [*args.overrides, *([f"run.output_dir={args.out}"] if args.out else [])]


def run_recipe(recipe_cls: type, runner: Callable[..., object], args: argparse.Namespace) -> object:
    """Load the command's recipe (with overrides) and run it with the shared --resume / --stop-after flags."""
    from biodistil.config import load_recipe

    recipe = load_recipe(recipe_cls, args.recipe, recipe_overrides(args))
    return runner(recipe, resume=args.resume, stop_after=args.stop_after)


def positive_int(value: str) -> int:
    """A whole number of 1 or more (--batch-size, --max-length, --threads)."""
    if value.strip().isdigit() and int(value) >= 1:
        return int(value)
    raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {value!r}")


def probability(value: str) -> float:
    """A number from 0 to 1 (--threshold, --int8-fallback, --max-padding)."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if 0 <= number <= 1:
        return number
    raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {value!r}")


def processes_value(value: str) -> int | str:
    """`--processes N|auto` (study, evaluate): a whole number of worker processes, or auto."""
    if value == "auto" or (value.isdigit() and int(value) >= 1):
        return value if value == "auto" else int(value)
    raise argparse.ArgumentTypeError(f"expected a whole number of processes (1 or more) or auto, got {value!r}")
