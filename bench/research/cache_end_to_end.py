"""A student distilled from the teacher cache against one distilled live: held-out MLM loss after the same steps.

    python bench/research/cache_end_to_end.py TEACHER_DIR \
        [--corpus ../shared/data/corpus/biomed.txt --out runs/cache-e2e]

Runs `biodistil distill recipes/distilbiobert.yaml` (DistilBERT's triple loss, KL at the masked positions) on the
first --lines lines of the corpus, 128-token blocks, static masks (`masking.duplication=4`), --steps steps of 16
blocks, with three teacher signals and --seeds seeds each:
  live         the teacher runs on every batch;
  cache-head   `teacher_cache.logits=head`: the teacher's head forms its logits from the cached last hidden state;
  cache-top-k  `teacher_cache.logits=top_k`: top-64 logits + 64 tail draws.
The caches are built first (`biodistil cache-teacher`, timed apart); each run then evaluates its student on the same
held-out blocks under the same static masks. TEACHER_DIR is a masked LM with a trained MLM head. Runs go --parallel
at a time, each on OMP_NUM_THREADS=--threads; a finished run is kept and not re-run (delete its folder to redo it).
Prints a table and a JSON line: per arm and seed, the held-out MLM loss at the last step and the run's wall time.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS = {"live": [], "cache-head": ["teacher_cache.logits=head"], "cache-top-k": ["teacher_cache.logits=top_k"]}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teacher")
    parser.add_argument("--corpus", default="../shared/data/corpus/biomed.txt")
    parser.add_argument("--out", default="runs/cache-e2e")
    parser.add_argument("--lines", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def overrides(args: argparse.Namespace, out: Path) -> list[str]:
    return [
        "recipes/distilbiobert.yaml", f"teacher.name_or_path={args.teacher}", f"data.train=[{args.corpus}]",
        f"data.max_lines={args.lines}", "data.block_size=128", "data.eval_fraction=0.03",
        f"data.cache_dir={out / 'corpus'}", "masking.duplication=4", f"train.max_steps={args.steps}",
        "train.batch_size=16", "train.grad_accumulation=1", "train.warmup_steps=8", f"train.eval_every={args.steps}",
        f"train.save_every={args.steps}", "train.progress_bar=false", f"teacher_cache.dir={out / 'teacher-cache'}",
    ]


def command(args: argparse.Namespace, out: Path, verb: str, arm: str, extra: list[str]) -> list[str]:
    settings = overrides(args, out) + ARMS[arm] + extra
    if arm == "live":
        settings = [s for s in settings if not s.startswith("teacher_cache.")]
    return [sys.executable, "-m", "biodistil", verb, *settings]


def held_out_loss(run: Path) -> float | None:
    metrics = run / "metrics.jsonl"
    if not (run / "summary.json").is_file() or not metrics.is_file():
        return None
    evals = [json.loads(line) for line in metrics.read_text().splitlines() if '"eval"' in line]
    return evals[-1]["loss_mlm"] if evals else None


def main() -> None:
    args = parse()
    out = Path(args.out).resolve()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    for arm in [a for a in args.arms if a != "live"]:  # build each cache once, before any student trains from it
        started = time.perf_counter()
        subprocess.run(command(args, out, "cache-teacher", arm, []), check=True, env=env)
        print(f"{arm}: cache ready in {time.perf_counter() - started:.0f} s", flush=True)
    jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    running: list[tuple[str, int, subprocess.Popen, float]] = []
    walls: dict[str, float] = {}
    while jobs or running:
        while jobs and len(running) < args.parallel:
            arm, seed = jobs.pop(0)
            run = out / f"{arm}-seed{seed}"
            if held_out_loss(run) is not None:
                continue
            log = open(out / f"{arm}-seed{seed}.log", "w")  # noqa: SIM115 (closed with the process)
            process = subprocess.Popen(command(args, out, "distill", arm, [f"run.seed={seed}", "--out", str(run)]),
                                       env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((arm, seed, process, time.perf_counter()))
        time.sleep(2)
        for item in [r for r in running if r[2].poll() is not None]:
            arm, seed, process, started = item
            running.remove(item)
            if process.returncode != 0:
                raise SystemExit(f"{arm} seed {seed} failed: see {out / f'{arm}-seed{seed}.log'}")
            walls[f"{arm}-seed{seed}"] = time.perf_counter() - started
            print(f"{arm} seed {seed}: held-out MLM {held_out_loss(out / f'{arm}-seed{seed}'):.4f}", flush=True)
    table = {arm: {seed: held_out_loss(out / f"{arm}-seed{seed}") for seed in args.seeds} for arm in args.arms}
    for arm, losses in table.items():
        values = list(losses.values())
        spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
        seeds = "  ".join(f"{value:.4f}" for value in values)
        print(f"  {arm:12s} {seeds}   mean {statistics.mean(values):.4f}{spread}")
    print(json.dumps({"held_out_mlm": table, "wall_seconds": walls, "steps": args.steps, "lines": args.lines}))


if __name__ == "__main__":
    main()
