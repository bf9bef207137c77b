"""Helpers (no tests) for ModernBERT tests, all offline: a byte-level BPE tokenizer like ModernBERT's (trained here
with the `tokenizers` library), tiny ModernBERT models with global and local layers, and padded batches."""

from pathlib import Path

import torch

from biodistil.config import ArchitectureConfig
from biodistil.data.synthetic import train_bpe  # noqa: F401 (re-exported for the tests)
from biodistil.models.student import model_from_architecture


def modernbert_arch(layers: int = 4, hidden: int = 32, heads: int = 2, every: int = 3, window: int = 4,
                    dropout: float = 0.0) -> ArchitectureConfig:
    """Tiny ModernBERT: global every `every`-th layer, local layers see keys within ±window/2."""
    return ArchitectureConfig(model_type="modernbert", num_layers=layers, hidden_size=hidden, num_heads=heads,
                              intermediate_size=2 * hidden, max_position_embeddings=128, dropout=dropout,
                              global_attention_every=every, local_attention=window)


def save_modernbert(tokenizer, folder: Path, seed: int = 0, **shape) -> Path:
    """A random tiny ModernBERT masked LM with `tokenizer`, saved as a Hugging Face folder."""
    torch.manual_seed(seed)
    model = model_from_architecture(modernbert_arch(**shape), tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def padded_batch(vocab: int, length: int = 12, seed: int = 0, pad: int = 0) -> dict[str, torch.Tensor]:
    """Two sequences, the second padded after 7 tokens: longer than a tiny local window, so local ≠ global."""
    ids = torch.randint(5, vocab, (2, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, 7:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}
