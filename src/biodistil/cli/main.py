"""`biodistil <command> RECIPE.yaml [key.sub=value ...]`: argparse only; each command calls one function.

    command                          runs                                              recipe
    pretrain, distill, cache-teacher methods.task_agnostic                             config.PretrainRecipe, ...
    pipeline                         pipeline                                          pipeline.PipelineRecipe
    finetune                         finetune.command (task_commands)                  finetune.command
    transfer, kd, study              kd.transfer, kd.command, kd.study (task_commands) kd.recipe
    pack-study                       kd.study_records (task_commands)                  (arguments)
    evaluate                         evaluation.runner; --finetuned: .finetuned        evaluation.recipe
    report, bench                    evaluation.report, evaluation.bench               (arguments)
    export                           export.command (export_commands)                  (arguments)
    predict, serve                   export.predict, serving.command (export_commands) (arguments)
    card                             training.card (export_commands)                   (arguments)
    demo                             demo (demo_quick with --quick)                    demo.study_recipe
"""

import argparse
import os
import re
import shlex
import signal
import sys
import threading
from typing import Any

from safetensors import SafetensorError

from biodistil.cli import eval_commands, export_commands, model_commands, task_commands
from biodistil.cli.common import add_recipe_command, processes_value, recipe_overrides, run_recipe
from biodistil.errors import BiodistilError
from biodistil.training.onednn import bound_caches


def _pretrain(args: argparse.Namespace) -> object:
    from biodistil.config import PretrainRecipe
    from biodistil.methods.task_agnostic import run_pretrain

    return run_recipe(PretrainRecipe, run_pretrain, args)


def _distill(args: argparse.Namespace) -> object:
    from biodistil.config import DistillRecipe
    from biodistil.methods.task_agnostic import run_distill

    return run_recipe(DistillRecipe, run_distill, args)


def _cache_teacher(args: argparse.Namespace) -> object:
    from biodistil.config import DistillRecipe, load_recipe
    from biodistil.methods.task_agnostic import run_cache_teacher

    return run_cache_teacher(load_recipe(DistillRecipe, args.recipe, recipe_overrides(args)))


def _pipeline(args: argparse.Namespace) -> object:
    from biodistil.pipeline import load_pipeline, run_pipeline

    if args.stop_after is not None:
        raise BiodistilError("--stop-after applies to single commands; a pipeline resumes stage by stage")
    # interrupted stages always continue
    return run_pipeline(load_pipeline(args.recipe, recipe_overrides(args)), processes=args.processes)


def _demo(args: argparse.Namespace) -> object:
    from biodistil.demo import run_demo

    if args.record and args.quick:
        raise BiodistilError("--record keeps the real demo's report; --quick has none")
    return run_demo(args.out, data=args.data, quick=args.quick, same_labels=args.same_labels, record=args.record)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="biodistil",
        description="Distil large biomedical language models into small, fast students, and prove they still work.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of every error (also: BIODISTIL_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_recipe_command(
        sub, "pretrain", "MLM pre-training: from scratch with a corpus vocabulary, or continual", _pretrain
    )
    add_recipe_command(sub, "distill", "Task-agnostic distillation of a masked-LM teacher into a student", _distill)
    add_recipe_command(
        sub, "cache-teacher", "Store a distill recipe's teacher outputs (top-k logits, hidden states) per block and "
        "mask pattern, so that distill runs without the teacher (the recipe's teacher_cache section); an "
        "interrupted build continues when run again", _cache_teacher, resume=False, stop_after=False)
    pipeline = add_recipe_command(sub, "pipeline", "Run a pipeline recipe: pretrain/distill/evaluate stages in order",
                                  _pipeline, stop_after=False)
    pipeline.add_argument("--processes", type=processes_value, default=1, metavar="N|auto",
                          help="study and evaluate stages: run their fine-tuning runs N at a time in worker processes "
                          "of this machine, the cores shared between them (auto: one per idle core on a CPU machine; "
                          "default 1: one after another)")
    demo = sub.add_parser(
        "demo", help="Offline demo: what a real pretrained teacher adds to a half-depth student on NCBI-disease",
        description="Offline demo on 2 CPU cores (about 12 minutes with native bf16, 35 with AVX2 only): fine-tunes "
        "the embedded all-MiniLM-L6-v2 teacher on NCBI-disease's training set, then trains a student made of its "
        "layers 0, 2, 4 three ways (3 seeds each, equal steps): fine-tuned on a 15%% labelled budget, distilled (KD "
        "on the unlabelled training text + CE on the budget) and distilled without labels; exports the distilled "
        "student to ONNX int8, scores and times everything side by side, and writes DIR/report.md and "
        "DIR/report.json. Run it again to continue an interrupted demo (or to rewrite the report of a finished one). "
        "--quick runs the task-agnostic pipeline on toy models instead (under a minute).",
    )
    demo.add_argument("--out", required=True, help="output folder (relative to the working folder, or absolute)")
    demo.add_argument("--data", help="data folder (default: $BIODISTIL_DATA, else ../shared/data beside the repo)")
    demo.add_argument("--quick", action="store_true", help="a few steps of everything (a smoke test, a minute)")
    demo.add_argument("--same-labels", action="store_true",
                      help="the earlier comparison: the teacher fine-tuned on the students' labelled budget only")
    demo.add_argument("--record", metavar="FILE", help="also write the report's record (report.json) to FILE, e.g. "
                      "docs/results/demo.json, which docs/demo.md quotes")
    demo.set_defaults(run=_demo)
    task_commands.register(sub)
    eval_commands.register(sub)
    export_commands.register(sub)
    model_commands.register(sub)
    return parser


def _terminated(number: int, frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def continue_advice(args: argparse.Namespace, argv: list[str]) -> str:
    """What to type to continue an interrupted command: the same command, with --resume where it has one (and
    without `--from-records RECORDS`: the folder it started is what continues)."""
    flag = getattr(args, "continue_flag", None)
    words = list(argv)
    for at, word in enumerate(words):
        if word == "--from-records" or word.startswith("--from-records="):
            del words[at:at + (2 if word == "--from-records" else 1)]
            break
    words += [flag] if flag and flag not in words else []
    return "biodistil " + " ".join(shlex.quote(word) for word in words)


def _run(args: argparse.Namespace) -> Any:
    """The command, with torch's CPU threads decided for it (`training.threads`; a training stage decides again for
    itself) and put back after it; oneDNN's caches bounded first (`training.onednn`)."""
    bound_caches()
    if args.command in ("report", "export", "card", "models", "score", "serve"):  # serve: its own (serving.service)
        return args.run(args)
    from biodistil.training.threads import StageThreads, announce

    with StageThreads(sample_seconds=0.3) as threads:
        announce(threads.line)
        return args.run(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)  # like Ctrl-C: training stops with a checkpoint, others at once
    debug = args.debug or os.environ.get("BIODISTIL_DEBUG", "") not in ("", "0")
    try:
        result = _run(args)
    except BiodistilError as err:
        if debug:
            raise
        print(f"biodistil {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (OSError, SafetensorError) as err:  # the environment (a full disk, a read-only folder), not a bug
        if debug:
            raise
        from biodistil.training.run import output_problem

        if isinstance(err, SafetensorError) and not re.search(r"os error \d+", str(err)):
            print(f"biodistil {args.command}: error: a weights file (safetensors) is corrupt or truncated ({err}); "
                  "export or download the model again (run `biodistil --debug ...` for the file)", file=sys.stderr)
            return 2
        err = _os_error(err)
        print(f"biodistil {args.command}: error: {type(err).__name__}: {output_problem(err)} (run "
              "`biodistil --debug ...` for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print(f"Interrupted; continue with: {continue_advice(args, argv)}", file=sys.stderr)
        return 143 if "SIGTERM" in str(err) else 130
    finally:
        _leave_process_group()
    if result is not None and _main_process():
        print(result)
    return 0


def _leave_process_group() -> None:
    """Close a DDP launch's process group before the interpreter exits: left to the exit, gloo's threads can abort a
    process ("terminate called without an active exception") after the command has finished."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _main_process() -> bool:
    """Whether this process prints what the command returns: the main one of a launch (or the only one)."""
    from biodistil.training.processes import is_main_process

    return is_main_process()


def _os_error(err: Exception) -> OSError:
    """The OSError behind an error (safetensors reports a full disk as "I/O error: ... (os error 28)")."""
    if isinstance(err, OSError):
        return err
    found = re.search(r"os error (\d+)", str(err))
    return OSError(int(found.group(1)), os.strerror(int(found.group(1)))) if found else OSError(str(err))


if __name__ == "__main__":
    sys.exit(main())
