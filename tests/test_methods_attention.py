"""Attention under fast kernels: hooked Q/K recomputation equals eager attention, only inspected layers are
hooked, and attention losses ignore padding end to end."""

import copy

import pytest
import torch
from numerics import CLOSE, perturbed
from transformers import AutoConfig, AutoModelForMaskedLM

from biodistil.config import ObjectiveConfig, TermConfig
from biodistil.data.batch import Batch
from biodistil.losses.layers import attention_kl_loss, attention_mse_loss, minilm_relations_loss
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.models.attention import attention_probabilities, attention_scores
from biodistil.models.families import head_only, layer_list, mlm_logits, qkv_modules
from biodistil.models.features import FeatureRequest, extract_features
from biodistil.models.logits import LinearRows
from biodistil.models.qkv import split_heads
from biodistil.models.student import student_from_teacher_layers

TINY = {
    "bert": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 64},
    "roberta": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 64,
                "max_position_embeddings": 40, "pad_token_id": 1},
    "distilbert": {"dim": 32, "n_layers": 3, "n_heads": 4, "hidden_dim": 64},
    "mobilebert": {"hidden_size": 32, "embedding_size": 16, "true_hidden_size": 16, "intra_bottleneck_size": 16,
                   "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 32,
                   "num_feedforward_networks": 2},
}


def padded_batch(vocab: int = 100, seed: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, vocab, (2, 9), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_head_rows_give_the_models_own_logits(model_type):
    """Each family's head split (decoder input, weight, bias) reproduces the model's own MLM logits."""
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(AutoConfig.for_model(model_type, vocab_size=100, **TINY[model_type]))
    model.eval()
    batch = padded_batch()
    real = batch["attention_mask"].bool()
    features = extract_features(model, batch, FeatureRequest(logits=True), real)
    rows = features.logits
    assert isinstance(rows.source, LinearRows) and rows.positions is real and rows.at(real) is rows
    with torch.no_grad():
        reference = model(**batch).logits[real]
    logits = rows.logits()
    assert torch.allclose(logits, reference, rtol=1e-4, atol=1e-5)
    assert torch.allclose(rows.source.logits(), reference, rtol=1e-4, atol=1e-5)
    assert rows.at(real).logits() is logits, "once formed, the logits are read, not formed again"
    first = real & (torch.arange(9) < 3)
    assert torch.allclose(rows.at(first).logits(), reference[first[real]], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_head_only_keeps_the_logits_and_drops_the_layers(model_type):
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(AutoConfig.for_model(model_type, vocab_size=100, **TINY[model_type]))
    model.eval()
    hidden = torch.randn(5, model.config.to_dict().get("hidden_size") or model.config.dim)
    with torch.no_grad():
        expected = mlm_logits(model, hidden)
    head = head_only(copy.deepcopy(model))
    kept = {name for name, param in head.named_parameters() if not param.is_meta}
    assert not any(".layer." in name for name in kept), "every transformer layer leaves memory"
    with torch.no_grad():
        assert torch.equal(mlm_logits(head, hidden), expected)


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_hooked_attention_equals_eager_attention(model_type):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=100, **TINY[model_type])
    fast = AutoModelForMaskedLM.from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    eager = AutoModelForMaskedLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    eager.load_state_dict(fast.state_dict())
    batch = padded_batch()
    features = extract_features(fast, batch, FeatureRequest(attentions={1, -1}), None)
    assert fast.config._attn_implementation == "sdpa", "the model keeps its fast kernel"
    with torch.no_grad():
        reference = eager(**batch, output_attentions=True).attentions
    real = batch["attention_mask"].bool()
    pairs = (real[:, None, :, None] & real[:, None, None, :]).expand_as(reference[0])
    for layer in (1, 3):
        assert torch.allclose(features.attentions[layer][pairs], reference[layer - 1][pairs], atol=1e-6)
    # padded key columns get exactly zero probability, as in the model's own attention
    assert features.attentions[3][1, :, :, 5:].abs().max() == 0


def test_attention_scores_by_hand():
    # 2 heads of width d = 4 (√d = 2). Query token 0 = (2,0,0,0 | 0,0,0,4); keys (1,0,0,0 | 0,0,0,1) and
    # (0,1,0,0 | 0,0,0,3): head 0 → (2/2, 0) = (1, 0); head 1 → (4/2, 12/2) = (2, 6). Query token 1 is 0.
    query = split_heads(torch.tensor([[[2.0, 0, 0, 0, 0, 0, 0, 4], [0.0] * 8]]), num_heads=2)
    key = split_heads(torch.tensor([[[1.0, 0, 0, 0, 0, 0, 0, 1], [0.0, 1, 0, 0, 0, 0, 0, 3]]]), num_heads=2)
    scores = attention_scores(query, key)
    expected = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]], [[2.0, 6.0], [0.0, 0.0]]]])
    assert scores.shape == (1, 2, 2, 2) and torch.equal(scores, expected)
    # the probabilities are their softmax over the real keys: with key 1 padded, all weight on key 0
    probabilities = attention_probabilities(query, key, torch.tensor([[True, False]]))
    assert torch.equal(probabilities[..., 0], torch.ones(1, 2, 2)) and torch.equal(probabilities[..., 1],
                                                                                     torch.zeros(1, 2, 2))


def test_only_inspected_layers_are_hooked_and_hooks_are_removed(teacher):
    seen = []
    original = teacher.bert.encoder.layer[1].attention.self.query.forward
    for index, block in enumerate(layer_list(teacher), start=1):  # record how many capture hooks are active
        query = block.attention.self.query
        query.register_forward_pre_hook(lambda m, a, i=index: seen.append((i, len(m._forward_hooks))))
    batch = padded_batch(vocab=200)
    features = extract_features(teacher.eval(), batch, FeatureRequest(attentions={2}, qkv={4}), None)
    assert set(features.attentions) == {2} and set(features.qkv) == {4}
    assert set(features.qkv[4]) == {"q", "k", "v"} and features.qkv[4]["v"].shape == (2, 9, 32)
    assert seen == [(1, 0), (2, 1), (3, 0), (4, 1)], "one forward; capture hooks only on inspected layers"
    for layer in range(1, 5):
        for module in qkv_modules(teacher, layer):
            assert not module._forward_hooks, "capture hooks are removed after the forward"
    assert teacher.bert.encoder.layer[1].attention.self.query.forward == original


def test_attention_gradient_reaches_student_queries_not_teacher(teacher):
    student = student_from_teacher_layers(teacher, [0, 2])
    cfg = ObjectiveConfig(terms=[TermConfig(loss="attention_kl", layer_map="uniform")])
    module = MaskedLMModule(student, Objective(cfg, student, teacher), teacher)
    batch = Batch(padded_batch(vocab=200), torch.full((2, 9), -100))
    loss, _ = module(batch)
    loss.backward()
    assert student.bert.encoder.layer[1].attention.self.key.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())


def _attention_losses(student, teacher, batch) -> list[float]:
    request = FeatureRequest(attentions={1, 2}, qkv={2}, attention_scores={1})
    t_request = FeatureRequest(attentions={2, 4}, qkv={4}, attention_scores={2})
    s = extract_features(student, batch, request, None)
    with torch.no_grad():
        t = extract_features(teacher, batch, t_request, None)
    mask = batch["attention_mask"].bool()
    return [
        attention_mse_loss(s.attentions[1], t.attentions[2], mask).item(),
        attention_mse_loss(s.attention_scores[1], t.attention_scores[2], mask).item(),
        attention_kl_loss(s.attentions[2], t.attentions[4], mask).item(),
        attention_kl_loss(s.attentions[2], t.attentions[4], mask, reduction="sum").item(),
        minilm_relations_loss(s.qkv[2], t.qkv[4], mask, num_relation_heads=2).item(),
    ]


def test_attention_losses_ignore_padding_end_to_end(teacher):
    teacher.eval()
    student = perturbed(student_from_teacher_layers(teacher, [1, 3]), seed=3).eval()
    batch = padded_batch(vocab=200)
    before = _attention_losses(student, teacher, batch)
    assert min(before) > 1e-3, f"a student unlike its teacher: losses far above rounding noise, got {before}"
    # other ids at padded positions, and three more padded columns: the same losses up to float32 rounding
    # (a longer batch runs other kernel shapes, so not bit for bit)
    changed = {"input_ids": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 17),
               "attention_mask": batch["attention_mask"]}
    longer = {key: torch.cat([value, torch.zeros(2, 3, dtype=value.dtype)], dim=1) for key, value in batch.items()}
    for other in (changed, longer):
        assert _attention_losses(student, teacher, other) == pytest.approx(before, **CLOSE)


def test_layer_objective_ignores_padding_end_to_end(teacher):
    terms = [TermConfig(loss="hidden_mse", layer_map="uniform"), TermConfig(loss="attention_mse", layer_map="uniform"),
             TermConfig(loss="attention_mse", layer_map="uniform", attention_map="scores"),
             TermConfig(loss="attention_kl", layer_map="uniform", token_reduction="sum"),
             TermConfig(loss="minilm_relations", num_relation_heads=2), TermConfig(loss="soft_ce")]
    student = perturbed(student_from_teacher_layers(teacher, [0, 2]), seed=4)
    module = MaskedLMModule(student, Objective(ObjectiveConfig(terms=terms), student, teacher), teacher).eval()
    batch = Batch(padded_batch(vocab=200), torch.full((2, 9), -100))
    changed = batch.replace(inputs={**batch.inputs,
                                    "input_ids": batch.input_ids.masked_fill(batch.attention_mask == 0, 23)})
    _, logs = module(batch)
    _, logs_changed = module(changed)
    assert len(logs) == len(terms)
    for name, value in logs.items():
        assert value.item() > 1e-3, name
        assert logs_changed[name].item() == pytest.approx(value.item(), **CLOSE), name
