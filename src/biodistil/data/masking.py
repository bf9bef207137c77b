"""Masked-language-model corruption (BERT): choose 15% of tokens, then 80% [MASK] / 10% random / 10% kept.

Dynamic masking happens per batch with a generator the engine seeds from (seed, step), so an interrupted run
that resumes sees exactly the masks an uninterrupted run would. Static masking (`StaticMaskedBlocks`) fixes
D patterns per block, each drawn from a generator seeded by (masking seed, block, pattern) alone: a block's
pattern p is the same in every run, batch and process, which is what lets a cache hold the teacher's outputs
for it. Epoch e uses pattern e mod D (BERT's static masking with duplication factor D).
"""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from biodistil.config import MaskingConfig

IGNORE_INDEX = -100


@dataclass(frozen=True)
class MaskingVocabulary:
    """What masking needs to know about a tokenizer, as tensors for fast lookup."""

    mask_id: int
    special: torch.Tensor  # [V] bool: never masked, never drawn as a random replacement
    word_start: torch.Tensor  # [V] bool: token begins a word (for whole-word masking)

    @classmethod
    def from_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> "MaskingVocabulary":
        size = len(tokenizer)
        special = torch.zeros(size, dtype=torch.bool)
        special[torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)] = True
        return cls(int(tokenizer.mask_token_id), special, _word_start_table(tokenizer, size))


def _word_start_table(tokenizer: PreTrainedTokenizerBase, size: int) -> torch.Tensor:
    vocab = tokenizer.get_vocab()
    starts = torch.ones(size, dtype=torch.bool)
    if any(token.startswith("##") for token in vocab):  # WordPiece: "##" marks a continuation
        for token, index in vocab.items():
            starts[index] = not token.startswith("##")
    elif any(token.startswith(("Ġ", "▁")) for token in vocab):  # byte-level BPE / SentencePiece
        for token, index in vocab.items():
            starts[index] = token.startswith(("Ġ", "▁"))
    return starts


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vocab: MaskingVocabulary,
    cfg: MaskingConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (corrupted input ids, labels) with labels = original id at chosen positions, else -100."""
    ids = input_ids.cpu()
    can_mask = (~vocab.special[ids]) & attention_mask.cpu().bool()
    chance = torch.rand(ids.shape, generator=generator)
    if cfg.whole_word:
        chance = chance.gather(1, _word_index(ids, vocab))
    chosen = (chance < cfg.probability) & can_mask
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    action = torch.rand(ids.shape, generator=generator)
    to_mask = chosen & (action < cfg.mask_ratio)
    to_random = chosen & (action >= cfg.mask_ratio) & (action < cfg.mask_ratio + cfg.random_ratio)
    corrupted = ids.clone()
    corrupted[to_mask] = vocab.mask_id
    corrupted[to_random] = _random_ordinary_tokens(int(to_random.sum()), vocab, generator)
    return corrupted.to(input_ids.device), labels.to(input_ids.device)


def _word_index(ids: torch.Tensor, vocab: MaskingVocabulary) -> torch.Tensor:
    """For each position, the position of the token that starts its word (so a word shares one draw)."""
    starts = vocab.word_start[ids] | vocab.special[ids]
    starts[:, 0] = True
    positions = torch.arange(ids.size(1)).expand_as(ids)
    return torch.cummax(torch.where(starts, positions, torch.zeros_like(positions)), dim=1).values


def _random_ordinary_tokens(count: int, vocab: MaskingVocabulary, generator: torch.Generator) -> torch.Tensor:
    ordinary = (~vocab.special).nonzero().squeeze(1)
    picks = torch.randint(len(ordinary), (count,), generator=generator)
    return ordinary[picks]


def pattern_seed(seed: int, block: int, pattern: int) -> int:
    """The generator seed of one block's mask pattern: a hash of (masking seed, block, pattern)."""
    digest = hashlib.blake2b(f"{seed}:{block}:{pattern}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def static_mask(
    ids: Sequence[int] | torch.Tensor, vocab: MaskingVocabulary, cfg: MaskingConfig, seed: int, block: int,
    pattern: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(corrupted ids, labels) [L] of pattern `pattern` of block `block`: `mask_tokens` on the block alone, with a
    generator seeded by `pattern_seed(seed, block, pattern)`."""
    row = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
    generator = torch.Generator().manual_seed(pattern_seed(seed, block, pattern))
    corrupted, labels = mask_tokens(row, torch.ones_like(row), vocab, cfg, generator)
    return corrupted[0], labels[0]


class StaticMaskedBlocks(Dataset):
    """Corpus blocks with static masks: item i is block `first_block + i` under the current pattern.

    Its items carry `input_ids` (corrupted), `labels`, `block` and `pattern`; the engine calls `set_epoch(e)` before
    each epoch, which selects pattern e mod `cfg.duplication` (a held-out set, never told the epoch, keeps pattern 0).
    Masking thus happens where the data is read (in the loader's workers), never on the device.
    """

    def __init__(self, blocks: Any, vocab: MaskingVocabulary, cfg: MaskingConfig, first_block: int = 0):
        if cfg.duplication is None:
            raise ValueError("static masking needs masking.duplication")
        self.blocks, self.vocab, self.cfg, self.first_block = blocks, vocab, cfg, first_block
        self.pattern = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def set_epoch(self, epoch: int) -> None:
        self.pattern = epoch % self.cfg.duplication

    def __getitem__(self, index: int) -> dict[str, Any]:
        block = self.first_block + index
        ids = self.blocks[index]["input_ids"]
        corrupted, labels = static_mask(ids, self.vocab, self.cfg, self.cfg.seed, block, self.pattern)
        return {"input_ids": corrupted, "labels": labels, "block": block, "pattern": self.pattern}


def collate_masked_blocks(examples: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad statically masked blocks into input_ids, attention_mask, labels (-100 on padding), block and pattern."""
    length = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n], labels[row, :n], mask[row, :n] = example["input_ids"], example["labels"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels,
            "block": torch.tensor([e["block"] for e in examples], dtype=torch.long),
            "pattern": torch.tensor([e["pattern"] for e in examples], dtype=torch.long)}
