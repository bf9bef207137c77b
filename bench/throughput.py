"""Throughput of one distillation step against plain MLM training of the same student, on the same batches.

    python bench/throughput.py [--teacher-layers 6 --hidden 384 --vocab 30522 --seq 128 --batch 16]

Measures, in one process and on identical batches:
  distill   teacher forward (no grad) + student forward/backward + AdamW step, DistilBERT triple loss
            (KL over every non-padding position; distill-masked-kl: KL at the masked positions only);
  mlm       student forward/backward + AdamW step, MLM loss, logits only at masked positions (biodistil);
  mlm-full  the same with Hugging Face's default MLM head over the whole vocabulary at every position.
Prints tokens/s (median over repeats) and the ratios. Weights are random: speed does not depend on them.
"""

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertForMaskedLM

from biodistil.config import MaskingConfig, ObjectiveConfig, TermConfig
from biodistil.data.masking import MaskingVocabulary, mask_tokens
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.models.student import student_from_teacher_layers


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    return parser.parse_args()


def batches(args, count: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    special = torch.zeros(args.vocab, dtype=torch.bool)
    special[:5] = True
    vocab = MaskingVocabulary(mask_id=4, special=special, word_start=torch.ones(args.vocab, dtype=torch.bool))
    out = []
    for _ in range(count):
        ids = torch.randint(5, args.vocab, (args.batch, args.seq), generator=generator)
        ids[:, 0], ids[:, -1] = 2, 3
        attention = torch.ones_like(ids)
        corrupted, labels = mask_tokens(ids, attention, vocab, MaskingConfig(), generator)
        out.append({"input_ids": corrupted.to(args.device), "attention_mask": attention.to(args.device),
                    "labels": labels.to(args.device)})
    return out


def timed(step, data, args) -> float:
    """Median tokens/s of `step` over the measured batches."""
    rates = []
    for index, batch in enumerate(data):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(batch)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        if index >= args.warmup:
            rates.append(batch["attention_mask"].sum().item() / (time.perf_counter() - start))
    return statistics.median(rates)


def training_step(module, optimizer, args):
    def step(batch):
        with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.bf16):
            loss = module(batch)[0] if isinstance(module, MaskedLMModule) else module(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    args = parse()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.teacher_layers,
                        num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                        max_position_embeddings=max(512, args.seq))
    teacher = BertForMaskedLM(config).to(args.device)
    student = student_from_teacher_layers(teacher).to(args.device)
    data = batches(args, args.warmup + args.repeats)

    triple = ObjectiveConfig(temperature=2.0, terms=[TermConfig(loss="mlm", weight=2.0),
                                                    TermConfig(loss="logit_kl", weight=5.0),
                                                    TermConfig(loss="hidden_cosine")])
    distill = MaskedLMModule(student, Objective(triple, student, teacher), teacher)
    at_masked = triple.model_copy(update={"terms": [TermConfig(loss="mlm", weight=2.0),
                                                    TermConfig(loss="logit_kl", weight=5.0, positions="masked"),
                                                    TermConfig(loss="hidden_cosine")]})
    distill_masked = MaskedLMModule(student, Objective(at_masked, student, teacher), teacher)
    mlm_only = ObjectiveConfig(temperature=1.0, terms=[TermConfig(loss="mlm")])
    mlm = MaskedLMModule(student, Objective(mlm_only, student, None))
    results = {}
    modes = (("distill", distill), ("distill-masked-kl", distill_masked), ("mlm", mlm), ("mlm-full", student))
    for name, module in modes:
        optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-5)
        module.train()
        results[name] = timed(training_step(module, optimizer, args), data, args)

    threads = torch.get_num_threads()
    print(f"device {args.device} ({threads} CPU threads), bf16={args.bf16}; teacher {args.teacher_layers} layers, "
          f"student {student.config.num_hidden_layers} layers, hidden {args.hidden}, vocab {args.vocab}, "
          f"batch {args.batch} x {args.seq} tokens; median of {args.repeats} steps")
    for name, rate in results.items():
        print(f"  {name:18s} {rate:12,.0f} tokens/s")
    print(f"  distill / mlm           = {results['distill'] / results['mlm']:.2f}")
    print(f"  distill-masked-kl / mlm = {results['distill-masked-kl'] / results['mlm']:.2f}")
    print(f"  mlm / mlm-full-vocab    = {results['mlm'] / results['mlm-full']:.2f}  (logits only at masked positions)")


if __name__ == "__main__":
    main()
