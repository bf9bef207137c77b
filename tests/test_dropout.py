"""The CPU's fast dropout (biodistil.models.dropout): its drop rate and scale, its gradient, its seeding, and the swap
of a model's nn.Dropout modules that `train.dropout: fast` makes."""

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForTokenClassification

from biodistil.models.dropout import FastDropout, drop_threshold, fast_dropout, keep_mask, use_fast_dropout
from biodistil.training.engine import choose_dropout


def test_the_threshold_is_p_in_units_of_2_to_the_15():
    assert drop_threshold(0.1) == 3277 and drop_threshold(0.0) == 0 and drop_threshold(1.0) == 2**15
    assert drop_threshold(0.5) == 16384


def test_kept_elements_are_scaled_by_the_inverse_keep_rate_and_dropped_ones_are_zero():
    torch.manual_seed(0)
    x = torch.rand(200, 300) + 1.0  # no zeros of its own
    y = fast_dropout(x, 0.1)
    kept = y != 0
    scale = 2**15 / (2**15 - 3277)  # 1 / (1 - p'), p' = 3277 / 32768
    assert torch.allclose(y[kept], x[kept] * scale, rtol=1e-6)
    assert 0.09 < 1 - kept.float().mean().item() < 0.11


def test_the_drop_rate_is_p_prime_in_every_field_of_the_word():
    """Each 64-bit word gives four fields; the top one has a bit fewer (PyTorch's int64 random_ is on [0, 2^63)),
    so all are read as 15 bits: every field position drops at p' (n = 250,000 per position, sd 0.0006)."""
    torch.manual_seed(1)
    keep = keep_mask(torch.Size([1_000_000]), 0.25)
    for position in range(4):
        dropped = 1 - keep[position::4].float().mean().item()
        assert abs(dropped - 0.25) < 0.004, (position, dropped)


def test_the_mask_follows_the_default_generator():
    torch.manual_seed(3)
    first = keep_mask(torch.Size([64, 64]), 0.1)
    torch.manual_seed(3)
    assert torch.equal(first, keep_mask(torch.Size([64, 64]), 0.1)), "a seeded run repeats its masks"
    assert not torch.equal(first, keep_mask(torch.Size([64, 64]), 0.1)), "the next draw differs"


def test_the_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(4)
    x = torch.randn(32, 48, requires_grad=True)
    torch.manual_seed(5)
    y = fast_dropout(x, 0.2)
    y.sum().backward()
    torch.manual_seed(5)
    expected = keep_mask(x.shape, 0.2).float() * (2**15 / (2**15 - drop_threshold(0.2)))
    assert torch.equal(x.grad, expected)


def test_fast_dropout_is_the_identity_in_evaluation_and_at_p_0_and_keeps_bf16():
    layer = FastDropout(0.1)
    x = torch.randn(8, 16)
    assert torch.equal(layer.eval()(x), x)
    assert torch.equal(FastDropout(0.0).train()(x), x)
    half = layer.train()(x.bfloat16())
    assert half.dtype == torch.bfloat16 and (half == 0).any()
    assert torch.equal(FastDropout(1.0).train()(x), torch.zeros_like(x))


def tiny_bert() -> BertForTokenClassification:
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=3)
    return BertForTokenClassification(config)


def test_a_models_dropouts_are_swapped_in_place_with_nothing_else_changed():
    model = tiny_bert()
    keys = set(model.state_dict())
    before = sum(type(m) is nn.Dropout for m in model.modules())
    assert before > 0 and use_fast_dropout(model) == before
    assert sum(isinstance(m, FastDropout) for m in model.modules()) == before
    assert not any(type(m) is nn.Dropout for m in model.modules())
    assert set(model.state_dict()) == keys and use_fast_dropout(model) == 0, "swapped once"
    ids = torch.randint(0, 50, (4, 12))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits), "evaluation is deterministic"
    model.train()
    torch.manual_seed(0)
    first = model(input_ids=ids).logits
    torch.manual_seed(0)
    assert torch.equal(first, model(input_ids=ids).logits), "training masks follow the seed"


@pytest.mark.parametrize("setting", ["fast", "torch"])
def test_train_dropout_chooses_on_the_cpu_and_leaves_a_gpu_to_pytorch(setting):
    model = tiny_bert()
    note = choose_dropout(setting, model, torch.device("cpu"))
    assert note.startswith(setting)
    assert any(isinstance(m, FastDropout) for m in model.modules()) == (setting == "fast")
    other = tiny_bert()
    assert choose_dropout("fast", other, torch.device("cuda")) == "PyTorch's (on a GPU)"
    assert not any(isinstance(m, FastDropout) for m in other.modules())
