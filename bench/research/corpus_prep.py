"""Corpus preparation speed: MB of text per second turned into the memory-mapped block cache, with 1 worker and with
every core, side by side in one process (same corpus, same tokenizer, a fresh cache folder each time).

    python bench/research/corpus_prep.py                 # ../shared/data/corpus/biomed.txt, minilm-l6's tokenizer
    python bench/research/corpus_prep.py --copies 10 --workers 1 2

`--copies N` builds the corpus from N copies of the file (a larger corpus, the same text). Prints the CPU's model
and flags that matter, MB/s per worker count, and the ratio to one worker.
"""

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

from biodistil.data.corpus import build_block_dataset
from biodistil.data.paths import resolve_data_root
from biodistil.embedded import resolve_model_name
from biodistil.models.loading import load_tokenizer
from biodistil.training.machine import cpu_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="text file (default: corpus/biomed.txt of the data folder)")
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokenizer", default="minilm-l6")
    parser.add_argument("--block-size", type=int, default=128)
    args = parser.parse_args()
    source = Path(args.corpus) if args.corpus else resolve_data_root(None) / "corpus" / "biomed.txt"
    tokenizer = load_tokenizer(resolve_model_name(args.tokenizer))
    print(f"CPU: {cpu_line()}")
    with tempfile.TemporaryDirectory() as scratch:
        corpus = Path(scratch) / "corpus.txt"
        with corpus.open("wb") as out:
            for _ in range(args.copies):
                with source.open("rb") as handle:
                    shutil.copyfileobj(handle, out)
        megabytes = corpus.stat().st_size / 1e6
        print(f"corpus: {source} × {args.copies} = {megabytes:,.1f} MB, block size {args.block_size}")
        rates = {}
        for workers in args.workers:
            cache = Path(scratch) / f"cache-{workers}"
            began = time.perf_counter()
            blocks = build_block_dataset([corpus], tokenizer, args.block_size, cache_dir=cache, workers=workers)
            seconds = time.perf_counter() - began
            rates[workers] = megabytes / seconds
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"workers {workers}: {len(blocks):,} blocks in {seconds:.1f} s = {rates[workers]:.2f} MB/s "
                  f"({rates[workers] / workers:.2f} MB/s per worker; peak RSS of this process so far {peak:,.0f} MB)")
            shutil.rmtree(cache)
        base = rates[args.workers[0]]
        for workers, rate in rates.items():
            print(f"ratio workers {workers} / workers {args.workers[0]}: {rate / base:.2f}")


if __name__ == "__main__":
    main()
