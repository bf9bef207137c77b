"""Resident memory of `biodistil distill` over many steps: a small random teacher, a synthetic corpus, the training
engine as the command runs it, the process's resident set size read after every optimizer step.

    python bench/rss_soak.py --steps 1000 --precision bf16
    python bench/rss_soak.py --steps 1000 --precision no --hidden 128 --teacher-layers 4 --vocab 4000
    python bench/rss_soak.py --steps 1000 --seconds 400 --teacher-layers 12 --hidden 768 --heads 12 --vocab 30522 \
        --block 128 --batch 8      # BERT-base shapes, stopped after 400 s of steps

Everything is built in a temporary folder (a WordPiece vocabulary trained on the synthetic corpus, a random BERT
teacher of `--teacher-layers` × `--hidden`, a student of its every other layer); the recipe is the DistilBERT triple
loss (KL at `--positions`), no held-out evaluation, one checkpoint at the end. The last line is JSON: the RSS (MB)
after steps 1, 10, 100, ... and every `--every` steps, the growth from step `--from` to the last step (MB, %), the
steps per second over the run, the allocator and oneDNN settings the process ran with and the CPU's bf16 flags. Every
`--every` steps it also prints a progress line (JSON, flushed), so a run killed from outside keeps its figures;
`--seconds` ends the run cleanly after that many seconds of steps.
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from biodistil.config import DistillRecipe, validate_recipe
from biodistil.data.synthetic import synthetic_corpus
from biodistil.training.engine import Engine

# the test suite's corpus words (tests/conftest.py)
CORPUS_WORDS = ("the protein kinase gene expression cell tumour patients mutation receptor binding inhibitor disease "
                "cancer mice induced levels increased decreased activation pathway signalling transcription factor "
                "apoptosis therapy clinical trial dose response antibody antigen immune infection virus bacterial "
                "resistance cytokine interleukin tnf p53 brca1 egfr insulin glucose liver renal cardiac")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--precision", choices=("no", "bf16"), default="bf16")
    parser.add_argument("--compile", choices=("auto", "true", "false"), default="false")
    parser.add_argument("--positions", choices=("all", "masked"), default="all")
    parser.add_argument("--teacher-layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, help="attention heads (default: hidden / 32)")
    parser.add_argument("--vocab", type=int, default=1000,
                        help="the models' vocabulary (the corpus's WordPiece one is smaller: rows no token reaches)")
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--every", type=int, default=100, help="report the RSS every this many steps")
    parser.add_argument("--from", dest="start", type=int, default=100, help="growth measured from this step")
    parser.add_argument("--seconds", type=float, help="stop after this many seconds of steps (then the summary)")
    return parser.parse_args(argv)


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_teacher(folder: Path, corpus: Path, args) -> Path:
    from biodistil.config import ArchitectureConfig
    from biodistil.data.vocab import train_wordpiece
    from biodistil.models.student import model_from_architecture

    tokenizer = train_wordpiece(corpus.read_text().splitlines(), vocab_size=args.vocab, min_frequency=1)
    torch.manual_seed(0)
    arch = ArchitectureConfig(num_layers=args.teacher_layers, hidden_size=args.hidden,
                              num_heads=args.heads or max(1, args.hidden // 32), intermediate_size=4 * args.hidden,
                              max_position_embeddings=max(64, args.block))
    model = model_from_architecture(arch, tokenizer)
    if args.vocab > len(tokenizer):  # the synthetic corpus has few words: rows no token reaches, as wide as asked
        model.resize_token_embeddings(args.vocab)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def recipe(folder: Path, teacher: Path, corpus: Path, args) -> DistillRecipe:
    layers = list(range(0, args.teacher_layers, 2))
    return validate_recipe(DistillRecipe, {
        "run": {"output_dir": str(folder / "run"), "seed": 3},
        "teacher": {"name_or_path": str(teacher)},
        "student": {"init": "teacher_layers", "layers": layers},
        "data": {"train": [str(corpus)], "block_size": args.block, "cache_dir": str(folder / "corpus")},
        "objective": {"temperature": 2.0, "terms": [
            {"loss": "mlm", "weight": 2.0}, {"loss": "logit_kl", "weight": 5.0, "positions": args.positions},
            {"loss": "hidden_cosine"}]},
        "train": {"max_steps": args.steps, "batch_size": args.batch, "learning_rate": 1e-4, "warmup_steps": 0,
                  "eval_every": 0, "save_every": 0, "log_every": 50, "progress_bar": False, "tensorboard": False,
                  "precision": args.precision, "compile": {"true": True, "false": False}.get(args.compile, "auto")},
    })


class SoakTimeUp(Exception):
    """Raised from the sampled step when `--seconds` have passed: ends the run without a final checkpoint."""


def cpu_flags() -> list[str]:
    """The CPU's flags that decide the bf16 path (from the machine record's reader)."""
    from biodistil.training.machine import cpu_info

    wanted = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    return sorted(wanted & set(cpu_info()[1] or ()))


def soak(args) -> dict:
    from biodistil.methods.task_agnostic import run_distill

    samples: list[int] = []
    times: list[float] = []
    step = Engine._optimizer_step

    def sampled(self, *a, **k):
        logs = step(self, *a, **k)
        samples.append(rss_bytes())
        times.append(time.perf_counter())
        if len(samples) == 1 or len(samples) % args.every == 0:
            print(json.dumps({"step": len(samples), "rss_mb": round(samples[-1] / 2**20, 1),
                              "seconds": round(times[-1] - times[0], 1)}), flush=True)
        if args.seconds is not None and times[-1] - times[0] > args.seconds:
            raise SoakTimeUp
        return logs

    Engine._optimizer_step = sampled
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            corpus = folder / "corpus.txt"
            corpus.write_text(synthetic_corpus(CORPUS_WORDS.split(), 2000, 0), encoding="utf-8")
            teacher = build_teacher(folder / "teacher", corpus, args)
            run_distill(recipe(folder, teacher, corpus, args))
    except SoakTimeUp:
        pass
    finally:
        Engine._optimizer_step = step
    mb = [round(value / 2**20, 1) for value in samples]
    marks = sorted(mark for mark in {1, 10, *range(args.every, len(mb) + 1, args.every), len(mb)} if mark <= len(mb))
    start = min(args.start, len(mb))
    return {"precision": args.precision, "compile": args.compile, "positions": args.positions,
            "steps": len(mb), "rss_mb": {step: mb[step - 1] for step in marks},
            f"growth_mb_from_{start}": round(mb[-1] - mb[start - 1], 1),
            f"growth_pct_from_{start}": round(100 * (mb[-1] - mb[start - 1]) / mb[start - 1], 2),
            "steps_per_s": round((len(times) - start) / max(times[-1] - times[start - 1], 1e-9), 2),
            "malloc_env": {key: value for key, value in os.environ.items() if key.startswith("MALLOC_")},
            "onednn_env": {key: value for key, value in os.environ.items()
                           if key.startswith(("ONEDNN_", "DNNL_")) or key == "LRU_CACHE_CAPACITY"},
            "threads": torch.get_num_threads(), "cpu_flags": cpu_flags(),
            "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), "torch": torch.__version__,
            "shapes": {"teacher": f"{args.teacher_layers} x {args.hidden}", "vocab": args.vocab,
                       "batch": f"{args.batch} x {args.block}"}}


if __name__ == "__main__":
    print(json.dumps(soak(parse())))
