"""The optimizer step of the engine (fused AdamW) against PyTorch's CPU defaults, on a student's parameters.

    python bench/research/optimizer.py [--layers 3 --hidden 384 --vocab 30522 --threads 2 --steps 30]

Builds a BERT masked LM of the given shape (random weights: speed does not depend on them; the default is the
demo's 3 × 384 student with BERT's 30,522-token vocabulary), gives every parameter a random gradient and times one
AdamW step over the same parameter groups (decay on matrices only) three ways, alternated one step each per round:
  for-loop    `torch.optim.AdamW(...)` as PyTorch builds it on a CPU when asked nothing (one tensor at a time);
  foreach     `foreach=True` (the tensors batched per operation);
  engine      `biodistil.training.engine.adamw` (`fused=True`: one kernel for the whole update).
Prints the CPU's model and flags, the milliseconds per step (median over the rounds) and each one's ratio to the
engine's step; the last line is JSON.
"""

import argparse
import json
import statistics
import time

import torch
from transformers import BertConfig, BertForMaskedLM

from biodistil.config import TrainConfig
from biodistil.training.engine import adamw
from biodistil.training.machine import cpu_line


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    return parser.parse_args()


def student(args: argparse.Namespace) -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden)
    model = BertForMaskedLM(config)
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    return model


def optimizers(args: argparse.Namespace) -> dict[str, tuple[BertForMaskedLM, torch.optim.Optimizer]]:
    cfg = TrainConfig(learning_rate=1e-4)
    built = {}
    for name, options in {"for-loop": {}, "foreach": {"foreach": True}}.items():
        model = student(args)
        engine_groups = adamw(model, cfg).param_groups
        groups = [{"params": group["params"], "weight_decay": group["weight_decay"]} for group in engine_groups]
        built[name] = model, torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=cfg.adam_betas,
                                               eps=cfg.adam_eps, **options)
    model = student(args)
    built["engine"] = model, adamw(model, cfg)
    return built


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    runs = optimizers(args)
    parameters = sum(p.numel() for p in runs["engine"][0].parameters())
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_index in range(args.steps + 3):
        for name, (_, optimizer) in runs.items():
            started = time.perf_counter()
            optimizer.step()
            if round_index >= 3:  # the first steps allocate the moments
                times[name].append(time.perf_counter() - started)
    median_ms = {name: 1000 * statistics.median(values) for name, values in times.items()}
    print(f"CPU: {cpu_line()}; {args.threads} threads; {parameters / 1e6:.1f} M parameters "
          f"({args.layers} x {args.hidden}, vocabulary {args.vocab}); {args.steps} steps each, alternated")
    for name, value in median_ms.items():
        print(f"  {name:<9} {value:7.1f} ms/step  {value / median_ms['engine']:.2f}x the engine's")
    print(json.dumps({"cpu": cpu_line(), "threads": args.threads, "parameters": parameters,
                      "ms_per_step": {k: round(v, 2) for k, v in median_ms.items()}}))


if __name__ == "__main__":
    main()
