"""A token classifier's training step with PyTorch's dropout against `train.dropout: fast`, on the CPU.

    python bench/research/dropout.py [--layers 3 --hidden 384 --vocab 30522 --batch 32 \
        --length 40 --threads 2 --rounds 20]

Builds two identical BERT token classifiers (random weights; the default is the demo's 3 × 384 student at an
NCBI-disease batch: 32 sentences of ~40 sub-words), one as PyTorch builds it and one with its nn.Dropout modules
swapped for `FastDropout` (`biodistil.training.engine.choose_dropout`, what the engine does), and times a training
step of each — forward and backward under bf16 autocast where the CPU has bf16 (as `train.precision: auto`), fused
AdamW — alternated one step each per round after 3 untimed rounds. Also times one dropout call of each kind at the
hidden states' shape. Prints the CPU's model and flags, the milliseconds (median over rounds) and the ratio of PyTorch's
to the fast one's; the last line is JSON.
"""

import argparse
import json
import statistics
import time

import torch
from transformers import BertConfig, BertForTokenClassification

from biodistil.config import TrainConfig
from biodistil.models.dropout import fast_dropout
from biodistil.training.engine import adamw, choose_dropout
from biodistil.training.machine import bf16_fast, cpu_line


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    return parser.parse_args()


def classifier(args: argparse.Namespace, dropout: str) -> tuple[BertForTokenClassification, torch.optim.Optimizer]:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
                        num_labels=3)
    model = BertForTokenClassification(config).train()
    choose_dropout(dropout, model, torch.device("cpu"))
    return model, adamw(model, TrainConfig(learning_rate=1e-4))


def step_ms(model, optimizer, batch: dict[str, torch.Tensor], bf16: bool) -> float:
    began = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - began) * 1000


def call_ms(function, rounds: int) -> float:
    times = []
    for _ in range(rounds + 3):
        began = time.perf_counter()
        function()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times[3:])


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    bf16 = bf16_fast(torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, args.vocab, (args.batch, args.length), generator=generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "labels": torch.randint(0, 3, ids.shape, generator=generator)}
    built = {name: classifier(args, name) for name in ("torch", "fast")}
    times: dict[str, list[float]] = {name: [] for name in built}
    for round_ in range(args.rounds + 3):
        for name, (model, optimizer) in built.items():
            spent = step_ms(model, optimizer, batch, bf16)
            if round_ >= 3:
                times[name].append(spent)
    hidden = torch.randn(args.batch, args.length, args.hidden, dtype=torch.bfloat16 if bf16 else torch.float32)
    calls = {"torch": call_ms(lambda: torch.nn.functional.dropout(hidden, 0.1, True), args.rounds),
             "fast": call_ms(lambda: fast_dropout(hidden, 0.1), args.rounds)}
    steps = {name: statistics.median(values) for name, values in times.items()}
    print(f"CPU: {cpu_line()}; {args.threads} threads; student {args.layers} x {args.hidden}, batch {args.batch} x "
          f"{args.length}, {'bf16 autocast' if bf16 else 'float32'}; median of {args.rounds} alternated rounds")
    for name in built:
        print(f"  dropout {name:5s}  step {steps[name]:7.1f} ms   one dropout call at {tuple(hidden.shape)} "
              f"{calls[name]:6.2f} ms")
    print(f"step: PyTorch's dropout / fast = {steps['torch'] / steps['fast']:.2f}x; one call "
          f"{calls['torch'] / calls['fast']:.2f}x")
    print(json.dumps({"cpu": cpu_line(), "threads": args.threads, "step_ms": steps, "call_ms": calls,
                      "step_ratio": round(steps["torch"] / steps["fast"], 3),
                      "call_ratio": round(calls["torch"] / calls["fast"], 3)}))


if __name__ == "__main__":
    main()
