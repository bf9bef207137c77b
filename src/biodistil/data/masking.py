"""Dynamic masked-language-model corruption (BERT): choose 15% of tokens, then 80% [MASK] / 10% random / 10% kept.

Masking happens per batch with a generator the engine seeds from (seed, step), so an interrupted run that
resumes sees exactly the masks an uninterrupted run would.
"""

from dataclasses import dataclass

import torch
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
