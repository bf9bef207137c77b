"""Token-level distillation losses against values worked out by hand."""

import math

import pytest
import torch

from biodistil.losses.distillation import (
    cosine_embedding_loss,
    linear_soft_kl_loss,
    masked_lm_loss,
    masked_mean,
    soft_kl_loss,
)


def test_masked_lm_loss_is_mean_negative_log_likelihood_of_targets():
    # Row 0: logits [0, ln 3] -> p(label 1) = 3/4. Row 1 ignored. Row 2: [ln 2, 0] -> p(label 0) = 2/3.
    logits = torch.tensor([[0.0, math.log(3)], [5.0, -5.0], [math.log(2), 0.0]])
    labels = torch.tensor([1, -100, 0])
    expected = -(math.log(3 / 4) + math.log(2 / 3)) / 2
    assert masked_lm_loss(logits, labels).item() == pytest.approx(expected, rel=1e-5)


def test_masked_lm_loss_without_targets_is_zero_and_differentiable():
    logits = torch.zeros(2, 3, requires_grad=True)
    loss = masked_lm_loss(logits, torch.full((2,), -100))
    loss.backward()
    assert loss.item() == 0.0 and logits.grad is not None


def test_soft_kl_matches_hand_computation_with_temperature():
    # T = 2: teacher logits [2 ln 3, 0] / 2 -> softmax [3/4, 1/4]; student [0, 0] -> [1/2, 1/2].
    # KL(p_T || p_S) = 3/4 ln(3/2) + 1/4 ln(1/2); times T^2 = 4.
    teacher = torch.tensor([[2 * math.log(3), 0.0]])
    student = torch.tensor([[0.0, 0.0]])
    expected = 4 * (0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    assert soft_kl_loss(student, teacher, temperature=2.0).item() == pytest.approx(expected, rel=1e-5)


def test_soft_kl_is_averaged_over_rows_and_zero_for_equal_distributions():
    teacher = torch.tensor([[math.log(3), 0.0], [1.0, 1.0]])
    student = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    row0 = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert soft_kl_loss(student, teacher, temperature=1.0).item() == pytest.approx(row0 / 2, rel=1e-5)
    assert soft_kl_loss(teacher, teacher, temperature=3.0).item() == pytest.approx(0.0, abs=1e-6)


def test_cosine_loss_averages_over_unmasked_tokens_only():
    # token 0: student (1,0) vs teacher (0,1) -> cos 0 -> loss 1
    # token 1: student (1,1) vs teacher (2,2) -> cos 1 -> loss 0
    # token 2 is padding (masked out) with opposite vectors -> would give 2
    student = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]])
    teacher = torch.tensor([[[0.0, 1.0], [2.0, 2.0], [-1.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    assert cosine_embedding_loss(student, teacher, mask).item() == pytest.approx(0.5, rel=1e-6)


def test_cosine_loss_rejects_different_widths():
    with pytest.raises(ValueError, match="project"):
        cosine_embedding_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.ones(1, 2, dtype=torch.bool))


def test_masked_mean():
    values = torch.tensor([1.0, 2.0, 9.0])
    assert masked_mean(values, torch.tensor([True, True, False])).item() == pytest.approx(1.5)


def test_chunked_soft_kl_equals_the_formula_and_its_gradient(monkeypatch):
    import biodistil.losses.distillation as distillation

    monkeypatch.setattr(distillation, "KL_CHUNK_ELEMENTS", 14)  # rows of 7 logits: 2 rows per chunk, 3 chunks
    generator = torch.Generator().manual_seed(0)
    student = (3 * torch.randn(5, 7, generator=generator)).requires_grad_()
    teacher = 3 * torch.randn(5, 7, generator=generator)
    reference = student.detach().clone().requires_grad_()
    log_s, log_t = torch.log_softmax(reference / 2, -1), torch.log_softmax(teacher / 2, -1)
    expected = 4 * (log_t.exp() * (log_t - log_s)).sum(-1).mean()
    expected.backward()
    loss = soft_kl_loss(student, teacher, temperature=2.0)
    loss.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(student.grad, reference.grad, rtol=1e-4, atol=1e-7)


def test_soft_kl_with_the_teacher_as_its_head_equals_the_kl_of_its_logits(monkeypatch):
    import biodistil.losses.distillation as distillation

    monkeypatch.setattr(distillation, "KL_CHUNK_ELEMENTS", 14)  # 2 rows per chunk: the teacher formed per chunk
    generator = torch.Generator().manual_seed(3)
    head = tuple(torch.randn(shape, generator=generator) for shape in ((5, 3), (7, 3), (7,)))
    student = torch.randn(5, 7, generator=generator, requires_grad=True)
    reference = student.detach().clone().requires_grad_()
    expected = soft_kl_loss(reference, torch.nn.functional.linear(*head), temperature=2.0)
    expected.backward()
    loss = soft_kl_loss(student, head, temperature=2.0)
    loss.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(student.grad, reference.grad, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="student logits"):
        soft_kl_loss(student[:4], head)


@pytest.mark.parametrize("teacher_as_head", [False, True])
def test_linear_soft_kl_equals_the_kl_of_the_formed_logits_and_its_gradients(monkeypatch, teacher_as_head):
    import biodistil.losses.distillation as distillation

    monkeypatch.setattr(distillation, "KL_CHUNK_ELEMENTS", 14)  # rows of 7 logits: 2 rows per chunk, 3 chunks
    generator = torch.Generator().manual_seed(1)
    inputs, weight, bias = (torch.randn(shape, generator=generator) for shape in ((5, 4), (7, 4), (7,)))
    teacher_rows = tuple(torch.randn(shape, generator=generator) for shape in ((5, 3), (7, 3), (7,)))
    teacher_logits = torch.nn.functional.linear(*teacher_rows)
    teacher = teacher_rows if teacher_as_head else teacher_logits
    reference = [tensor.clone().requires_grad_() for tensor in (inputs, weight, bias)]
    log_s = torch.log_softmax((reference[0] @ reference[1].T + reference[2]) / 2, -1)
    log_t = torch.log_softmax(teacher_logits / 2, -1)
    expected = 4 * (log_t.exp() * (log_t - log_s)).sum(-1).mean()
    expected.backward()
    fused = [tensor.clone().requires_grad_() for tensor in (inputs, weight, bias)]
    loss = linear_soft_kl_loss(*fused, teacher, temperature=2.0)
    loss.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for got, want in zip(fused, reference, strict=True):
        assert torch.allclose(got.grad, want.grad, rtol=1e-4, atol=1e-6)


def test_linear_soft_kl_under_bf16_autocast_runs_its_matmuls_in_bf16_and_keeps_the_gradients(monkeypatch):
    import biodistil.losses.distillation as distillation

    monkeypatch.setattr(distillation, "KL_CHUNK_ELEMENTS", 14)  # 2 rows of 7 logits per chunk, 3 chunks
    monkeypatch.setattr(distillation, "GRAD_WEIGHT_GROUP_ELEMENTS", 28)  # 2 chunks per weight-gradient group
    generator = torch.Generator().manual_seed(3)
    inputs, weight, bias = (torch.randn(shape, generator=generator) for shape in ((5, 4), (7, 4), (7,)))
    teacher = torch.randn(5, 7, generator=generator)

    def gradients(autocast: bool) -> list[torch.Tensor]:
        leaves = [tensor.clone().requires_grad_() for tensor in (inputs, weight, bias)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = linear_soft_kl_loss(*leaves, teacher, temperature=2.0)
        loss.backward()
        return [loss.detach(), *(leaf.grad for leaf in leaves)]

    plain, low = gradients(False), gradients(True)
    assert [g.dtype for g in low[1:]] == [torch.float32] * 3, "float32 gradients for float32 parameters"
    for got, want in zip(low, plain, strict=True):  # bf16 keeps ~3 significant digits
        assert torch.allclose(got, want, rtol=3e-2, atol=3e-2 * want.abs().max().item())
    assert max((got - want).abs().max().item() for got, want in zip(low[1:], plain[1:], strict=True)) > 1e-5, \
        "the matmuls ran in bf16, not float32"


def test_linear_soft_kl_leaves_frozen_parts_without_gradient():
    generator = torch.Generator().manual_seed(2)
    inputs = torch.randn(3, 4, generator=generator, requires_grad=True)
    weight = torch.randn(6, 4, generator=generator)  # frozen decoder
    teacher = torch.randn(3, 6, generator=generator)
    linear_soft_kl_loss(inputs, weight, None, teacher).backward()
    assert inputs.grad is not None and inputs.grad.abs().sum() > 0
    assert weight.grad is None
    with pytest.raises(ValueError, match="student logits"):
        linear_soft_kl_loss(inputs, weight, None, teacher[:, :5])


def test_soft_kl_gives_a_teacher_that_takes_gradients_its_gradient():
    teacher = torch.tensor([[2 * math.log(3), 0.0]], requires_grad=True)
    loss = soft_kl_loss(torch.zeros(1, 2), teacher, temperature=2.0)
    loss.backward()
    # d/dz_T of T²·KL with p_T = [3/4, 1/4], p_S = [1/2, 1/2]: T·p_T·(log p_T − log p_S − KL) per logit
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    expected = [2 * 0.75 * (math.log(1.5) - kl), 2 * 0.25 * (math.log(0.5) - kl)]
    assert teacher.grad[0].tolist() == pytest.approx(expected, rel=1e-5)


def topk_of(probabilities: list[float], k: int, temperature: float):
    """A teacher as a cache stores it: top-k logits (here log-probabilities), their ids, the log-normaliser at T."""
    log_p = torch.tensor([probabilities]).log()
    values, ids = log_p.topk(k, dim=-1)
    return values, ids, torch.logsumexp(log_p / temperature, -1)


def test_topk_kl_is_the_kl_of_the_buckets():
    from biodistil.losses.distillation import topk_kl_loss

    # teacher [0.5, 0.25, 0.2, 0.05], student uniform, T = 1, k = 2: buckets q = [1/2, 1/4 | tail 1/4] and
    # p = [1/4, 1/4 | tail 1/2]: KL = 1/2·ln 2 + 0 + 1/4·ln(1/2) = ln 2 / 4
    teacher = [0.5, 0.25, 0.2, 0.05]
    loss = topk_kl_loss(torch.zeros(1, 4), *topk_of(teacher, 2, 1.0), temperature=1.0)
    assert loss.item() == pytest.approx(math.log(2) / 4, rel=1e-5)
    # the full KL is larger by q_tail·KL(teacher tail [0.8, 0.2] ‖ student tail [0.5, 0.5])
    full = soft_kl_loss(torch.zeros(1, 4), torch.tensor([teacher]).log(), temperature=1.0)
    missing = 0.25 * (0.8 * math.log(1.6) + 0.2 * math.log(0.4))
    assert full.item() - loss.item() == pytest.approx(missing, rel=1e-4)


def test_topk_kl_with_temperature_and_every_token_kept_is_the_full_kl():
    from biodistil.losses.distillation import topk_kl_loss

    # T = 2: the tempered teacher is ∝ sqrt(p); with k = V no tail is left and the estimator is exact
    teacher, student = [0.5, 0.25, 0.2, 0.05], torch.tensor([[0.3, -1.0, 2.0, 0.0]], requires_grad=True)
    loss = topk_kl_loss(student, *topk_of(teacher, 4, 2.0), temperature=2.0)
    tempered = torch.tensor(teacher).sqrt() / torch.tensor(teacher).sqrt().sum()
    p = torch.softmax(student.detach() / 2, -1)[0]
    expected = 4 * float((tempered * (tempered / p).log()).sum())
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert torch.isfinite(student.grad).all(), "an empty tail gives no NaN gradient"
    # the gradient is the full KL's: T·(p_S − q)
    assert student.grad[0].tolist() == pytest.approx((2 * (p - tempered)).tolist(), abs=1e-6)


def test_topk_kl_gradient_formed_in_the_forward_pass_equals_autograd():
    from biodistil.losses.distillation import topk_kl_loss

    generator = torch.Generator().manual_seed(0)
    teacher = 3 * torch.randn(6, 11, generator=generator)
    shifted = teacher - teacher.max(-1, keepdim=True).values
    values, ids = shifted.topk(4, dim=-1)
    log_norm = torch.logsumexp(shifted / 2, -1)
    student = (2 * torch.randn(6, 11, generator=generator)).requires_grad_()
    fused = topk_kl_loss(student, values, ids, log_norm, temperature=2.0)
    fused.backward()
    reference = student.detach().clone().requires_grad_()
    teacher_values = values.clone().requires_grad_()  # a teacher that takes gradients: the autograd formula
    expected = topk_kl_loss(reference, teacher_values, ids, log_norm, temperature=2.0)
    expected.backward()
    assert fused.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(student.grad, reference.grad, rtol=1e-4, atol=1e-7)


def test_sampled_tail_estimates_the_full_kl():
    from biodistil.losses.distillation import topk_kl_loss

    # teacher [0.5, 0.25, 0.2, 0.05], k = 2: the tail given the tail is [0.8, 0.2]; five draws 2, 2, 2, 2, 3 hold
    # exactly those frequencies, so the estimate is the full KL: 1/2·ln 2 + 0.2·ln(0.8) + 0.05·ln(0.2)
    teacher = [0.5, 0.25, 0.2, 0.05]
    values, ids, log_norm = topk_of(teacher, 2, 1.0)
    draws = torch.tensor([[2, 2, 2, 2, 3]])
    tail_logits = torch.tensor([teacher]).log().gather(-1, draws)
    student = torch.zeros(1, 4, requires_grad=True)
    loss = topk_kl_loss(student, values, ids, log_norm, 1.0, tail_logits, draws)
    full = 0.5 * math.log(2) + 0.2 * math.log(0.8) + 0.05 * math.log(0.2)
    assert loss.item() == pytest.approx(full, rel=1e-5)
    loss.backward()  # p − q̂ with q̂ = [1/2, 1/4, 4/5·1/4, 1/5·1/4]
    assert student.grad[0].tolist() == pytest.approx([0.25 - 0.5, 0.0, 0.25 - 0.2, 0.25 - 0.05], abs=1e-6)


def test_sampled_tail_gradient_formed_in_the_forward_pass_equals_autograd():
    from biodistil.losses.distillation import topk_kl_loss

    generator = torch.Generator().manual_seed(1)
    teacher = 3 * torch.randn(6, 11, generator=generator)
    shifted = teacher - teacher.max(-1, keepdim=True).values
    values, ids = shifted.topk(4, dim=-1)
    tail = torch.softmax(shifted / 2, -1).scatter(-1, ids, 0.0)
    draws = torch.multinomial(tail, 5, replacement=True, generator=generator)
    tail_logits, log_norm = shifted.gather(-1, draws), torch.logsumexp(shifted / 2, -1)
    student = (2 * torch.randn(6, 11, generator=generator)).requires_grad_()
    fused = topk_kl_loss(student, values, ids, log_norm, 2.0, tail_logits, draws)
    fused.backward()
    reference = student.detach().clone().requires_grad_()
    expected = topk_kl_loss(reference, values.clone().requires_grad_(), ids, log_norm, 2.0, tail_logits, draws)
    expected.backward()
    assert fused.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(student.grad, reference.grad, rtol=1e-4, atol=1e-7)


def test_the_kl_chunk_is_sized_by_device_and_does_not_change_the_loss(monkeypatch):
    """On CUDA the chunked KL takes 2^26 values a chunk (2,198 rows at BERT's vocabulary, against 137 on a CPU); on
    the CPU, the same rows in the CUDA chunk (one) and in the CPU's (3) give the same loss and gradients. The loss to
    2e-4 relative: a chunk's KL is one float32 dot over its rows × V products, whose rounding on a CPU's BLAS grows
    with the chunk (here 7e-5 relative at 10 M products in one chunk, 5e-6 in the CPU's, against float64); the
    gradients are formed element by element, the chunk does not enter them."""
    import biodistil.losses.distillation as distillation

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (distillation._chunk_rows(30522, cpu), distillation._chunk_rows(30522, cuda)) == (137, 2198)
    rows, vocab, width = 2500, 4096, 16  # the CPU's chunk: 1,024 rows (3 chunks); the CUDA one: all 2,500 rows
    generator = torch.Generator().manual_seed(5)
    inputs, weight, bias = (torch.randn(shape, generator=generator) for shape in ((rows, width), (vocab, width),
                                                                                  (vocab,)))
    teacher = 3 * torch.randn(rows, vocab, generator=generator)

    def loss_and_grads(device_chunk: torch.device) -> list[torch.Tensor]:
        monkeypatch.setattr(distillation, "kl_chunk_elements", lambda device: {
            "cpu": distillation.KL_CHUNK_ELEMENTS, "cuda": distillation.CUDA_KL_CHUNK_ELEMENTS}[device_chunk.type])
        student = (3 * inputs[:, :1] * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(6))
                   ).requires_grad_()
        leaves = [tensor.clone().requires_grad_() for tensor in (inputs, weight, bias)]
        whole, fused = soft_kl_loss(student, teacher, 2.0), linear_soft_kl_loss(*leaves, teacher, 2.0)
        (whole + fused).backward()
        return [whole.detach(), fused.detach(), student.grad, *(leaf.grad for leaf in leaves)]

    by_cpu, by_cuda = loss_and_grads(cpu), loss_and_grads(cuda)
    assert by_cpu[0].item() > 1 and by_cpu[1].item() > 1, "losses far from zero: a relative tolerance means something"
    assert by_cuda[0].item() == pytest.approx(by_cpu[0].item(), rel=2e-4)
    assert by_cuda[1].item() == pytest.approx(by_cpu[1].item(), rel=2e-4)
    for got, want in zip(by_cuda[2:], by_cpu[2:], strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
