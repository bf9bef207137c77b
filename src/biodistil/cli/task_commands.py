"""Task-specific commands: finetune, kd, transfer and study (registered by `register`)."""

import argparse
from pathlib import Path

from biodistil.cli.common import add_recipe_command, processes_value, recipe_overrides, run_recipe

# sections of kd recipes that `transfer` ignores, so that `biodistil transfer KD_RECIPE` builds the kd run's set
_NOT_TRANSFER = ("teacher", "student", "kd", "meta", "train", "export")


def _finetune(args: argparse.Namespace) -> object:
    from biodistil.finetune.command import FinetuneRecipe, run_finetune

    return run_recipe(FinetuneRecipe, run_finetune, args)


def _kd(args: argparse.Namespace) -> object:
    from biodistil.kd.command import run_kd
    from biodistil.kd.recipe import KDRecipe

    return run_recipe(KDRecipe, run_kd, args)


def _transfer(args: argparse.Namespace) -> object:
    from pydantic import ConfigDict

    from biodistil.config import Section, load_recipe, validate_recipe
    from biodistil.errors import BiodistilError
    from biodistil.kd.recipe import TransferRecipe
    from biodistil.kd.transfer import run_transfer

    class AnySections(Section):
        model_config = ConfigDict(extra="allow")

    if args.resume or args.stop_after is not None:
        raise BiodistilError("transfer builds its set in one go: --resume and --stop-after do not apply")
    raw = load_recipe(AnySections, args.recipe, recipe_overrides(args)).model_extra or {}
    kept = {key: value for key, value in raw.items() if key not in _NOT_TRANSFER}
    return run_transfer(validate_recipe(TransferRecipe, kept, source=str(args.recipe)))


def _study(args: argparse.Namespace) -> object:
    from biodistil.config import load_recipe
    from biodistil.errors import BiodistilError
    from biodistil.kd.recipe import StudyRecipe
    from biodistil.kd.study import run_study

    if args.stop_after is not None:
        raise BiodistilError("study: --stop-after does not apply (interrupt it and continue with --resume)")
    recipe = load_recipe(StudyRecipe, args.recipe, recipe_overrides(args))
    return run_study(recipe, resume=args.resume, processes=args.processes, from_records=args.from_records)


def _pack_study(args: argparse.Namespace) -> object:
    from biodistil.kd.study_records import pack_study

    packed = pack_study(args.folder, args.out)
    groups = ", ".join(f"{name} {count}" for name, count in packed.items() if "/" in name)
    print(f"{args.out}: the records of {packed['runs']} finished run(s) ({packed['unfinished']} unfinished left out: "
          f"they run again), {packed['bytes'] / 1e6:.1f} MB; continue the study elsewhere with `biodistil study "
          f"RECIPE --from-records {args.out}`" + (f"\nFinished: {groups}" if groups else ""))
    return args.out


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the `biodistil` parser."""
    add_recipe_command(sub, "finetune", "Fine-tune an encoder on a task of the task registry (teacher, student or "
                       "baseline); save a Hugging Face model, metrics.json and test predictions", _finetune,
                       stop_after=False)
    add_recipe_command(sub, "kd", "Task-specific distillation: train a student on a fine-tuned teacher's outputs "
                       "over a transfer set (Hinton, logit MSE, sigmoid, PatientKD, MetaDistil, MetaAdaptiveKD)", _kd)
    add_recipe_command(sub, "transfer", "Build a transfer set (in-domain, another task, a file, text or randomized) "
                       "and save it as a datasets folder; accepts a kd recipe", _transfer, resume=False,
                       stop_after=False)
    study = add_recipe_command(sub, "study", "Run a study recipe: teachers, finetune/kd arms over seeds, and a "
                               "summary with mean scores and the gap closed", _study, stop_after=False)
    study.add_argument("--processes", type=processes_value, default=1, metavar="N|auto",
                       help="run the arm × seed runs N at a time in worker processes of this machine, the cores "
                       "shared between them (auto: one per idle core on a CPU machine; default 1: one after another)")
    study.add_argument("--from-records", type=Path, metavar="RECORDS",
                       help="continue a study from the records `biodistil pack-study` wrote (a .tar.gz or a folder; on "
                       "another machine, say), "
                       "in a new output folder: finished runs are kept; a teacher a remaining run needs is fine-tuned "
                       "again and used only if its weights are the recorded ones to the bit")
    pack = sub.add_parser("pack-study", help="Pack a study's finished records, without weights, to continue it on "
                          "another machine", description="Write the records of a study's finished runs and teachers "
                          "(recipes, metrics, predictions, reports; no weights or checkpoints) into one .tar.gz, to "
                          "continue the study elsewhere with `biodistil study RECIPE --from-records FILE`. Safe "
                          "while the study runs: unfinished runs are left out.")
    pack.add_argument("folder", type=Path, metavar="DIR", help="the study's folder (its run.output_dir)")
    pack.add_argument("--out", type=Path, required=True, metavar="OUT",
                      help="a .tar.gz to write, or a folder of the same files (what a git repository keeps best)")
    pack.set_defaults(run=_pack_study)
