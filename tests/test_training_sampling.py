"""Length-grouped epoch order: a permutation, reproducible, batches of similar lengths, used by the engine."""

import random

import torch
from torch import nn

from biodistil.config import TrainConfig
from biodistil.data.batch import Batch
from biodistil.training.engine import Engine, TrainData
from biodistil.training.sampling import length_grouped_order


def lengths(n: int = 1000, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(5, 120) for _ in range(n)]


def padding_share(sizes: list[int], order: torch.Tensor, batch: int) -> float:
    batches = [order[i:i + batch].tolist() for i in range(0, len(order) - batch + 1, batch)]
    real = sum(sizes[i] for b in batches for i in b)
    return 1 - real / sum(max(sizes[i] for i in b) * len(b) for b in batches)


def test_the_order_is_a_reproducible_permutation_with_little_padding():
    sizes = lengths()
    order = length_grouped_order(sizes, 32, torch.Generator().manual_seed(3), megabatch=10)
    assert sorted(order.tolist()) == list(range(len(sizes)))
    assert torch.equal(order, length_grouped_order(sizes, 32, torch.Generator().manual_seed(3), megabatch=10))
    assert not torch.equal(order, length_grouped_order(sizes, 32, torch.Generator().manual_seed(4), megabatch=10))
    random_order = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(3))
    assert padding_share(sizes, random_order, 32) > 0.3  # uniform 5..120: a random batch of 32 pads ~45%
    assert padding_share(sizes, order, 32) < 0.15  # 320 lengths per mega-batch: neighbours differ little


def test_partial_batches_come_last_and_full_batches_are_shuffled():
    sizes = lengths(100)
    order = length_grouped_order(sizes, 32, torch.Generator().manual_seed(0), megabatch=2)
    # mega-batches of 64 and 36 examples: batches of 32, 32, 32 and one of 4, which goes last
    assert len(order) == 100 and len(set(order[96:].tolist()) & set(order[:96].tolist())) == 0
    orders = {tuple(length_grouped_order(sizes, 32, torch.Generator().manual_seed(s), 2)[:96:32].tolist())
              for s in range(6)}
    assert len(orders) > 1


class Recorder(nn.Module):
    """Records the unpadded lengths of every batch it sees."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))
        self.seen: list[list[int]] = []

    def forward(self, batch):
        self.seen.append(batch.attention_mask.sum(1).tolist())
        return (self.weight - 1) ** 2, {}


def collate(items):
    width = max(len(item["input_ids"]) for item in items)
    ids = [item["input_ids"] + [0] * (width - len(item["input_ids"])) for item in items]
    mask = [[1] * len(item["input_ids"]) + [0] * (width - len(item["input_ids"])) for item in items]
    return Batch({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})


def test_the_engine_batches_by_length_when_asked(tmp_path):
    data = [{"input_ids": [1] * size} for size in lengths(64)]
    cfg = TrainConfig(max_steps=8, batch_size=8, eval_every=0, save_every=0, tensorboard=False, progress_bar=False,
                      group_by_length=True)
    module = Recorder()
    Engine(cfg, tmp_path / "run", seed=1).fit(module, TrainData(data, collate))
    spreads = [max(batch) - min(batch) for batch in module.seen]
    assert len(module.seen) == 8 and max(spreads) < 30  # 64 lengths in 5..120, sorted within one mega-batch
    assert sorted(size for batch in module.seen for size in batch) == sorted(lengths(64))
