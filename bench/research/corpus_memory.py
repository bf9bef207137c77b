"""Peak memory of `biodistil distill` against the size of the corpus: the same 5-step run (the real teacher
`minilm-l6`, a 1-layer student of it, the hidden-state cosine term) on N copies of a corpus file, each in a process of
its own, its peak RSS read from the kernel. A corpus index or batch plan held in Python lists grows with the corpus;
memory-mapped blocks and a computed plan do not.

    python bench/research/corpus_memory.py                       # biomed.txt × 1 and × 10
    python bench/research/corpus_memory.py --copies 1 100        # × 100 (1.6 GB; the cache takes minutes to build)

Prints per corpus size the peak RSS of the distill process and of its corpus workers, and the ratio to the first.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from biodistil.data.paths import resolve_data_root

RECIPE = """
teacher: {{name_or_path: minilm-l6, dtype: float32}}
student: {{init: teacher_layers, layers: [0]}}
data: {{train: [{corpus}], block_size: 128, eval_fraction: 0, cache_dir: {cache}}}
objective: {{terms: [{{loss: hidden_cosine}}]}}
train: {{max_steps: 5, batch_size: 8, save_every: 0, eval_every: 0, log_every: 5, progress_bar: false,
         tensorboard: false}}
export: {{enabled: false}}
"""
MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
if done.returncode:
    sys.exit(done.stderr[-3000:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss_mb(command: list[str]) -> float:
    """The largest peak RSS among the processes `command` ran (the distill process and its corpus workers)."""
    done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(done.stderr)
    return int(done.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="text file (default: corpus/biomed.txt of the data folder)")
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 10])
    args = parser.parse_args()
    source = Path(args.corpus) if args.corpus else resolve_data_root(None) / "corpus" / "biomed.txt"
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for copies in args.copies:
            corpus = Path(scratch) / f"corpus-{copies}.txt"
            text = source.read_bytes()
            with corpus.open("wb") as out:
                for _ in range(copies):
                    out.write(text)
            recipe = Path(scratch) / f"recipe-{copies}.yaml"
            recipe.write_text(RECIPE.format(corpus=corpus, cache=Path(scratch) / "cache"))
            command = [sys.executable, "-m", "biodistil", "distill", str(recipe), "--out",
                       str(Path(scratch) / f"run-{copies}")]
            build = peak_rss_mb(command)  # builds the corpus cache, then 5 steps
            train = peak_rss_mb([*command[:-1], str(Path(scratch) / f"run-{copies}-again")])  # cache built: 5 steps
            results[copies] = {"corpus_mb": round(corpus.stat().st_size / 1e6, 1), "peak_rss_mb_with_build": build,
                               "peak_rss_mb_from_cache": train}
            print(f"corpus × {copies} ({results[copies]['corpus_mb']:,} MB): peak RSS {build:,.0f} MB building the "
                  f"cache, {train:,.0f} MB from the cache", flush=True)
            corpus.unlink()
    first = results[args.copies[0]]
    for copies, row in results.items():
        print(f"× {copies} / × {args.copies[0]}: {row['peak_rss_mb_from_cache'] / first['peak_rss_mb_from_cache']:.2f} "
              f"(from the cache), {row['peak_rss_mb_with_build'] / first['peak_rss_mb_with_build']:.2f} (building it)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
