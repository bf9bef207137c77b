"""The engine on a toy regression module: accumulation, selection of the best weights, early stopping."""

import torch
from torch import nn

from biodistil.config import TrainConfig
from biodistil.training.engine import Engine, Selection


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)

    def forward(self, batch):
        loss = ((self.linear(batch["x"]).squeeze(-1) - batch["y"]) ** 2).mean()
        return loss, {"mse": loss.detach()}


def toy_data(n=64):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return [{"x": x[i], "y": y[i], "attention_mask": torch.ones(1)} for i in range(n)]


def collate(items):
    return {key: torch.stack([item[key] for item in items]) for key in items[0]}


def config(**overrides) -> TrainConfig:
    base = {"max_steps": 8, "batch_size": 8, "learning_rate": 0.05, "warmup_steps": 0, "schedule": "constant",
            "weight_decay": 0.0, "eval_every": 0, "save_every": 0, "tensorboard": False, "progress_bar": False,
            "max_grad_norm": None}
    return TrainConfig(**{**base, **overrides})


def test_accumulation_matches_one_large_batch(tmp_path):
    # one optimizer step over the same 8 samples: one batch of 8, or two accumulated micro-batches of 4
    one, two = Regression(), Regression()
    data = toy_data(8)
    Engine(config(max_steps=1, batch_size=8), tmp_path / "c", seed=5).fit(one, data, collate)
    Engine(config(max_steps=1, batch_size=4, grad_accumulation=2), tmp_path / "d", seed=5).fit(two, data, collate)
    assert not torch.equal(one.linear.weight, Regression().linear.weight), "the step changed the weights"
    assert torch.allclose(one.linear.weight, two.linear.weight, atol=1e-6)


def test_selection_restores_best_weights_and_stops_early(tmp_path):
    scores = iter([0.5, 0.9, 0.7, 0.6, 0.4, 0.3])
    seen_weights = []

    def evaluate(module):
        seen_weights.append(module.linear.weight.detach().clone())
        return {"f1": next(scores)}

    module = Regression()
    engine = Engine(config(max_steps=12, eval_every=2), tmp_path / "run", seed=5)
    result = engine.fit(module, toy_data(), collate, evaluate_fn=evaluate,
                        selection=Selection(metric="f1", mode="max", patience=2))
    assert result.best_step == 4 and result.best_score == 0.9
    assert result.steps == 8, "two evaluations without gain after step 4: stop at step 8"
    assert torch.equal(module.linear.weight, seen_weights[1]), "the best weights are restored"
