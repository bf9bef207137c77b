"""`biodistil evaluate` in 2 processes against 1: wall times, their ratio, and the two reports compared.

    python bench/research/multiprocess_evaluate.py [--data ../shared/data \
        --out runs/bench-multiprocess --max-examples 400]

Evaluates 2 models (the embedded `minilm-l6` and a copy of its layers 0, 2, 4) x 2 tasks (NCBI-disease and GAD, every
split capped at --max-examples) x --seeds seeds, --epochs epochs per cell in batches of --batch-size: once as one
process, once under `accelerate launch --multi_gpu --num_processes 2` (torchrun; gloo on a CPU-only machine), which
shares the cells out over the two processes. Every process runs at --threads threads (OMP_NUM_THREADS). Prints both
wall times (the whole command, start-up included), their ratio (the target of issue 25: 2 processes <= 0.6 x 1
process) and whether the two results.json (wall times and throughputs left out) and report.md are identical, then one
JSON line. Both runs start in emptied folders under --out. Timings need a quiet machine (2 idle cores for 2
processes at 1 thread): the script says so when the load average says it is not.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TIMING = ("wall_seconds", "seconds", "tokens_per_second")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--out", default="runs/bench-multiprocess")
    parser.add_argument("--max-examples", type=int, default=400, help="cap on every split of both tasks")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=16, help="per cell (at most --max-examples)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per model and task (num_seeds)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    return parser.parse_args()


def write_recipe(args: argparse.Namespace, out: Path) -> Path:
    recipe = {"run": {"seed": 42},
              "models": [{"name": "minilm-l6", "path": "minilm-l6"},
                         {"name": "minilm-l6-half", "path": "minilm-l6", "layers": [0, 2, 4]}],
              "tasks": ["ncbi_disease", "gad"], "num_seeds": args.seeds,
              "train": {"epochs": args.epochs, "batch_size": args.batch_size, "progress_bar": False},
              "data": {"root": str(Path(args.data).resolve()), "max_examples": args.max_examples}}
    path = out / "evaluate.yaml"
    path.write_text(json.dumps(recipe, indent=2))
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def evaluate(recipe: Path, folder: Path, processes: int, threads: int) -> float:
    """Wall seconds of `biodistil evaluate RECIPE --out FOLDER` in `processes` processes (log in FOLDER.log)."""
    shutil.rmtree(folder, ignore_errors=True)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
              "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
              "--dynamo_backend", "no"]
    command = [*(launch if processes > 1 else [sys.executable]), "-m", "biodistil", "evaluate", str(recipe),
               "--out", str(folder)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    with open(f"{folder}.log", "w", encoding="utf-8") as log:
        done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{processes}-process evaluate failed: see {folder}.log")
    return seconds


def without_timings(value: Any, root: Path) -> Any:
    if isinstance(value, dict):
        return {key: without_timings(item, root) for key, item in value.items() if key not in TIMING}
    if isinstance(value, list):
        return [without_timings(item, root) for item in value]
    return value.replace(str(root), "ROOT") if isinstance(value, str) else value


def same_reports(one: Path, two: Path) -> dict[str, bool]:
    results = [without_timings(json.loads((f / "results.json").read_text()), f) for f in (one, two)]
    reports = [(f / "report.md").read_text().replace(str(f), "ROOT") for f in (one, two)]
    return {"results_identical": results[0] == results[1], "report_identical": reports[0] == reports[1]}


def main() -> None:
    args = parse()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    if load > 1.0:
        print(f"Warning: 1-minute load average {load:.2f} > 1: other work shares the cores, the timings (and their "
              "ratio) say little", flush=True)
    recipe = write_recipe(args, out)
    walls = {processes: evaluate(recipe, out / f"processes-{processes}", processes, args.threads)
             for processes in (1, 2)}
    ratio = walls[2] / walls[1]
    checks = same_reports(out / "processes-1", out / "processes-2")
    print(f"1 process:   {walls[1]:8.1f} s\n2 processes: {walls[2]:8.1f} s\nratio:       {ratio:8.2f} "
          f"(target <= 0.6)\nresults.json identical: {checks['results_identical']}; report.md identical: "
          f"{checks['report_identical']}")
    print(json.dumps({"wall_seconds": {"1": round(walls[1], 1), "2": round(walls[2], 1)}, "ratio": round(ratio, 3),
                      **checks, "load_average_1min": round(load, 2), "max_examples": args.max_examples,
                      "epochs": args.epochs, "batch_size": args.batch_size, "seeds": args.seeds,
                      "threads": args.threads}))


if __name__ == "__main__":
    main()
