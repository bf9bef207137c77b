"""`bench/research/int8_fakequant.py`: the fake-quantisers against values worked out by hand, and the patching it
relies on."""


import pytest
import torch


@pytest.fixture
def fakequant(bench_script):
    return bench_script("int8_fakequant")


def test_weights_are_symmetric_int8_per_output_channel(fakequant):
    weight = torch.tensor([[1.0, -0.49, 0.26], [0.0, 2.0, -0.01]])
    # row 0: scale 1/127, −0.49·127 = −62.23 → −62, 0.26·127 = 33.02 → 33; row 1: scale 2/127, −0.01·63.5 = −0.635 → −1
    expected = torch.tensor([[1.0, -62 / 127, 33 / 127], [0.0, 2.0, -2 / 127]])
    torch.testing.assert_close(fakequant.weight_int8(weight), expected, atol=1e-6, rtol=0)


def test_per_tensor_and_per_token_activations_by_hand(fakequant):
    x = torch.tensor([[0.0, 1.0, 2.55], [-0.1, 0.05, 0.1]])
    # per tensor: range [−0.1, 2.55], scale 2.65/255, zero point round(0.1·255/2.65) = round(9.62) = 10
    scale = 2.65 / 255
    tensor = ((x / scale).round() + 10).clamp(0, 255).sub(10) * scale
    torch.testing.assert_close(fakequant.activation(x, "per-tensor"), tensor, atol=1e-6, rtol=0)
    # per token: row 0 is [0, 2.55] with scale 0.01 (exact); row 1 [−0.1, 0.1], scale 0.2/255, zero point 128 (127.5)
    token = fakequant.activation(x, "per-token")
    torch.testing.assert_close(token[0], x[0], atol=1e-6, rtol=0)
    row_scale = 0.2 / 255
    expected_row = ((x[1] / row_scale).round() + 128).clamp(0, 255).sub(128) * row_scale
    torch.testing.assert_close(token[1], expected_row, atol=1e-7, rtol=0)
    assert (token[1] - x[1]).abs().max() <= row_scale  # a row's own range: finer than the tensor's
    symmetric = fakequant.activation(x, "per-token-sym")
    torch.testing.assert_close(symmetric[1], (x[1] / (0.1 / 127)).round() * (0.1 / 127), atol=1e-7, rtol=0)
    assert torch.equal(fakequant.activation(x, "fp32"), x)


def test_rules_pick_the_last_matching_pattern(fakequant):
    rule = fakequant.rule_for("per-tensor,layer.0.=fp32,layer.0.output=per-token")
    assert rule("encoder.layer.1.output.dense") == "per-tensor"
    assert rule("encoder.layer.0.attention.self.query") == "fp32"
    assert rule("encoder.layer.0.output.dense") == "per-token"


def test_fake_quantised_patches_only_the_chosen_layers_and_restores_them(fakequant):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 8) * torch.tensor([1, 1, 1, 1, 1, 1, 1, 40.0])  # one outlier channel
    exact = model(x)
    with fakequant.fake_quantised(model, fakequant.rule_for("fp32"), None, 0.0):
        assert torch.equal(model(x), exact)
    with fakequant.fake_quantised(model, fakequant.rule_for("per-tensor,2=fp32"), None, 0.0):
        first_only = model(x)
    expected = model[2](model[1](torch.nn.functional.linear(fakequant.activation(x, "per-tensor"),
                                                            fakequant.weight_int8(model[0].weight), model[0].bias)))
    torch.testing.assert_close(first_only, expected)
    assert (first_only - exact).abs().max() > 1e-4
    # SmoothQuant's migration is exact before rounding: with fp32 activations only the weights' rounding remains
    maxima = {"0": x.abs().amax(0), "2": torch.ones(8)}
    with fakequant.fake_quantised(model, fakequant.rule_for("fp32,0=per-token"), maxima, 0.5):
        smoothed = model(x)
    assert (smoothed - exact).abs().max() < 0.05 * exact.abs().max()
    assert torch.equal(model(x), exact)


class _Block(torch.nn.Module):
    """A LayerNorm feeding two Linears (as Q and K), and a Linear fed by a ReLU."""

    def __init__(self):
        super().__init__()
        self.norm, self.q, self.k = torch.nn.LayerNorm(4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        hidden = self.norm(x)
        return self.out(torch.relu(self.q(hidden) + self.k(hidden)))


def test_shared_and_foldable_migrations_follow_the_linears_inputs(fakequant):
    """`linear_inputs` finds that q and k read one LayerNorm output and `out` a ReLU's; `shared` divides q's and k's
    migration by the larger |W| column of the two, `foldable` migrates only the Linears a LayerNorm feeds."""
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(3, 4)
    inputs = fakequant.linear_inputs(block, lambda: block(x))
    assert inputs["q"] == inputs["k"] and inputs["q"][1]
    assert not inputs["out"][1] and inputs["out"][0] != inputs["q"][0]
    linears = {"q": block.q, "k": block.k, "out": block.out}
    q_max, k_max = block.q.weight.abs().amax(0), block.k.weight.abs().amax(0)
    each, migrated = fakequant.migration_plan(linears, inputs, "each")
    assert torch.equal(each["q"], q_max) and torch.equal(each["k"], k_max) and migrated == {"q", "k", "out"}
    shared, migrated = fakequant.migration_plan(linears, inputs, "shared")
    assert torch.equal(shared["q"], torch.maximum(q_max, k_max)) and torch.equal(shared["k"], shared["q"])
    assert torch.equal(shared["out"], block.out.weight.abs().amax(0)) and migrated == {"q", "k", "out"}
    _, migrated = fakequant.migration_plan(linears, inputs, "foldable")
    assert migrated == {"q", "k"}
    # under `foldable`, `out` (quantised here, q and k left in fp32) runs exactly as without any migration; under
    # `shared` it is migrated, so its rounding differs
    maxima = {name: x.abs().amax(0) * 3 for name in linears}
    rule = fakequant.rule_for("fp32,out=per-tensor")
    runs = {}
    for mode, given in (("foldable", maxima), ("shared", maxima), ("none", None)):
        with fakequant.fake_quantised(block, rule, given, 0.5, inputs, "each" if given is None else mode):
            runs[mode] = block(x)
    assert torch.equal(runs["foldable"], runs["none"]) and not torch.equal(runs["shared"], runs["none"])
