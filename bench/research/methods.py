"""Training throughput of every task-agnostic method on the same teacher and student, and what attention costs.

    python bench/research/methods.py [--steps 20 --batch 8 --seq 128 --teacher-layers 6 --hidden 384 --heads 12]

1. Methods: each distillation recipe in recipes/ runs `--steps` optimizer steps through `biodistil distill` with
   one random BERT teacher (trained vocabulary of `--vocab` WordPieces on the corpus) and one student (the
   teacher's layers 0, 2, 4, ...), so only the objective differs. Tokens/s is the engine's own figure at the
   last step (checkpoint writing excluded), the best of `--rounds` interleaved runs (shared machines are
   noisy). "MLM only" trains the same student without a teacher.
2. Attention: one teacher forward (no grad) and one student forward + backward with
   sdpa        the model's SDPA kernel, no attention requested;
   sdpa+hooks  SDPA, plus attention probabilities of every layer from Q/K hooks (what biodistil does);
   eager       the slow path, `attn_implementation="eager"` with `output_attentions=True`.
Prints Markdown tables (and writes them to --out). Weights are random: speed does not depend on them.
"""

import argparse
import copy
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from biodistil.config import ArchitectureConfig, DistillRecipe, load_recipe
from biodistil.data.corpus import iter_lines, resolve_corpus_files
from biodistil.data.vocab import train_wordpiece
from biodistil.methods.task_agnostic import run_distill
from biodistil.models.features import FeatureRequest, extract_features
from biodistil.models.student import model_from_architecture, student_from_teacher_layers

REPO = Path(__file__).resolve().parents[2]
METHODS = [  # (recipe, method as named in docs/methods.md)
    ("distilbiobert", "DistilBioBERT (DistilBERT triple loss)"),
    ("tinybiobert-4l-312", "TinyBioBERT (TinyBERT layer + attention MSE)"),
    ("compactbiobert", "CompactBioBERT (cosine + attention KL per layer)"),
    ("mobilebert-layer", "MobileBERT-style layer transfer"),
    ("minilmv2", "MiniLMv2 (Q/K/V relations, last layer)"),
    ("vekd", "VE-KD (vocabulary + up to 2,000 domain tokens)"),
    ("biolm-distill-align", "bio-lm distill + align"),
]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "data" / "corpus" / "biomed.txt"))
    parser.add_argument("--lines", type=int, default=20000, help="corpus lines used")
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--teacher-layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="runs per method, interleaved; the best counts")
    parser.add_argument("--repeats", type=int, default=5, help="attention timing repeats (median)")
    parser.add_argument("--out", help="also write the tables to this Markdown file")
    return parser.parse_args()


def make_teacher(args, work: Path) -> Path:
    """A random BERT teacher with a WordPiece vocabulary trained on the corpus, saved as a folder."""
    lines = list(iter_lines(resolve_corpus_files([args.corpus]), args.lines))
    tokenizer = train_wordpiece(lines, vocab_size=args.vocab)
    torch.manual_seed(0)
    arch = ArchitectureConfig(num_layers=args.teacher_layers, hidden_size=args.hidden, num_heads=args.heads,
                              intermediate_size=4 * args.hidden, max_position_embeddings=max(512, args.seq))
    folder = work / "teacher"
    model_from_architecture(arch, tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def method_overrides(args, name: str, teacher: Path, work: Path, vocab: int) -> list[str]:
    layers = list(range(0, args.teacher_layers, 2))
    common = [
        f"teacher.name_or_path={teacher}", f"data.train=[{args.corpus}]", f"data.max_lines={args.lines}",
        f"data.block_size={args.seq}", f"data.cache_dir={work / 'cache'}", "data.eval_fraction=0",
        "student.init=teacher_layers", f"student.layers={layers}", f"train.max_steps={args.steps}",
        f"train.batch_size={args.batch}", "train.grad_accumulation=1", "train.warmup_steps=0", "train.eval_every=0",
        "train.save_every=0", f"train.log_every={args.steps}", "train.progress_bar=false", "train.tensorboard=false",
        "export.enabled=false", f"run.output_dir={work / name}",
    ]
    if name == "vekd":
        common.append(f"student.vocab_expansion.vocab_size={vocab + 2000}")
    if name == "mlm-only":
        common.append("objective.terms=[{loss: mlm}]")
    return common


def method_rate(args, name: str, teacher: Path, work: Path, vocab: int) -> float:
    """Tokens/s of one short `biodistil distill` run of the method's recipe."""
    recipe_name = "distilbiobert" if name == "mlm-only" else name
    shutil.rmtree(work / name, ignore_errors=True)
    recipe = load_recipe(DistillRecipe, REPO / "recipes" / f"{recipe_name}.yaml",
                         method_overrides(args, name, teacher, work, vocab))
    run_distill(recipe)
    records = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["split"] == "train"][-1]["tokens_per_s"]


def best_rates(args, teacher: Path, work: Path, vocab: int) -> dict[str, float]:
    """The best tokens/s of each method over `--rounds` rounds, every round running each method once."""
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name in ["mlm-only", *(recipe for recipe, _ in METHODS)]:
            best[name] = max(best.get(name, 0.0), method_rate(args, name, teacher, work, vocab))
            print(f"{name}: {best[name]:,.0f} tokens/s", flush=True)
    return best


def attention_costs(args, teacher_dir: Path) -> list[tuple[str, float, float]]:
    """(mode, teacher forward ms, student forward+backward ms) per attention mode, median of repeats."""
    from transformers import AutoModelForMaskedLM

    teacher = AutoModelForMaskedLM.from_pretrained(teacher_dir, attn_implementation="sdpa").eval()
    student = student_from_teacher_layers(teacher, list(range(0, args.teacher_layers, 2))).train()
    generator = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(5, teacher.config.vocab_size, (args.batch, args.seq), generator=generator),
             "attention_mask": torch.ones(args.batch, args.seq, dtype=torch.long)}
    rows = []
    for mode in ("sdpa", "sdpa+hooks", "eager"):
        t_model, s_model = (teacher, student) if mode != "eager" else (_eager(teacher), _eager(student))
        rows.append((mode, _median_ms(lambda m=mode, t=t_model: _teacher_pass(t, batch, m), args.repeats),
                     _median_ms(lambda m=mode, s=s_model: _student_pass(s, batch, m), args.repeats)))
    return rows


def _eager(model):
    copied = copy.deepcopy(model)
    copied.set_attn_implementation("eager")
    return copied


def _forward(model, batch, mode: str) -> torch.Tensor:
    """Sum of the last hidden state and of every layer's attention probabilities (when the mode gives them)."""
    if mode == "eager":
        out = model.bert(**batch, output_attentions=True)
        return out.last_hidden_state.sum() + sum(a.sum() for a in out.attentions)
    layers = set(range(1, model.config.num_hidden_layers + 1)) if mode == "sdpa+hooks" else set()
    features = extract_features(model, batch, FeatureRequest(hidden={-1}, attentions=layers), None)
    return features.hidden_at(-1).sum() + sum(a.sum() for a in features.attentions.values())


def _teacher_pass(model, batch, mode: str) -> None:
    with torch.no_grad():
        _forward(model, batch, mode)


def _student_pass(model, batch, mode: str) -> None:
    model.zero_grad(set_to_none=True)
    _forward(model, batch, mode).backward()


def _median_ms(step, repeats: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    args = parse()
    device = "GPU" if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} thread(s)"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        teacher = make_teacher(args, work)
        vocab = json.loads((teacher / "config.json").read_text())["vocab_size"]
        lines = [
            f"Teacher: random BERT {args.teacher_layers} layers × {args.hidden}, {args.heads} heads, vocabulary "
            f"{vocab:,}; student: its layers {list(range(0, args.teacher_layers, 2))}; batch {args.batch} × "
            f"{args.seq} tokens; {args.steps} steps, best of {args.rounds} runs; {device}.", "",
            "| method (recipe) | tokens/s | vs. MLM only |", "|---|---:|---:|",
        ]
        rates = best_rates(args, teacher, work, vocab)
        baseline = rates["mlm-only"]
        lines.append(f"| MLM only, no teacher (reference) | {baseline:,.0f} | 1.00 |")
        for name, label in METHODS:
            lines.append(f"| {label} (`{name}`) | {rates[name]:,.0f} | {rates[name] / baseline:.2f} |")
        lines += ["", "| attention mode | teacher forward (ms) | student forward + backward (ms) |",
                  "|---|---:|---:|"]
        for mode, teacher_ms, student_ms in attention_costs(args, teacher):
            lines.append(f"| {mode} | {teacher_ms:,.1f} | {student_ms:,.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
