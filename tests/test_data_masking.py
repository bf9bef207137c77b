"""Dynamic MLM masking: rates, special tokens, reproducibility, whole words."""

import torch

from biodistil.config import MaskingConfig
from biodistil.data.masking import IGNORE_INDEX, MaskingVocabulary, mask_tokens


def batch_of(tokenizer, text: str, rows: int = 64):
    encoded = tokenizer([text] * rows, return_tensors="pt", padding="max_length", max_length=48, truncation=True)
    return encoded["input_ids"], encoded["attention_mask"]


def test_rates_and_special_tokens(tokenizer):
    vocab = MaskingVocabulary.from_tokenizer(tokenizer)
    ids, attention = batch_of(tokenizer, "the protein kinase gene expression cell tumour patients " * 3)
    corrupted, labels = mask_tokens(ids, attention, vocab, MaskingConfig(), torch.Generator().manual_seed(0))
    chosen = labels != IGNORE_INDEX
    maskable = (~vocab.special[ids]) & attention.bool()
    assert not (chosen & ~maskable).any(), "special tokens and padding are never chosen"
    assert 0.12 < chosen.sum() / maskable.sum() < 0.18
    assert torch.equal(labels[chosen], ids[chosen])
    as_mask = (corrupted == tokenizer.mask_token_id) & chosen
    kept = (corrupted == ids) & chosen
    assert 0.72 < as_mask.sum() / chosen.sum() < 0.88
    assert 0.04 < kept.sum() / chosen.sum() < 0.16
    assert torch.equal(corrupted[~chosen], ids[~chosen])
    replaced = corrupted[chosen & ~as_mask & ~kept]
    assert not vocab.special[replaced].any(), "random replacements are ordinary tokens"


def test_same_seed_same_masks_other_seed_other_masks(tokenizer):
    vocab = MaskingVocabulary.from_tokenizer(tokenizer)
    ids, attention = batch_of(tokenizer, "the protein kinase gene expression cell tumour", rows=8)
    first = mask_tokens(ids, attention, vocab, MaskingConfig(), torch.Generator().manual_seed(3))
    again = mask_tokens(ids, attention, vocab, MaskingConfig(), torch.Generator().manual_seed(3))
    other = mask_tokens(ids, attention, vocab, MaskingConfig(), torch.Generator().manual_seed(4))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])


def test_whole_word_masking_masks_every_piece_of_a_word(tokenizer):
    vocab = MaskingVocabulary.from_tokenizer(tokenizer)
    text = "immunohistochemistry hyperphosphorylation " * 6
    ids, attention = batch_of(tokenizer, text, rows=32)
    pieces = tokenizer.convert_ids_to_tokens(ids[0])
    assert any(p.startswith("##") for p in pieces), "test needs words split into several pieces"
    cfg = MaskingConfig(probability=0.3, whole_word=True)
    _, labels = mask_tokens(ids, attention, vocab, cfg, torch.Generator().manual_seed(1))
    chosen = labels != IGNORE_INDEX
    continuation = torch.tensor([[p.startswith("##") for p in tokenizer.convert_ids_to_tokens(r)] for r in ids])
    # a continuation piece is chosen exactly when the piece before it is (same word)
    assert torch.equal(chosen[:, 1:][continuation[:, 1:]], chosen[:, :-1][continuation[:, 1:]])
    assert chosen.any()


def test_static_masks_depend_on_block_and_pattern_only(tokenizer):
    from biodistil.data.masking import StaticMaskedBlocks, collate_masked_blocks

    vocab = MaskingVocabulary.from_tokenizer(tokenizer)
    ids = tokenizer(["the protein kinase gene expression cell tumour patients mutation receptor binding " * 3]
                    )["input_ids"][0]
    blocks = [{"input_ids": ids}] * 6
    cfg = MaskingConfig(duplication=3, seed=7)
    data = StaticMaskedBlocks(blocks, vocab, cfg, first_block=10)
    first = [data[i]["labels"] for i in range(6)]
    assert all(data[i]["block"] == 10 + i and data[i]["pattern"] == 0 for i in range(6))
    assert not torch.equal(first[0], first[1]), "blocks of the same text get their own masks"
    data.set_epoch(3)  # epoch 3 uses pattern 3 mod 3 = 0: the same masks
    assert all(torch.equal(data[i]["labels"], first[i]) for i in range(6))
    data.set_epoch(4)
    again = StaticMaskedBlocks(blocks[:2], vocab, cfg, first_block=14)  # another selection, the same blocks 14, 15
    again.set_epoch(1)
    assert torch.equal(data[4]["labels"], again[0]["labels"]) and data[4]["pattern"] == 1
    assert not torch.equal(data[4]["labels"], first[4]), "another pattern"
    other_seed = StaticMaskedBlocks(blocks, vocab, MaskingConfig(duplication=3, seed=8), first_block=10)
    assert not torch.equal(other_seed[0]["labels"], first[0])
    chosen = first[0] != IGNORE_INDEX
    assert 0 < chosen.sum() < len(ids) and not vocab.special[torch.tensor(ids)][chosen].any()
    batch = collate_masked_blocks([data[0], {**data[1], "input_ids": data[1]["input_ids"][:5],
                                             "labels": data[1]["labels"][:5]}], tokenizer.pad_token_id)
    assert batch["labels"][1, 5:].eq(IGNORE_INDEX).all() and batch["attention_mask"][1].sum() == 5
    assert batch["block"].tolist() == [10, 11] and batch["pattern"].tolist() == [1, 1]
