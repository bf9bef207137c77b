"""The teacher cache's KL estimators against the full KL, on a real teacher's outputs.

    python bench/research/topk_kl.py TEACHER_DIR \
        [--corpus ../shared/data/corpus/biomed.txt --first-line 90000 --blocks 96]

TEACHER_DIR is a masked LM with a trained MLM head; the student is its layers 0, 2, 4. On static-masked blocks of
the corpus (lines from --first-line on), for T = 2 and 1, k = 16, 64, 128 and m = 0 (tail as one bucket), 32, 64
tail draws: the estimate `topk_kl_loss` gives from the values as a cache stores them (float16), its relative error
against `soft_kl_loss` on the full logits, the teacher's tempered tail mass, and the cosine between the two
gradients with respect to the student's logits. Prints JSON.
"""

import argparse
import json
from itertools import islice
from pathlib import Path

import torch

from biodistil.config import MaskingConfig
from biodistil.data.corpus import pack_blocks
from biodistil.data.masking import MaskingVocabulary, static_mask
from biodistil.losses.distillation import soft_kl_loss, topk_kl_loss
from biodistil.models.loading import load_masked_lm, load_tokenizer
from biodistil.models.student import student_from_teacher_layers


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teacher")
    parser.add_argument("--corpus", default="../shared/data/corpus/biomed.txt")
    parser.add_argument("--first-line", type=int, default=90000)
    parser.add_argument("--lines", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=128)
    return parser.parse_args()


@torch.no_grad()
def logits_at_masks(args) -> tuple[torch.Tensor, torch.Tensor]:
    """(student, teacher) logits [N, V] at the masked positions of pattern 0 of the blocks."""
    tokenizer = load_tokenizer(args.teacher)
    teacher = load_masked_lm(args.teacher).eval()
    student = student_from_teacher_layers(teacher, [0, 2, 4]).eval()
    with Path(args.corpus).open(encoding="utf-8") as handle:
        lines = [line.strip() for line in islice(handle, args.first_line, args.first_line + args.lines)]
    blocks = list(islice(pack_blocks(iter(lines), tokenizer, args.block_size), args.blocks))
    vocab, masking = MaskingVocabulary.from_tokenizer(tokenizer), MaskingConfig(duplication=1)
    students, teachers = [], []
    for start in range(0, len(blocks), 16):
        masked = [static_mask(b["input_ids"], vocab, masking, 0, start + i, 0)
                  for i, b in enumerate(blocks[start:start + 16])]
        ids = torch.nn.utils.rnn.pad_sequence([m[0] for m in masked], batch_first=True)
        labels = torch.nn.utils.rnn.pad_sequence([m[1] for m in masked], batch_first=True, padding_value=-100)
        attention = torch.nn.utils.rnn.pad_sequence([torch.ones_like(m[0]) for m in masked], batch_first=True)
        rows = labels != -100
        teachers.append(teacher(input_ids=ids, attention_mask=attention).logits[rows].float())
        students.append(student(input_ids=ids, attention_mask=attention).logits[rows].float())
    return torch.cat(students), torch.cat(teachers)


def main() -> None:
    args = parse()
    student, teacher = logits_at_masks(args)
    generator = torch.Generator().manual_seed(0)
    out = {"teacher": args.teacher, "masked_positions": student.size(0)}
    for t in (2.0, 1.0):
        full = student.clone().requires_grad_()
        full_kl = soft_kl_loss(full, teacher, t)
        full_kl.backward()
        shifted = teacher - teacher.max(-1, keepdim=True).values
        log_norm = torch.logsumexp(shifted / t, -1)
        results = {"full_kl": round(full_kl.item(), 5)}
        for k in (16, 64, 128):
            top = shifted.topk(k, -1)
            tail = torch.softmax(shifted / t, -1).scatter(-1, top.indices, 0.0)
            results[f"k{k}_tail_mass"] = round(tail.sum(-1).mean().item(), 4)
            for m in (0, 32, 64):
                draws = {}
                if m:
                    sampled = torch.multinomial(tail, m, replacement=True, generator=generator)
                    draws = {"tail_logits": shifted.gather(-1, sampled).half(), "tail_ids": sampled}
                estimate = student.clone().requires_grad_()
                value = topk_kl_loss(estimate, top.values.half(), top.indices, log_norm, t, **draws)
                value.backward()
                cosine = torch.nn.functional.cosine_similarity(full.grad.flatten(), estimate.grad.flatten(), dim=0)
                results[f"k{k}_m{m}"] = {"kl": round(value.item(), 5),
                                         "rel_error": round((value.item() - full_kl.item()) / full_kl.item(), 4),
                                         "grad_cosine": round(cosine.item(), 4)}
        out[f"T={t}"] = results
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
