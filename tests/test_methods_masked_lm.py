"""The masked-LM module on real models: the objective's weighted sum, gradient flow, padding, projections."""

import pytest
import torch
from numerics import CLOSE, perturbed

from biodistil.config import ArchitectureConfig, MaskingConfig, ObjectiveConfig, TermConfig
from biodistil.data.batch import Batch
from biodistil.data.masking import MaskingVocabulary
from biodistil.errors import BiodistilError
from biodistil.losses.distillation import cosine_embedding_loss, masked_lm_loss, soft_kl_loss
from biodistil.methods.masked_lm import MaskBatch, MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.models.student import model_from_architecture, student_from_teacher_layers

TRIPLE = ObjectiveConfig(temperature=2.0, terms=[
    TermConfig(loss="mlm", weight=2.0), TermConfig(loss="logit_kl", weight=5.0), TermConfig(loss="hidden_cosine")])


def masked_batch(tokenizer, seed=0):
    texts = ["the protein kinase gene expression cell tumour patients", "cancer mice induced"]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    batch = Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    cfg = MaskingConfig(probability=0.5)
    return MaskBatch(MaskingVocabulary.from_tokenizer(tokenizer), cfg)(batch, torch.Generator().manual_seed(seed))


def narrow_student(tokenizer):
    torch.manual_seed(1)
    return model_from_architecture(ArchitectureConfig(
        num_layers=2, hidden_size=16, num_heads=2, intermediate_size=32, max_position_embeddings=64), tokenizer)


def test_total_is_weighted_sum_of_terms_computed_independently(teacher, tokenizer):
    student = perturbed(student_from_teacher_layers(teacher), seed=6)  # KL and cosine far above rounding noise
    module = MaskedLMModule(student, Objective(TRIPLE, student, teacher), teacher)
    module.eval()
    batch = masked_batch(tokenizer)
    loss, logs = module(batch)
    attention = batch.attention_mask.bool()
    with torch.no_grad():
        t_out = teacher(batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
        s_out = student(batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
    mlm = masked_lm_loss(s_out.logits, batch.labels)
    kl = soft_kl_loss(s_out.logits[attention], t_out.logits[attention], 2.0)
    cos = cosine_embedding_loss(s_out.hidden_states[-1], t_out.hidden_states[-1], attention)
    # logits at chosen positions vs at every position: other matmul shapes, equal up to rounding
    for name, value in {"loss_mlm": mlm, "loss_logit_kl": kl, "loss_hidden_cosine": cos}.items():
        assert value.item() > 1e-3, name
        assert logs[name].item() == pytest.approx(value.item(), **CLOSE), name
    assert loss.item() == pytest.approx(2 * mlm.item() + 5 * kl.item() + cos.item(), **CLOSE)


def test_kl_on_masked_positions_only(teacher, tokenizer):
    student = perturbed(student_from_teacher_layers(teacher), seed=7)
    cfg = ObjectiveConfig(temperature=1.0, terms=[TermConfig(loss="logit_kl", positions="masked")])
    module = MaskedLMModule(student, Objective(cfg, student, teacher), teacher).eval()
    batch = masked_batch(tokenizer)
    _, logs = module(batch)
    targets = batch.labels != -100
    with torch.no_grad():
        t = teacher(batch.input_ids, attention_mask=batch.attention_mask).logits[targets]
        s = student(batch.input_ids, attention_mask=batch.attention_mask).logits[targets]
    expected = soft_kl_loss(s, t, 1.0).item()
    assert expected > 1e-3 and logs["loss_logit_kl"].item() == pytest.approx(expected, **CLOSE)


def test_gradients_reach_student_and_projection_never_teacher(teacher, tokenizer):
    student = narrow_student(tokenizer)
    objective = Objective(TRIPLE, student, teacher)
    assert len(objective.projections) == 1, "16-wide student, 32-wide teacher: one projection"
    module = MaskedLMModule(student, objective, teacher)
    loss, _ = module(masked_batch(tokenizer))
    loss.backward()
    assert all(p.grad is not None for p in objective.projections.parameters())
    assert student.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert not teacher.training
    trained = {id(p) for p in module.parameters()}
    assert not trained & {id(p) for p in teacher.parameters()}, "the teacher is not part of the trained module"


def test_padding_does_not_change_the_losses(teacher, tokenizer):
    student = perturbed(student_from_teacher_layers(teacher), seed=8)
    module = MaskedLMModule(student, Objective(TRIPLE, student, teacher), teacher).eval()
    batch = masked_batch(tokenizer)
    assert (batch.attention_mask == 0).any()
    padded_with_7 = batch.input_ids.masked_fill(batch.attention_mask == 0, 7)
    changed = batch.replace(inputs={**batch.inputs, "input_ids": padded_with_7})
    (_, logs), (_, logs_changed) = module(batch), module(changed)
    for name, value in logs.items():  # every term, not just the total (which the MLM term dominates)
        assert value.item() > 1e-3, name
        assert logs_changed[name].item() == pytest.approx(value.item(), **CLOSE), name


def test_teacher_terms_without_teacher_fail(tokenizer):
    student = narrow_student(tokenizer)
    with pytest.raises(BiodistilError, match="need a teacher"):
        Objective(TRIPLE, student, None)


def test_the_automatic_teacher_dtype_and_precision_follow_what_the_cpu_can_do(monkeypatch):
    from biodistil.training import machine as hardware
    from biodistil.training import machine as masked_lm  # the teacher's dtype is a machine decision too

    cpu = torch.device("cpu")
    monkeypatch.setattr(hardware, "cpu_bf16_fast", lambda: (True, "CPU flags avx512_bf16"))
    assert masked_lm.teacher_dtype("auto", cpu) == torch.bfloat16
    assert masked_lm.dtype_note("auto", torch.bfloat16, cpu) == "Teacher dtype: bfloat16 (auto: CPU flags avx512_bf16)."
    assert hardware.resolve_precision("auto", cpu) == ("bf16", "bf16 autocast (auto: CPU flags avx512_bf16)")
    monkeypatch.setattr(hardware, "cpu_bf16_fast", lambda: (False, "CPU flags without amx_bf16 or avx512_bf16"))
    assert masked_lm.teacher_dtype("auto", cpu) == torch.float32
    assert hardware.resolve_precision("auto", cpu)[0] == "no"
    assert masked_lm.teacher_dtype("bfloat16", cpu) == torch.bfloat16, "an explicit setting is kept"
    assert hardware.resolve_precision("bf16", cpu) == ("bf16", "bf16 autocast (train.precision)")
    assert masked_lm.dtype_note("float32", torch.float32, cpu) == "Teacher dtype: float32 (teacher.dtype)."


def test_without_readable_flags_the_cpu_is_measured(monkeypatch):
    from pathlib import Path

    from biodistil.training import machine as hardware

    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (_ for _ in ()).throw(OSError("no /proc"))
                        if str(self) == "/proc/cpuinfo" else real(self, *a, **k))
    hardware.cpu_bf16_fast.cache_clear()
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 0.4)  # emulated bf16 is slower
    try:
        assert hardware.cpu_bf16_fast() == (False, "a bf16 matmul ran 0.40× as fast as float32 (bf16 from 1.3×)")
    finally:
        hardware.cpu_bf16_fast.cache_clear()


def test_the_bf16_speedup_is_a_measurement():
    from biodistil.training.machine import cpu_bf16_speedup

    speedup = cpu_bf16_speedup(size=256, repeats=2)
    assert 0.01 < speedup < 100
