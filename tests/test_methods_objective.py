"""Objective terms on real models: layer maps, projections, attention terms, relations, hinge, positions; task
terms are not for masked-LM objectives."""

import copy
import math

import pytest
import torch
from numerics import CLOSE, perturbed

from biodistil.config import ArchitectureConfig, DistillRecipe, ObjectiveConfig, TermConfig, validate_recipe
from biodistil.data.batch import Batch
from biodistil.errors import BiodistilError
from biodistil.losses.distillation import cosine_embedding_loss, soft_kl_loss
from biodistil.losses.layers import attention_kl_loss, attention_mse_loss, hidden_mse_loss, tolerance_hinge
from biodistil.losses.prediction import soft_cross_entropy_loss
from biodistil.losses.task import logit_mse_loss
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective, TermInputs, position_masks
from biodistil.models.features import Features
from biodistil.models.logits import LogitRows
from biodistil.models.student import model_from_architecture, student_from_teacher_layers

TINYBERT = ObjectiveConfig(temperature=1.0, terms=[
    TermConfig(loss="hidden_mse", student_layer=0, teacher_layer=0),
    TermConfig(loss="hidden_mse", layer_map="uniform"),
    TermConfig(loss="attention_mse", layer_map="uniform", attention_map="scores"),  # TinyBERT's definition
    TermConfig(loss="attention_mse", layer_map="uniform"),  # the same on probabilities
    TermConfig(loss="soft_ce"),
])


def narrow_student(tokenizer, layers=2, width=16, heads=2):
    torch.manual_seed(1)
    return model_from_architecture(ArchitectureConfig(
        num_layers=layers, hidden_size=width, num_heads=heads, intermediate_size=32, max_position_embeddings=64,
        dropout=0.0), tokenizer).eval()


def text_batch(tokenizer):
    enc = tokenizer(["the protein kinase gene expression cell tumour patients", "cancer mice induced"],
                    return_tensors="pt", padding=True)
    labels = enc["input_ids"].clone().masked_fill(enc["attention_mask"] == 0, -100)
    labels[:, ::2] = -100
    return Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, labels)


def eager_outputs(model, batch):
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        return eager(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     output_hidden_states=True, output_attentions=True)


def eager_scores(model, hidden_states, layer: int) -> torch.Tensor:
    """Q·Kᵀ/√d of transformer layer `layer` (1-based) from the eager model's input to that layer, per head."""
    attention = model.bert.encoder.layer[layer - 1].attention.self
    heads = model.config.num_attention_heads
    with torch.no_grad():
        q, k = (module(hidden_states[layer - 1]) for module in (attention.query, attention.key))
    batch, length, width = q.shape
    q = q.view(batch, length, heads, width // heads).transpose(1, 2)
    k = k.view(batch, length, heads, width // heads).transpose(1, 2)
    return q @ k.transpose(-1, -2) / math.sqrt(width // heads)


def test_tinybert_terms_equal_the_equation_with_eager_attention(teacher, tokenizer):
    teacher.eval()
    student = perturbed(narrow_student(tokenizer), seed=5)  # peaked attention, far from the teacher's
    objective = Objective(TINYBERT, student, teacher)
    assert sorted(objective.projections) == ["hidden_mse_s0_t0", "hidden_mse_s1_t2", "hidden_mse_s2_t4"], (
        "W_e and one W_h per mapped layer (uniform map 2 → 4: g(1) = 2, g(2) = 4)")
    module = MaskedLMModule(student, objective, teacher).eval()
    batch = text_batch(tokenizer)
    loss, logs = module(batch)
    s, t = eager_outputs(student, batch), eager_outputs(teacher, batch)
    mask = batch.attention_mask.bool()
    with torch.no_grad():
        emb = hidden_mse_loss(objective.projections["hidden_mse_s0_t0"](s.hidden_states[0]), t.hidden_states[0], mask)
        hid = sum(hidden_mse_loss(objective.projections[f"hidden_mse_s{k}_t{2 * k}"](s.hidden_states[k]),
                                  t.hidden_states[2 * k], mask) for k in (1, 2))
    scores = sum(attention_mse_loss(eager_scores(student, s.hidden_states, k),
                                    eager_scores(teacher, t.hidden_states, 2 * k), mask) for k in (1, 2))
    att = sum(attention_mse_loss(s.attentions[k - 1], t.attentions[2 * k - 1], mask) for k in (1, 2))
    out = soft_cross_entropy_loss(s.logits[mask], t.logits[mask], 1.0)
    expected = {"loss_hidden_mse": emb, "loss_hidden_mse_2": hid, "loss_attention_mse": scores,
                "loss_attention_mse_2": att, "loss_soft_ce": out}
    for name, value in expected.items():  # eager vs SDPA + hooks: equal up to rounding
        assert value.item() > 1e-3, name
        assert logs[name].item() == pytest.approx(value.item(), **CLOSE), name
    assert loss.item() == pytest.approx(sum(expected.values()).item(), **CLOSE)


def test_compact_and_mobile_terms_with_explicit_map_and_mean(teacher, tokenizer):
    teacher.eval()
    student = student_from_teacher_layers(teacher, [0, 2]).eval()
    torch.manual_seed(2)
    with torch.no_grad():  # move the student away from the teacher, so that every term is far from zero
        for param in student.parameters():
            param.add_(0.2 * torch.randn_like(param))
    cfg = ObjectiveConfig(temperature=2.0, terms=[
        TermConfig(loss="hidden_cosine", layer_map=[2, 4], weight=3.0),
        TermConfig(loss="attention_kl", layer_map=[2, 4], weight=3.0),
        TermConfig(loss="hidden_mse", layer_map=[2, 4], layer_reduction="mean"),
        TermConfig(loss="attention_kl", layer_map=[2, 4], layer_reduction="mean", token_reduction="sum"),
        TermConfig(loss="logit_kl", positions="masked"),
    ])
    objective = Objective(cfg, student, teacher)
    assert not objective.projections, "equal widths: no projection"
    module = MaskedLMModule(student, objective, teacher).eval()
    batch = text_batch(tokenizer)
    _, logs = module(batch)
    s, t = eager_outputs(student, batch), eager_outputs(teacher, batch)
    mask = batch.attention_mask.bool()
    pairs = [(1, 2), (2, 4)]
    cos = sum(cosine_embedding_loss(s.hidden_states[a], t.hidden_states[b], mask) for a, b in pairs)
    kl = sum(attention_kl_loss(s.attentions[a - 1], t.attentions[b - 1], mask) for a, b in pairs)
    mse = sum(hidden_mse_loss(s.hidden_states[a], t.hidden_states[b], mask) for a, b in pairs) / 2
    kl_sum = sum(attention_kl_loss(s.attentions[a - 1], t.attentions[b - 1], mask, "sum") for a, b in pairs) / 2
    targets = batch.labels != -100
    soft = soft_kl_loss(s.logits[targets], t.logits[targets], 2.0)
    expected = {"loss_hidden_cosine": cos, "loss_attention_kl": kl, "loss_hidden_mse": mse,
                "loss_attention_kl_2": kl_sum, "loss_logit_kl": soft}
    for name, value in expected.items():
        assert logs[name].item() == pytest.approx(value.item(), rel=1e-4), name
        assert value.item() > 1e-3, name


def test_minilm_relations_across_widths_and_heads(teacher, tokenizer):
    student = narrow_student(tokenizer, layers=2, width=16, heads=4)
    cfg = ObjectiveConfig(terms=[TermConfig(loss="minilm_relations", teacher_layer=3, num_relation_heads=4)])
    module = MaskedLMModule(student, Objective(cfg, student, teacher), teacher)
    loss, logs = module(text_batch(tokenizer))
    assert loss.item() > 0 and set(logs) == {"loss_minilm_relations"}
    loss.backward()
    for block in student.bert.encoder.layer:
        assert block.attention.self.value.weight.grad.abs().sum() > 0
    assert module.objective.teacher_request().qkv == {3} and module.objective.student_request().qkv == {2}


def test_recipe_errors_name_the_problem(teacher, tokenizer):
    student = narrow_student(tokenizer, heads=4)
    with pytest.raises(BiodistilError, match="4 heads and the teacher 2"):
        Objective(ObjectiveConfig(terms=[TermConfig(loss="attention_mse", layer_map="uniform")]), student, teacher)
    with pytest.raises(BiodistilError, match="num_relation_heads=3"):
        Objective(ObjectiveConfig(terms=[TermConfig(loss="minilm_relations", num_relation_heads=3)]), student, teacher)
    with pytest.raises(BiodistilError, match="lists 3 teacher layers, but the student has 2"):
        Objective(ObjectiveConfig(terms=[TermConfig(loss="hidden_mse", layer_map=[1, 2, 3])]), student, teacher)
    with pytest.raises(BiodistilError, match=r"hidden_mse.*outside"):
        Objective(ObjectiveConfig(terms=[TermConfig(loss="hidden_mse", teacher_layer=9)]), student, teacher)
    base = {"teacher": {"name_or_path": "t"}, "data": {"train": ["c"]}}
    for term, needle in (({"loss": "logit_kl", "layer_map": "uniform"}, "layer_map applies to"),
                         ({"loss": "mlm", "hinge_weight": 2.0}, "hinge_weight needs epsilon"),
                         ({"loss": "minilm_relations", "relations": ["q", "q"]}, "distinct"),
                         ({"loss": "hidden_mse", "layer_mapp": "uniform"}, "unknown key"),
                         ({"loss": "attention_mse", "layer_map": "every"}, "layer_map")):
        with pytest.raises(BiodistilError, match=needle):
            validate_recipe(DistillRecipe, {**base, "objective": {"terms": [term]}})
    for term, needle in (({"loss": "logit_kl", "vocab_reduction": "sum"}, "vocab_reduction applies to logit_mse"),
                         ({"loss": "attention_kl", "attention_map": "scores"}, "applies to attention_mse"),
                         ({"loss": "logit_mse", "vocab_reduction": "max"}, "vocab_reduction")):
        with pytest.raises(BiodistilError, match=needle):
            validate_recipe(DistillRecipe, {**base, "objective": {"terms": [term]}})


def test_logit_positions_per_model():
    cfg = ObjectiveConfig(terms=[TermConfig(loss="mlm"), TermConfig(loss="logit_kl", positions="known")])
    objective = Objective(cfg, *_two_tiny_models())
    attention = torch.tensor([[1, 1, 1, 1, 0]])
    labels = torch.tensor([[-100, 7, -100, 9, -100]])
    new = torch.tensor([[False, False, False, True, False]])
    masks = position_masks(attention, labels, new)
    assert objective.logit_positions(masks).tolist() == [[True, True, True, True, False]], "masked ∪ known"
    assert objective.logit_positions(masks, teacher=True).tolist() == [[True, True, True, False, False]]


def _two_tiny_models():
    from biodistil.data.vocab import train_wordpiece

    tokenizer = train_wordpiece(["a b c d e f g"] * 3, vocab_size=30, min_frequency=1)
    return narrow_student(tokenizer, layers=1), narrow_student(tokenizer, layers=2)


def _features(logits, positions, hidden=None):
    return Features(hidden=hidden or {}, logits=LogitRows(positions, logits), num_layers=1)


def test_hinge_and_shared_vocabulary_in_the_objective():
    student_model, teacher_model = _two_tiny_models()
    terms = [TermConfig(loss="logit_mse", positions="known", epsilon=0.0, hinge_weight=2.0),
             TermConfig(loss="logit_kl", positions="known", epsilon=1e6)]
    objective = Objective(ObjectiveConfig(temperature=1.0, terms=terms), student_model, teacher_model)
    positions = torch.tensor([[True, True, False]])
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(2, 6, generator=generator).requires_grad_()
    teacher = torch.randn(2, 4, generator=generator)
    masks = {"all": positions, "masked": torch.zeros_like(positions), "known": positions}
    inputs = TermInputs(student=_features(student, positions), teacher=_features(teacher, positions),
                        labels=torch.full((1, 3), -100), attention_mask=positions, masks=masks, temperature=1.0,
                        shared_vocab=4)
    total, logs = objective(inputs)
    mse = logit_mse_loss(student[:, :4], teacher)
    assert logs["loss_logit_mse"].item() == pytest.approx(2 * mse.item(), rel=1e-6), "max(W·L − 0, 0) = W·L"
    assert logs["loss_logit_kl"].item() == 0.0 and logs["loss_logit_kl_raw"].item() > 0, "below ε: zero"
    assert total.item() == pytest.approx(2 * mse.item(), rel=1e-6)
    total.backward()
    assert student.grad[:, 4:].abs().sum() == 0, "columns beyond the teacher's vocabulary get no KD gradient"
    assert student.grad[:, :4].abs().sum() > 0
    assert tolerance_hinge(torch.tensor(1.0), 2.0, 0.0).item() == 2.0


def test_logit_mse_term_averages_or_sums_over_the_shared_vocabulary():
    # student rows (1, 2 | 7) and (1, 1 | −7), the last column a new token beyond the 2 shared columns;
    # teacher (0, 0) and (1, 3). Squared errors per row: 1 + 4 = 5 and 0 + 4 = 4.
    # vocab_reduction sum (VE-KD): (5 + 4)/2 = 4.5; mean (per-logit MSE): (5/2 + 4/2)/2 = 2.25
    terms = [TermConfig(loss="logit_mse", positions="known", vocab_reduction="sum"),
             TermConfig(loss="logit_mse", positions="known")]
    objective = Objective(ObjectiveConfig(terms=terms), *_two_tiny_models())
    positions = torch.tensor([[True, True]])
    student = torch.tensor([[1.0, 2.0, 7.0], [1.0, 1.0, -7.0]])
    teacher = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    masks = {"all": positions, "masked": torch.zeros_like(positions), "known": positions}
    inputs = TermInputs(student=_features(student, positions), teacher=_features(teacher, positions),
                        labels=torch.full((1, 2), -100), attention_mask=positions, masks=masks, temperature=1.0,
                        shared_vocab=2)
    total, logs = objective(inputs)
    assert logs["loss_logit_mse"].item() == pytest.approx(4.5)
    assert logs["loss_logit_mse_2"].item() == pytest.approx(2.25)
    assert total.item() == pytest.approx(6.75)


def test_old_single_pair_projection_keys_are_kept(teacher, tokenizer):
    student = narrow_student(tokenizer)
    cfg = ObjectiveConfig(terms=[TermConfig(loss="hidden_cosine")])
    assert list(Objective(cfg, student, teacher).projections) == ["hidden_cosine_sm1_tm1"]


def test_task_terms_are_not_for_masked_lm_objectives():
    for loss in ("ce", "sigmoid_kd", "patient_kd"):
        with pytest.raises(ValueError, match="task-specific distillation"):
            ObjectiveConfig(terms=[TermConfig(loss="mlm"), TermConfig(loss=loss)])


@pytest.mark.parametrize("order", ["mlm first", "kl first"])
def test_kl_at_every_position_formed_in_chunks_equals_the_formula(teacher, tokenizer, monkeypatch, order):
    """DistilBERT's MLM + KL at every position: the KL forms the student's logits from its head a chunk at a time,
    reusing those the MLM formed at the masked rows; loss and gradients equal the formula on whole logits."""
    import biodistil.losses.distillation as distillation

    monkeypatch.setattr(distillation, "KL_CHUNK_ELEMENTS", 3 * len(tokenizer))  # 3 rows per chunk
    student = perturbed(student_from_teacher_layers(teacher, [0, 2]).eval(), seed=4)
    terms = [TermConfig(loss="mlm", weight=2.0), TermConfig(loss="logit_kl", weight=5.0, positions="all")]
    objective = Objective(ObjectiveConfig(temperature=2.0, terms=terms if order == "mlm first" else terms[::-1]),
                          student, teacher)
    batch = text_batch(tokenizer)
    loss, logs = MaskedLMModule(student, objective, teacher)(batch)
    loss.backward()
    fused = {name: param.grad.clone() for name, param in student.named_parameters()}
    student.zero_grad()

    real, targets = batch.attention_mask.bool(), batch.labels != -100
    with torch.no_grad():
        teacher_logits = teacher(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits = student(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    mlm = torch.nn.functional.cross_entropy(logits[targets], batch.labels[targets])
    kl = soft_kl_loss(logits[real], teacher_logits[real], temperature=2.0)
    (2 * mlm + 5 * kl).backward()
    assert logs["loss_logit_kl"].item() == pytest.approx(kl.item(), **CLOSE)
    assert loss.item() == pytest.approx((2 * mlm + 5 * kl).item(), **CLOSE)
    for name, param in student.named_parameters():
        assert torch.allclose(fused[name], param.grad, rtol=1e-4, atol=1e-6), name
    assert all(param.grad is None for param in teacher.parameters())


def _counted(monkeypatch) -> list[tuple[str, int]]:
    """(what, rows) of every logit formation from a head and every KL loss call, in call order."""
    import biodistil.models.logits as logits

    calls = []

    def counting(name, loss):
        def counted(*args, **kwargs):
            calls.append((name, args[0].size(0)))
            return loss(*args, **kwargs)

        return counted

    for name in ("soft_kl_loss", "linear_soft_kl_loss", "topk_kl_loss"):
        monkeypatch.setattr(logits, name, counting(name, getattr(logits, name)))
    form = logits.LinearRows.logits
    monkeypatch.setattr(logits.LinearRows, "logits",
                        lambda rows: calls.append(("head matmul", rows.inputs.size(0))) or form(rows))
    return calls


@pytest.mark.parametrize("positions", ["masked", "all"])
def test_mlm_and_kl_compute_the_same_whichever_runs_first(teacher, tokenizer, monkeypatch, positions):
    """DistilBERT's terms [mlm, logit_kl] and [logit_kl, mlm] give equal losses and gradients by identical calls:
    the MLM's rows are formed once and the KL reads them; the KL forms any other rows inside the fused loss."""
    calls = _counted(monkeypatch)
    batch = text_batch(tokenizer)
    terms = [TermConfig(loss="mlm", weight=2.0), TermConfig(loss="logit_kl", weight=5.0, positions=positions)]
    results = []
    for order in (terms, terms[::-1]):
        student = perturbed(student_from_teacher_layers(teacher, [0, 2]).eval(), seed=4)
        objective = Objective(ObjectiveConfig(temperature=2.0, terms=order), student, teacher)
        calls.clear()
        loss, logs = MaskedLMModule(student, objective, teacher)(batch)
        loss.backward()
        grads = {name: param.grad for name, param in student.named_parameters() if param.grad is not None}
        results.append((loss.item(), logs, grads, list(calls)))
    (loss, logs, grads, made), (loss_2, logs_2, grads_2, made_2) = results
    assert loss == pytest.approx(loss_2, rel=0, abs=1e-6)
    for name in ("loss_mlm", "loss_logit_kl"):
        assert logs[name].item() == pytest.approx(logs_2[name].item(), rel=0, abs=1e-6), name
    assert grads.keys() == grads_2.keys() and grads
    for name, grad in grads.items():
        assert torch.allclose(grad, grads_2[name], rtol=0, atol=1e-6), name
    assert made == made_2, "the same formations and losses, whichever term comes first"
    masked = int((batch.labels != -100).sum())
    rest = int(batch.attention_mask.sum()) - masked
    fused = [("linear_soft_kl_loss", rest)] if positions == "all" else []
    assert made == [("head matmul", masked), ("soft_kl_loss", masked), *fused], \
        "the student's logits formed at the MLM targets only; the KL reads them and fuses the other rows"
