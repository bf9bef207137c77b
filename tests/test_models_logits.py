"""LogitRows: restricting rows without copies, forming a head's logits once per set of rows, and the KL chosen by
what stands for the logits, equal to the formula on whole logits whichever rows are declared formed."""

import pytest
import torch

from biodistil.errors import BiodistilError
from biodistil.losses.distillation import soft_kl_loss, topk_kl_loss
from biodistil.models.logits import LinearRows, LogitRows, TopKLogits

POSITIONS = torch.tensor([[True, True, False, True], [True, True, True, False]])  # 6 rows
MASKED = torch.tensor([[False, True, False, False], [True, False, True, False]])
FIRST = torch.tensor([[True, True, False, True], [False, False, False, False]])


def head(seed: int = 0, vocab: int = 7) -> LinearRows:
    generator = torch.Generator().manual_seed(seed)
    return LinearRows(*(torch.randn(shape, generator=generator) for shape in ((6, 3), (vocab, 3), (vocab,))))


def test_views_restrict_without_copies_and_form_each_set_of_rows_once(monkeypatch):
    rows = LogitRows(POSITIONS, head())
    formed = []
    form = LinearRows.logits
    monkeypatch.setattr(LinearRows, "logits", lambda self: formed.append(self.inputs.size(0)) or form(self))
    assert rows.at(POSITIONS) is rows and rows.rows is rows.source, "every computed row: no copy"
    whole = rows.logits()
    masked = rows.at(MASKED).logits()
    assert torch.equal(masked, whole[MASKED[POSITIONS]])
    assert rows.at(MASKED).logits() is masked and rows.planned([MASKED]).at(MASKED).logits() is masked
    assert formed == [6, 3], "once per set of rows, shared by views and planned copies"
    logits = torch.randn(6, 5)
    given = LogitRows(POSITIONS, logits)
    assert given.logits() is logits and torch.equal(given.at(MASKED).logits(), logits[MASKED[POSITIONS]])


@pytest.mark.parametrize("declared", [(), (MASKED,), (POSITIONS,), (FIRST,), (MASKED, FIRST)])
@pytest.mark.parametrize("teacher_as_head", [False, True])
def test_kl_on_a_student_head_equals_the_formula_whichever_rows_are_formed(declared, teacher_as_head):
    student, teacher = head(1), head(2)
    reference = [tensor.clone().requires_grad_() for tensor in student.linear]
    expected = soft_kl_loss(LinearRows(*reference).logits()[FIRST[POSITIONS]],
                            teacher.logits()[FIRST[POSITIONS]], temperature=2.0)
    expected.backward()
    parameters = [tensor.clone().requires_grad_() for tensor in student.linear]
    rows = LogitRows(POSITIONS, LinearRows(*parameters)).planned(declared)
    teacher_rows = LogitRows(POSITIONS, teacher if teacher_as_head else teacher.logits())
    loss = rows.at(FIRST).soft_kl(teacher_rows.at(FIRST), temperature=2.0)
    loss.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=0, abs=1e-6)
    for got, want in zip(parameters, reference, strict=True):
        assert torch.allclose(got.grad, want.grad, rtol=0, atol=1e-6)


def test_kl_over_a_shared_vocabulary_and_from_a_cache(monkeypatch):
    student, teacher = head(3, vocab=9), head(4, vocab=6)
    rows, teacher_rows = LogitRows(POSITIONS, student), LogitRows(POSITIONS, teacher)
    shared = rows.at(MASKED).soft_kl(teacher_rows.at(MASKED), 2.0, vocab=6)
    index = MASKED[POSITIONS]
    assert shared.item() == pytest.approx(
        soft_kl_loss(student.logits()[index, :6], teacher.logits()[index], 2.0).item(), rel=1e-6)
    logits = teacher.logits()
    top = logits.topk(3, dim=-1)
    cache = TopKLogits(top.values, top.indices, torch.logsumexp(logits / 2.0, -1), 2.0)
    cached = LogitRows(POSITIONS, cache)
    student_rows = LogitRows(POSITIONS, head(3, vocab=6))
    got = student_rows.at(MASKED).soft_kl(cached.at(MASKED), 2.0)
    want = topk_kl_loss(head(3, vocab=6).logits()[index], top.values[index], top.indices[index],
                        cache.log_norm[index], 2.0)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    with pytest.raises(BiodistilError, match=r"temperature 2\.0"):
        student_rows.soft_kl(cached, 1.0)
    with pytest.raises(TypeError, match="top-k"):
        cached.logits()
