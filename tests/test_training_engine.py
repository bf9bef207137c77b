"""The engine on a toy regression module: accumulation, selection of the best weights, early stopping."""

import torch
from torch import nn

from biodistil.config import TrainConfig
from biodistil.data.batch import Batch
from biodistil.training.engine import Engine, HeldOut, Selection, TrainData, adamw


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)

    def forward(self, batch):
        loss = ((self.linear(batch.inputs["x"]).squeeze(-1) - batch.inputs["y"]) ** 2).mean()
        return loss, {"mse": loss.detach()}


def toy_data(n=64):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return [{"x": x[i], "y": y[i], "attention_mask": torch.ones(1)} for i in range(n)]


def collate(items):
    return Batch({key: torch.stack([item[key] for item in items]) for key in items[0]})


def config(**overrides) -> TrainConfig:
    base = {"max_steps": 8, "batch_size": 8, "learning_rate": 0.05, "warmup_steps": 0, "schedule": "constant",
            "weight_decay": 0.0, "eval_every": 0, "save_every": 0, "tensorboard": False, "progress_bar": False,
            "max_grad_norm": None, "precision": "no"}  # float32: bf16 autocast rounds batches of 4 and 8 apart
    return TrainConfig(**{**base, **overrides})


def test_accumulation_matches_one_large_batch(tmp_path):
    # optimizer steps over the same 8 samples each: one batch of 8, or two accumulated micro-batches of 4 (3 steps:
    # a first Adam step moves each weight by ±lr whatever the gradient's scale)
    one, two = Regression(), Regression()
    data = toy_data(24)
    Engine(config(max_steps=3, batch_size=8), tmp_path / "c", seed=5).fit(one, TrainData(data, collate))
    Engine(config(max_steps=3, batch_size=4, grad_accumulation=2), tmp_path / "d", seed=5).fit(
        two, TrainData(data, collate))
    assert not torch.equal(one.linear.weight, Regression().linear.weight), "the step changed the weights"
    assert torch.allclose(one.linear.weight, two.linear.weight, atol=1e-6)


class MaskedRegression(Regression):
    """A loss that is a mean over a varying number of items per batch (like a token task's labelled tokens)."""

    def forward(self, batch):
        errors = (self.linear(batch.inputs["x"]).squeeze(-1) - batch.inputs["y"]) ** 2
        loss = (errors * batch.inputs["keep"]).sum() / batch.inputs["keep"].sum()
        return loss, {}

    def loss_items(self, batch):
        return int(batch.inputs["keep"].sum())


def test_accumulation_weighs_micro_batches_by_their_items_when_the_module_counts_them(tmp_path):
    # samples hold 0 or 1 item: micro-batches of 4 hold different numbers of items, and a mean of their means would
    # weigh a lone item as much as several; each step's loss must be the mean over its 8 samples' items, as in one
    # batch (3 steps: a first Adam step moves each weight by ±lr whatever the gradient's scale)
    data = [{**row, "keep": torch.tensor(float(i % 3 != 0))} for i, row in enumerate(toy_data(24))]
    one, two = MaskedRegression(), MaskedRegression()
    Engine(config(max_steps=3, batch_size=8), tmp_path / "c", seed=5).fit(one, TrainData(data, collate))
    Engine(config(max_steps=3, batch_size=4, grad_accumulation=2), tmp_path / "d", seed=5).fit(
        two, TrainData(data, collate))
    assert not torch.equal(one.linear.weight, Regression().linear.weight), "the step changed the weights"
    assert torch.allclose(one.linear.weight, two.linear.weight, atol=1e-6)
    mean_of_means = MeanOfMeans()
    Engine(config(max_steps=3, batch_size=4, grad_accumulation=2), tmp_path / "e", seed=5).fit(
        mean_of_means, TrainData(data, collate))
    assert (mean_of_means.linear.weight - one.linear.weight).abs().max() > 1e-3


class MeanOfMeans(MaskedRegression):
    loss_items = None  # the engine's default: each micro-batch weighs 1 / grad_accumulation


def test_selection_restores_best_weights_and_stops_early(tmp_path):
    scores = iter([0.5, 0.9, 0.7, 0.6, 0.4, 0.3])
    seen_weights = []

    def evaluate(module):
        seen_weights.append(module.linear.weight.detach().clone())
        return {"f1": next(scores)}

    module = Regression()
    engine = Engine(config(max_steps=12, eval_every=2), tmp_path / "run", seed=5)
    result = engine.fit(module, TrainData(toy_data(), collate),
                        HeldOut(evaluate, Selection(metric="f1", mode="max", patience=2)))
    assert result.best_step == 4 and result.best_score == 0.9
    assert result.steps == 8, "two evaluations without gain after step 4: stop at step 8"
    assert torch.equal(module.linear.weight, seen_weights[1]), "the best weights are restored"


class Noisy(Regression):
    """The regression, on inputs its hook shifted by generator noise; records where the hook ran."""

    def forward(self, batch):
        loss, logs = super().forward(batch)
        return loss, {**logs, "shift": batch.inputs["shift"].mean()}


def shift_inputs(batch, generator):
    assert batch.inputs["x"].device.type == "cpu", "the hook runs in the data-loading stage, on the CPU"
    shift = torch.rand(batch.inputs["x"].shape, generator=generator) * 0.1
    return batch.replace(inputs={**batch.inputs, "x": batch.inputs["x"] + shift, "shift": shift})


def test_hook_runs_while_loading_and_worker_processes_give_the_same_run(tmp_path):
    weights = []
    loaders = []
    for workers in ("auto", 1):  # auto: none on a CPU; one worker, prefetching its batches
        module = Noisy()
        loaders.append(Engine(config(num_workers=workers, max_steps=6), tmp_path / f"w{workers}", seed=5).fit(
            module, TrainData(toy_data(), collate, prepare=shift_inputs)).loader)
        weights.append(module.linear.weight.detach().clone())
    assert torch.allclose(weights[0], weights[1], rtol=1e-5, atol=1e-7)
    assert loaders == ["auto: in the training process on a CPU", "1 (as asked); 4 batches prefetched each"]


def test_grad_norm_and_losses_are_logged_at_log_steps(tmp_path):
    import json

    Engine(config(max_steps=6, log_every=3, max_grad_norm=1.0), tmp_path / "run", seed=5).fit(
        Regression(), TrainData(toy_data(), collate))
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train] == [3, 6]
    assert all(r["grad_norm"] > 0 and r["mse"] == r["loss"] and "_step" not in r for r in train)


class Epochs(list):
    """Toy data that records the epochs the engine announces."""

    def __init__(self, items):
        super().__init__(items)
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)


def test_a_dataset_hears_each_epoch_before_its_batches(tmp_path):
    data = Epochs(toy_data(16))
    Engine(config(max_steps=5), tmp_path / "run", seed=5).fit(Regression(), TrainData(data, collate))
    assert data.epochs == [0, 1, 2]  # 2 batches of 8 per epoch


class Diverging(Regression):
    def forward(self, batch):
        loss, logs = super().forward(batch)
        self.calls = getattr(self, "calls", 0) + 1
        return (loss * float("nan") if self.calls == 3 else loss), logs


def test_a_non_finite_loss_stops_the_run_before_anything_is_saved(tmp_path):
    import pytest

    from biodistil.errors import BiodistilError

    with pytest.raises(BiodistilError, match="Loss became nan at step 3"):
        Engine(config(max_steps=8, save_every=4, log_every=4), tmp_path / "run", seed=5).fit(
            Diverging(), TrainData(toy_data(), collate))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_engine_optimizer_is_one_fused_adamw_decaying_matrices_only():
    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear, self.frozen, self.excluded = nn.Linear(3, 2), nn.Linear(2, 2), nn.Linear(2, 1)
            self.frozen.requires_grad_(False)

    model = Small()
    optimizer = adamw(model, config(learning_rate=0.1, weight_decay=0.5),
                      exclude={id(p) for p in model.excluded.parameters()})
    decay, no_decay = optimizer.param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([2, 3])] and decay["weight_decay"] == 0.5
    assert [p.shape for p in no_decay["params"]] == [torch.Size([2])] and no_decay["weight_decay"] == 0.0
    assert all(group["fused"] for group in optimizer.param_groups)
    weight, bias = model.linear.weight.detach().clone(), model.linear.bias.detach().clone()
    model.linear.weight.grad = torch.full((2, 3), 2.0)
    model.linear.bias.grad = torch.full((2,), -4.0)
    optimizer.step()
    # AdamW's first step: m̂ = g, v̂ = g², so each weight moves by lr·g/(|g| + ε) = ±0.1, after decay by lr·λ = 5%
    assert torch.allclose(model.linear.weight, weight * (1 - 0.1 * 0.5) - 0.1, atol=1e-5)
    assert torch.allclose(model.linear.bias, bias + 0.1, atol=1e-5)
