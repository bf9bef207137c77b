"""Layer losses checked against hand-worked values and plain-python loop references."""

import math

import pytest
import torch

from biodistil.losses.layers import (
    attention_kl_loss,
    attention_mse_loss,
    hidden_mse_loss,
    minilm_relation_loss,
    minilm_relations_loss,
    tolerance_hinge,
)

MASK_4_2 = torch.tensor([[True, True, True, True], [True, True, False, False]])


def _random_attention(batch: int, heads: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(batch, heads, length, length, generator=generator), dim=-1)


def _scramble_padding(attn: torch.Tensor, mask: torch.Tensor, seed: int) -> torch.Tensor:
    """Overwrite every entry in a padded query row or padded key column with random values."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(attn.shape, generator=generator)
    real = mask[:, None, :, None] & mask[:, None, None, :]
    return torch.where(real, attn, noise)


# ---------------------------------------------------------------- hidden states


def test_hidden_mse_by_hand_ignores_padding() -> None:
    # real token: student (1, 2) vs teacher (0, 0) → ((1−0)² + (2−0)²) / 2 dims = 2.5; padded token ignored
    student = torch.tensor([[[1.0, 2.0], [100.0, -100.0]]])
    teacher = torch.zeros(1, 2, 2)
    mask = torch.tensor([[True, False]])
    assert hidden_mse_loss(student, teacher, mask).item() == pytest.approx(2.5)


def test_hidden_mse_averages_over_tokens_of_the_batch() -> None:
    # tokens: (1,1)-(0,0) → 1; (3,1)-(1,1) → (4+0)/2 = 2; (0,0)-(0,2) → 2; mean over 3 real tokens = 5/3
    student = torch.tensor([[[1.0, 1.0], [3.0, 1.0]], [[0.0, 0.0], [9.0, 9.0]]])
    teacher = torch.tensor([[[0.0, 0.0], [1.0, 1.0]], [[0.0, 2.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True], [True, False]])
    assert hidden_mse_loss(student, teacher, mask).item() == pytest.approx(5.0 / 3.0)


def test_hidden_mse_rejects_different_widths() -> None:
    with pytest.raises(ValueError, match="hidden"):
        hidden_mse_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.ones(1, 2, dtype=torch.bool))


# ---------------------------------------------------------------- attention MSE


def test_attention_mse_by_hand() -> None:
    # head 0: rows (1, 0) vs (.5, .5) → .25 + .25; (.5, .5) vs (.5, .5) → 0; mean of 4 entries = .125
    # head 1: identical → 0; mean over heads = .0625
    student = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]], [[0.3, 0.7], [0.9, 0.1]]]])
    teacher = torch.tensor([[[[0.5, 0.5], [0.5, 0.5]], [[0.3, 0.7], [0.9, 0.1]]]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert attention_mse_loss(student, teacher, mask).item() == pytest.approx(0.0625)


def test_attention_mse_on_unnormalised_scores_by_hand_ignores_padded_keys() -> None:
    # TinyBERT compares scores Q·Kᵀ/√d. One head, 3 tokens, the last one padded.
    # student scores (real block) [[1, 0], [0, 1]] vs teacher 0 → (1 + 0 + 0 + 1) / 4 real pairs = 0.5;
    # the padded key column (9, 9) and the padded query row (huge values) never count.
    student = torch.tensor([[[[1.0, 0.0, 9.0], [0.0, 1.0, 9.0], [1e4, 1e4, 1e4]]]])
    teacher = torch.zeros(1, 1, 3, 3)
    mask = torch.tensor([[True, True, False]])
    assert attention_mse_loss(student, teacher, mask).item() == pytest.approx(0.5, rel=1e-6)


def _attention_mse_reference(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> float:
    s, t, m = student.tolist(), teacher.tolist(), mask.tolist()
    total, count = 0.0, 0
    for b in range(len(s)):
        for h in range(len(s[b])):
            for i in range(len(m[b])):
                for j in range(len(m[b])):
                    if m[b][i] and m[b][j]:
                        total += (s[b][h][i][j] - t[b][h][i][j]) ** 2
                        count += 1
    return total / count


def test_attention_mse_matches_loop_reference_and_ignores_padding() -> None:
    student, teacher = _random_attention(2, 3, 4, seed=0), _random_attention(2, 3, 4, seed=1)
    loss = attention_mse_loss(student, teacher, MASK_4_2)
    assert loss.item() == pytest.approx(_attention_mse_reference(student, teacher, MASK_4_2), rel=1e-5)
    scrambled = attention_mse_loss(
        _scramble_padding(student, MASK_4_2, 2), _scramble_padding(teacher, MASK_4_2, 3), MASK_4_2
    )
    assert scrambled.item() == pytest.approx(loss.item(), rel=1e-6)
    # the padding really was changed: without a mask the loss differs
    unmasked = attention_mse_loss(
        _scramble_padding(student, MASK_4_2, 2),
        _scramble_padding(teacher, MASK_4_2, 3),
        torch.ones(2, 4).bool(),
    )
    assert unmasked.item() != pytest.approx(loss.item(), rel=1e-3)


# ---------------------------------------------------------------- attention KL


def test_attention_kl_by_hand_student_first() -> None:
    # one real row: a_S = (.5, .5), a_T = (.25, .75):
    # KL(a_S ‖ a_T) = .5·ln(.5/.25) + .5·ln(.5/.75) = .5·ln(4/3)
    student = torch.tensor([[[[0.5, 0.5], [0.2, 0.8]]]])
    teacher = torch.tensor([[[[0.25, 0.75], [0.2, 0.8]]]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    expected_row0 = 0.5 * math.log(4.0 / 3.0)
    # mean over the 2 real rows (row 1 has KL 0)
    assert attention_kl_loss(student, teacher, mask).item() == pytest.approx(expected_row0 / 2, rel=1e-5)
    # sum over rows of the sequence, mean over heads (1) and batch (1)
    assert attention_kl_loss(student, teacher, mask, reduction="sum").item() == pytest.approx(expected_row0, rel=1e-5)
    # the reverse direction KL(a_T ‖ a_S) = .25·ln(.5) + .75·ln(1.5) is a different number
    reverse = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert attention_kl_loss(student, teacher, mask).item() != pytest.approx(reverse / 2, rel=1e-3)


def _attention_kl_reference(
    student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float]:
    """(mean over heads and real rows, mean over batch and heads of the per-sequence row sum)."""
    s, t, m = student.tolist(), teacher.tolist(), mask.tolist()
    row_total, rows, per_sequence = 0.0, 0, []
    for b in range(len(s)):
        for h in range(len(s[b])):
            head_sum = 0.0
            for i in range(len(m[b])):
                if not m[b][i]:
                    continue
                kl = sum(
                    s[b][h][i][j] * (math.log(s[b][h][i][j]) - math.log(t[b][h][i][j]))
                    for j in range(len(m[b]))
                    if m[b][j]
                )
                row_total += kl
                rows += 1
                head_sum += kl
            per_sequence.append(head_sum)
    return row_total / rows, sum(per_sequence) / len(per_sequence)


def test_attention_kl_matches_loop_reference_and_ignores_padding() -> None:
    student, teacher = _random_attention(2, 3, 4, seed=4), _random_attention(2, 3, 4, seed=5)
    expected_mean, expected_sum = _attention_kl_reference(student, teacher, MASK_4_2)
    assert attention_kl_loss(student, teacher, MASK_4_2).item() == pytest.approx(expected_mean, rel=1e-5)
    assert attention_kl_loss(student, teacher, MASK_4_2, reduction="sum").item() == pytest.approx(
        expected_sum, rel=1e-5
    )
    s2, t2 = _scramble_padding(student, MASK_4_2, 6), _scramble_padding(teacher, MASK_4_2, 7)
    assert attention_kl_loss(s2, t2, MASK_4_2).item() == pytest.approx(expected_mean, rel=1e-5)
    assert attention_kl_loss(s2, t2, MASK_4_2, reduction="sum").item() == pytest.approx(
        expected_sum, rel=1e-5
    )


def test_attention_kl_survives_zero_probabilities() -> None:
    student = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]], requires_grad=True)
    teacher = torch.tensor([[[[0.0, 1.0], [0.0, 1.0]]]])
    loss = attention_kl_loss(student, teacher, torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 10  # ln(1/1e-12) / 2 rows ≈ 13.8
    assert torch.isfinite(student.grad).all()


def test_attention_kl_rejects_unknown_reduction() -> None:
    attn = _random_attention(1, 1, 2, seed=0)
    with pytest.raises(ValueError, match="reduction"):
        attention_kl_loss(attn, attn, torch.ones(1, 2, dtype=torch.bool), reduction="max")  # type: ignore[arg-type]


# ---------------------------------------------------------------- MiniLMv2 relations


def test_minilm_relation_by_hand() -> None:
    # one head, d = 2. Student x = (1,0), (0,1): scores x·xᵀ/√2 = [[c, 0], [0, c]], c = 1/√2.
    # Teacher x = (1,0), (1,0): scores all equal → R_T rows are (.5, .5).
    # R_S row 0 = (e^c, 1)/(e^c + 1); KL(R_T ‖ R_S) = Σ .5·ln(.5 / R_S); row 1 is the mirror image.
    c = 1.0 / math.sqrt(2.0)
    r0, r1 = math.exp(c) / (math.exp(c) + 1.0), 1.0 / (math.exp(c) + 1.0)
    expected = 0.5 * math.log(0.5 / r0) + 0.5 * math.log(0.5 / r1)
    student = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    teacher = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert minilm_relation_loss(student, teacher, mask, 1).item() == pytest.approx(expected, rel=1e-5)


def _relation_rows(x: list[list[float]], real: list[bool], heads: int) -> list[list[list[float]]]:
    """Per head, per real query row: softmax over real keys of x_h·x_hᵀ/√d_h (plain python)."""
    width = len(x[0]) // heads
    out = []
    for h in range(heads):
        part = [row[h * width : (h + 1) * width] for row in x]
        head_rows = []
        for i in range(len(x)):
            if not real[i]:
                continue
            scores = [
                sum(a * b for a, b in zip(part[i], part[j], strict=True)) / math.sqrt(width)
                for j in range(len(x))
                if real[j]
            ]
            top = max(scores)
            exps = [math.exp(v - top) for v in scores]
            head_rows.append([v / sum(exps) for v in exps])
        out.append(head_rows)
    return out


def _minilm_reference(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, heads: int) -> float:
    total, rows = 0.0, 0
    for b in range(student.size(0)):
        real = mask[b].tolist()
        r_s = _relation_rows(student[b].tolist(), real, heads)
        r_t = _relation_rows(teacher[b].tolist(), real, heads)
        for h in range(heads):
            for row_s, row_t in zip(r_s[h], r_t[h], strict=True):
                total += sum(t * (math.log(t) - math.log(s)) for s, t in zip(row_s, row_t, strict=True))
                rows += 1
    return total / rows


def test_minilm_relation_matches_loop_reference_with_different_widths_and_padding() -> None:
    generator = torch.Generator().manual_seed(10)
    student = torch.randn(2, 4, 6, generator=generator)
    teacher = torch.randn(2, 4, 8, generator=generator)
    loss = minilm_relation_loss(student, teacher, MASK_4_2, num_relation_heads=2)
    assert loss.item() == pytest.approx(_minilm_reference(student, teacher, MASK_4_2, 2), rel=1e-5)
    # changing the vectors of padded tokens changes nothing
    pad = ~MASK_4_2[..., None]
    noisy_student = torch.where(pad, torch.randn(2, 4, 6, generator=generator) * 50, student)
    noisy_teacher = torch.where(pad, torch.randn(2, 4, 8, generator=generator) * 50, teacher)
    again = minilm_relation_loss(noisy_student, noisy_teacher, MASK_4_2, num_relation_heads=2)
    assert again.item() == pytest.approx(loss.item(), rel=1e-5)


def test_minilm_relation_is_zero_for_identical_inputs_and_has_gradient() -> None:
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(2, 4, 6, generator=generator, requires_grad=True)
    assert minilm_relation_loss(x, x.detach(), MASK_4_2, 3).item() == pytest.approx(0.0, abs=1e-6)
    loss = minilm_relation_loss(x, torch.randn(2, 4, 6, generator=generator), MASK_4_2, 3)
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_minilm_relation_rejects_indivisible_width() -> None:
    with pytest.raises(ValueError, match="divisible"):
        minilm_relation_loss(torch.zeros(1, 2, 6), torch.zeros(1, 2, 8), torch.ones(1, 2).bool(), 4)


def test_minilm_relations_sums_the_requested_types() -> None:
    generator = torch.Generator().manual_seed(12)
    student = {r: torch.randn(2, 4, 4, generator=generator) for r in "qkv"}
    teacher = {r: torch.randn(2, 4, 8, generator=generator) for r in "qkv"}
    singles = {r: minilm_relation_loss(student[r], teacher[r], MASK_4_2, 2).item() for r in "qkv"}
    total = minilm_relations_loss(student, teacher, MASK_4_2, 2)
    assert total.item() == pytest.approx(singles["q"] + singles["k"] + singles["v"], rel=1e-5)
    only_qk = minilm_relations_loss(student, teacher, MASK_4_2, 2, relations=("q", "k"))
    assert only_qk.item() == pytest.approx(singles["q"] + singles["k"], rel=1e-5)
    with pytest.raises(ValueError, match="missing"):
        minilm_relations_loss({"q": student["q"]}, teacher, MASK_4_2, 2)


# ---------------------------------------------------------------- VE-KD tolerance


def test_tolerance_hinge_is_zero_below_epsilon() -> None:
    loss = torch.tensor(0.3, requires_grad=True)
    out = tolerance_hinge(loss, weight=2.0, epsilon=1.0)  # 2·0.3 − 1 < 0 → 0
    out.backward()
    assert out.item() == 0.0
    assert loss.grad.item() == 0.0


def test_tolerance_hinge_passes_gradient_above_epsilon() -> None:
    loss = torch.tensor(0.8, requires_grad=True)
    out = tolerance_hinge(loss, weight=2.0, epsilon=1.0)  # 2·0.8 − 1 = 0.6, d/dL = W = 2
    out.backward()
    assert out.item() == pytest.approx(0.6)
    assert loss.grad.item() == pytest.approx(2.0)


def test_tolerance_hinge_boundary() -> None:
    # W·L exactly ε → 0; just above → W·L − ε
    assert tolerance_hinge(torch.tensor(0.25), weight=2.0, epsilon=0.5).item() == 0.0
    assert tolerance_hinge(torch.tensor(0.3), weight=2.0, epsilon=0.5).item() == pytest.approx(0.1)
