"""Does a student trained under bf16 autocast on the CPU learn as well as in float32, at equal steps?

    python bench/research/precision_quality.py [--data ../shared/data] [--seeds 1 2 3] [--steps 150] [--skip-study]

Two checks, each float32 against bf16 autocast (`train.precision: no` / `bf16`) with everything else equal:

1. Task-agnostic distillation of the real teacher `minilm-l6` (6 × 384) into its layers 0, 2, 4 on
   corpus/biomed.txt: MLM on the student's own head + DistilBERT's 1 − cos(h_T, h_S) on the last hidden states (the
   teacher has no MLM head, so no KL term), `--steps` steps of 16 × 128-token blocks; the figure is the held-out MLM
   loss at the last step (the same held-out blocks and masks for every run).
2. Fine-tuning and task KD on NCBI-disease: `biodistil study recipes/studies/precision.yaml` (test F1 per seed).

A precision is "within the seed spread" of float32 when the difference of the means is at most the larger of the two
standard deviations over seeds. Writes docs/results/precision.json (resolved settings, machine, per-seed figures,
verdicts) and prints the tables. Resumable: finished runs are read, interrupted ones resume.
"""

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from biodistil.config import DistillRecipe, load_recipe, validate_recipe
from biodistil.io import atomic_write_json, jsonable
from biodistil.kd.recipe import StudyRecipe
from biodistil.kd.study import run_study
from biodistil.methods.task_agnostic import run_distill
from biodistil.training.machine import describe_machine
from biodistil.training.run import run_stage

PRECISIONS = {"fp32": "no", "bf16": "bf16"}
ROOT = Path(__file__).resolve().parents[2]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", default=str(ROOT / "runs" / "precision-quality"))
    parser.add_argument("--skip-study", action="store_true", help="only the task-agnostic check")
    parser.add_argument("--write", default=str(ROOT / "docs" / "results" / "precision.json"))
    return parser.parse_args()


def distill_settings(out: Path, data: str, seed: int, precision: str, steps: int) -> dict[str, Any]:
    return {
        "run": {"output_dir": str(out), "seed": seed},
        "teacher": {"name_or_path": "minilm-l6"},
        "student": {"init": "teacher_layers", "layers": [0, 2, 4]},
        "data": {"train": [f"{data}/corpus/biomed.txt"], "block_size": 128, "eval_fraction": 0.005},
        "objective": {"terms": [{"loss": "mlm", "weight": 1.0}, {"loss": "hidden_cosine", "weight": 1.0}]},
        "train": {"max_steps": steps, "batch_size": 16, "learning_rate": 3.0e-4, "warmup_steps": 10,
                  "eval_every": steps, "eval_batches": 20, "save_every": 50, "log_every": 10, "precision": precision,
                  "tensorboard": False, "progress_bar": False},
    }


def held_out_mlm(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["split"] == "eval"][-1]["loss_mlm"]


def distill_check(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PRECISIONS}
    for seed in args.seeds:
        for name, precision in PRECISIONS.items():
            folder = Path(args.out) / "distill" / name / f"seed-{seed}"
            recipe = validate_recipe(DistillRecipe, distill_settings(folder, args.data, seed, precision, args.steps))
            run_stage(folder, lambda f=folder: (f / "summary.json").is_file(),
                      lambda resume, r=recipe: run_distill(r, resume=resume))
            summary = json.loads((folder / "summary.json").read_text())
            runs[name].append({"seed": seed, "held_out_mlm": held_out_mlm(folder),
                               "train_seconds": summary["result"]["seconds"]})
    return {"settings": distill_settings(Path("RUN"), "DATA", 0, "PRECISION", args.steps),
            "figure": "held-out MLM loss (lower is better)", "runs": runs,
            "verdict": verdict([r["held_out_mlm"] for r in runs["fp32"]], [r["held_out_mlm"] for r in runs["bf16"]])}


def study_check(args: argparse.Namespace) -> dict[str, Any]:
    recipe = load_recipe(StudyRecipe, ROOT / "recipes" / "studies" / "precision.yaml", [f"data_dir={args.data}"])
    folder = Path(recipe.run.output_dir)
    run_study(recipe, resume=folder.exists())
    summary = json.loads((folder / "summary.json").read_text())
    rows = {row["arm"]: row for row in summary["rows"]}
    checks = {}
    for kind in ("finetune", "kd"):
        fp32, bf16 = rows[f"{kind}-fp32"], rows[f"{kind}-bf16"]
        checks[kind] = {"fp32": fp32["scores"], "bf16": bf16["scores"], "metric": fp32["metric"],
                        "degenerate_seeds": {"fp32": fp32["degenerate_seeds"], "bf16": bf16["degenerate_seeds"]},
                        "verdict": verdict(fp32["scores"], bf16["scores"])}
    seconds: dict[str, list[float]] = {}
    for run in summary["runs"]:  # every seed's run of each arm
        seconds.setdefault(run["arm"], []).append(run["wall_seconds"])
    return {"teacher": summary["teachers"], "checks": checks, "wall_seconds_per_arm": seconds}


def verdict(fp32: list[float], bf16: list[float]) -> dict[str, Any]:
    spread = max(statistics.stdev(fp32), statistics.stdev(bf16)) if len(fp32) > 1 else float("nan")
    difference = statistics.mean(bf16) - statistics.mean(fp32)
    return {"fp32_mean": statistics.mean(fp32), "bf16_mean": statistics.mean(bf16), "difference": difference,
            "spread": spread, "within_spread": abs(difference) <= spread}


def main() -> None:
    args = parse()
    result = {"machine": describe_machine(), "seeds": args.seeds, "distill": distill_check(args)}
    if not args.skip_study:
        result["study"] = study_check(args)
    atomic_write_json(Path(args.write), jsonable(result))
    distill = result["distill"]["verdict"]
    print(f"distill, held-out MLM loss: fp32 {distill['fp32_mean']:.4f}, bf16 {distill['bf16_mean']:.4f} "
          f"(difference {distill['difference']:+.4f}, seed spread {distill['spread']:.4f}: "
          f"{'within' if distill['within_spread'] else 'OUTSIDE'} the spread)")
    for kind, check in result.get("study", {}).get("checks", {}).items():
        v = check["verdict"]
        print(f"{kind}, test {check['metric']}: fp32 {v['fp32_mean']:.4f} {check['fp32']}, bf16 {v['bf16_mean']:.4f} "
              f"{check['bf16']} (difference {v['difference']:+.4f}, spread {v['spread']:.4f}: "
              f"{'within' if v['within_spread'] else 'OUTSIDE'} the spread)")
    print(f"written to {args.write}")


if __name__ == "__main__":
    main()
