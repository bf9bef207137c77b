"""Losses across tokenizers checked against values worked out by hand, then their gradients: they reach the student
(never its tokens of no unit), a teacher given without gradient stays without one."""

import math

import pytest
import torch
from modernbert_fixtures import modernbert_arch, train_bpe
from torch import nn

from biodistil.config import ArchitectureConfig, MaskingConfig
from biodistil.data.masking import MaskingVocabulary
from biodistil.data.shared_vocabulary import shared_vocabulary
from biodistil.data.token_alignment import (
    NO_UNIT,
    align_texts,
    first_tokens,
    mask_same_words,
    membership,
    pooling_matrix,
)
from biodistil.data.vocab import train_wordpiece
from biodistil.losses.cross_tokenizer import (
    LOG_FLOOR,
    grouped_log_probs,
    pool_attention,
    pool_to_words,
    shared_vocab_kl_loss,
    uld_loss,
    word_attention_kl_loss,
    word_attention_mse_loss,
    word_hidden_cosine_loss,
    word_hidden_mse_loss,
    word_relations_loss,
)
from biodistil.models.features import FeatureRequest, extract_features
from biodistil.models.student import model_from_architecture

# student: 3 tokens, the first two one word; teacher: 3 tokens, the last of no unit; a third unit is padding
STUDENT_UNITS = torch.tensor([[0, 0, 1]])
TEACHER_UNITS = torch.tensor([[0, 1, NO_UNIT]])
UNIT_MASK = torch.tensor([[True, True, False]])


def poolings(width: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return pooling_matrix(STUDENT_UNITS, width), pooling_matrix(TEACHER_UNITS, width)


# ------------------------------------------------------------------------------------------ pooling
def test_pool_to_words_averages_each_words_tokens() -> None:
    states = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [1.0, 3.0], [9.0, 9.0]]])
    pooling = pooling_matrix(torch.tensor([[0, 0, 1, NO_UNIT]]), 3)
    assert pool_to_words(states, pooling).tolist() == [[[1.0, 1.0], [1.0, 3.0], [0.0, 0.0]]]
    with pytest.raises(ValueError, match="pooling"):
        pool_to_words(states, pooling[:, :, :3])


def test_pool_attention_sums_keys_averages_queries_and_renormalises() -> None:
    # token 3 belongs to no unit: its key mass is dropped, then each word row is renormalised
    attention = torch.tensor([[[[0.4, 0.2, 0.2, 0.2],
                                [0.2, 0.2, 0.4, 0.2],
                                [0.1, 0.1, 0.5, 0.3],
                                [0.25, 0.25, 0.25, 0.25]]]])
    member = membership(torch.tensor([[0, 0, 1, NO_UNIT]]), 2)
    # word 0 queries = mean of rows 0, 1 = (0.3, 0.2, 0.3, 0.2): keys of word 0 = 0.5, of word 1 = 0.3 → /0.8
    # word 1 query = row 2: keys of word 0 = 0.2, of word 1 = 0.5 → /0.7
    expected = torch.tensor([[[[0.625, 0.375], [2 / 7, 5 / 7]]]])
    torch.testing.assert_close(pool_attention(attention, member), expected)
    torch.testing.assert_close(pool_attention(attention, pooling_matrix(torch.tensor([[0, 0, 1, NO_UNIT]]), 2)),
                               expected)  # the mean pooling matrix has the same nonzero pattern


# ------------------------------------------------------------------------------------------ hidden states
def test_word_hidden_mse_by_hand() -> None:
    student = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]]])  # words (1, 1) and (1, 1)
    teacher = torch.tensor([[[1.0, 1.0], [3.0, 3.0], [7.0, 7.0]]])  # words (1, 1) and (3, 3); (7, 7) is no word's
    # word 0: 0; word 1: ((1−3)² + (1−3)²)/2 = 4; mean over the 2 units = 2
    assert word_hidden_mse_loss(student, teacher, *poolings(), UNIT_MASK).item() == pytest.approx(2.0)


def test_word_hidden_cosine_by_hand() -> None:
    student = torch.tensor([[[2.0, 0.0], [0.0, 0.0], [5.0, 5.0]]])  # word 0 = (1, 0); word 1 = (5, 5)
    teacher = torch.tensor([[[1.0, 1.0], [1.0, 1.0], [0.0, 3.0]]])  # word 0 = (1, 1); word 1 = (1, 1)
    # word 0: 1 − 1/√2; word 1: 1 − 1 = 0; mean = (1 − 1/√2)/2
    value = word_hidden_cosine_loss(student, teacher, *poolings(), UNIT_MASK).item()
    assert value == pytest.approx((1 - 1 / math.sqrt(2)) / 2)


# ------------------------------------------------------------------------------------------ attention, relations
STUDENT_ATTENTION = torch.tensor([[[[0.4, 0.2, 0.2, 0.2],
                                    [0.2, 0.2, 0.4, 0.2],
                                    [0.1, 0.1, 0.5, 0.3],
                                    [0.25, 0.25, 0.25, 0.25]]]])
STUDENT_ATTENTION_UNITS = torch.tensor([[0, 0, 1, NO_UNIT]])  # word map [[0.625, 0.375], [2/7, 5/7]] (above)
TEACHER_ATTENTION = torch.full((1, 1, 2, 2), 0.5)
TEACHER_ATTENTION_UNITS = torch.tensor([[0, 1]])


def _attention_inputs() -> tuple[torch.Tensor, ...]:
    return (STUDENT_ATTENTION, TEACHER_ATTENTION, membership(STUDENT_ATTENTION_UNITS, 2),
            membership(TEACHER_ATTENTION_UNITS, 2), torch.tensor([[True, True]]))


def test_word_attention_kl_by_hand() -> None:
    row0 = 0.625 * math.log(0.625 / 0.5) + 0.375 * math.log(0.375 / 0.5)
    row1 = 2 / 7 * math.log((2 / 7) / 0.5) + 5 / 7 * math.log((5 / 7) / 0.5)
    assert word_attention_kl_loss(*_attention_inputs()).item() == pytest.approx((row0 + row1) / 2, rel=1e-5)
    assert word_attention_kl_loss(*_attention_inputs(), reduction="sum").item() == pytest.approx(row0 + row1, rel=1e-5)


def test_word_attention_mse_by_hand() -> None:
    # squared errors: 0.125² twice (row 0), (3/14)² twice (row 1); mean over the 4 (query, key) pairs
    expected = (2 * 0.125**2 + 2 * (3 / 14) ** 2) / 4
    assert word_attention_mse_loss(*_attention_inputs()).item() == pytest.approx(expected, rel=1e-5)


def test_word_relations_by_hand() -> None:
    # Q vectors (d = 1, one relation head): student words (2+0)/2 = 1 and 0, teacher words 0 and 0
    student_q = torch.tensor([[[2.0], [0.0], [0.0]]])
    teacher_q = torch.tensor([[[0.0], [0.0], [4.0]]])
    # R_S row 0 = softmax(1·1, 1·0), row 1 = (½, ½); R_T rows = (½, ½)
    # KL(R_T ‖ R_S) row 0 = ½·ln(½(1+e)/e) + ½·ln(½(1+e)) = ln((1+e)/2) − ½; row 1 = 0; mean over the 2 rows
    expected = (math.log((1 + math.e) / 2) - 0.5) / 2
    value = word_relations_loss({"q": student_q}, {"q": teacher_q}, *poolings(2), torch.tensor([[True, True]]),
                                num_relation_heads=1, relations=("q",))
    assert value.item() == pytest.approx(expected, rel=1e-5)


# ------------------------------------------------------------------------------------------ vocabulary logits
def test_grouped_log_probs_by_hand_and_exact_where_probabilities_underflow() -> None:
    log_probs = torch.tensor([[0.5, 0.3, 0.2]]).log()
    grouped = grouped_log_probs(log_probs, torch.tensor([0, 1, 0]), 3)
    torch.testing.assert_close(grouped[:, :2], torch.tensor([[0.7, 0.3]]).log())
    assert grouped[0, 2].item() == LOG_FLOOR  # a group without tokens
    tiny = grouped_log_probs(torch.tensor([[-200.0, -201.0, 0.0]]), torch.tensor([0, 0, 1]), 2)
    assert tiny[0, 0].item() == pytest.approx(-200 + math.log(1 + math.exp(-1)), rel=1e-6)


def test_grouped_log_probs_gradient_is_the_plain_formulas() -> None:
    log_probs = torch.log_softmax(torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
                                  -1).requires_grad_()
    groups = torch.tensor([0, 1, 0, 2, 1, 0])
    assert torch.autograd.gradcheck(lambda x: grouped_log_probs(x, groups, 3), (log_probs,))


# student vocabulary: 3 tokens → keys 0, 1, none; teacher: 4 tokens → keys 0, 0, 1, none
STUDENT_KEYS = torch.tensor([0, 1, NO_UNIT])
TEACHER_KEYS = torch.tensor([0, 0, 1, NO_UNIT])
STUDENT_P = torch.tensor([[0.5, 0.3, 0.2]])
TEACHER_P = torch.tensor([[0.4, 0.2, 0.2, 0.2]])


def test_shared_vocab_kl_renormalised_over_shared_keys_by_hand() -> None:
    # student keys (0.5, 0.3)/0.8 = (0.625, 0.375); teacher keys (0.6, 0.2)/0.8 = (0.75, 0.25)
    expected = 0.75 * math.log(0.75 / 0.625) + 0.25 * math.log(0.25 / 0.375)
    value = shared_vocab_kl_loss(STUDENT_P.log(), TEACHER_P.log(), STUDENT_KEYS, TEACHER_KEYS, 2)
    assert value.item() == pytest.approx(expected, rel=1e-5)
    # at T = 2 with logits 2·log p the tempered distributions are the same: the value is T² times
    tempered = shared_vocab_kl_loss(2 * STUDENT_P.log(), 2 * TEACHER_P.log(), STUDENT_KEYS, TEACHER_KEYS, 2,
                                    temperature=2.0)
    assert tempered.item() == pytest.approx(4 * expected, rel=1e-5)


def test_shared_vocab_kl_with_a_tail_bucket_by_hand() -> None:
    # buckets: student (0.5, 0.3, tail 0.2), teacher (0.6, 0.2, tail 0.2)
    expected = 0.6 * math.log(0.6 / 0.5) + 0.2 * math.log(0.2 / 0.3) + 0.2 * math.log(0.2 / 0.2)
    value = shared_vocab_kl_loss(STUDENT_P.log(), TEACHER_P.log(), STUDENT_KEYS, TEACHER_KEYS, 2, tail=True)
    assert value.item() == pytest.approx(expected, rel=1e-5)


def test_shared_vocab_kl_ignores_mass_outside_the_shared_keys_unless_a_tail_is_kept() -> None:
    # both put equal mass on the two shared keys; they differ only outside them
    student, teacher = torch.tensor([[0.25, 0.25, 0.5]]).log(), torch.tensor([[0.4, 0.0, 0.4, 0.2]]).log()
    renormalised = shared_vocab_kl_loss(student, teacher, STUDENT_KEYS, TEACHER_KEYS, 2)
    assert abs(renormalised.item()) < 1e-6
    expected = 2 * 0.4 * math.log(0.4 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    tail = shared_vocab_kl_loss(student, teacher, STUDENT_KEYS, TEACHER_KEYS, 2, tail=True)
    assert tail.item() == pytest.approx(expected, rel=1e-5)


def test_uld_by_hand() -> None:
    # sorted: student (0.5, 0.3, 0.2, 0) after padding, teacher (0.6, 0.2, 0.1, 0.1): |·| = 0.1 each
    student, teacher = torch.tensor([[0.5, 0.3, 0.2]]).log(), torch.tensor([[0.1, 0.6, 0.2, 0.1]]).log()
    assert uld_loss(student, teacher).item() == pytest.approx(0.4, rel=1e-5)
    assert uld_loss(teacher, student).item() == pytest.approx(0.4, rel=1e-5)  # symmetric, either side longer
    # two rows: the mean; a permutation of a row's tokens changes nothing
    two = uld_loss(torch.cat([student, student[:, [2, 0, 1]]]), torch.cat([teacher, teacher]))
    assert two.item() == pytest.approx(0.4, rel=1e-5)


def test_logit_losses_of_no_rows_are_zero_with_a_graph() -> None:
    student = torch.zeros(0, 3, requires_grad=True)
    for value in (shared_vocab_kl_loss(student, torch.zeros(0, 4), STUDENT_KEYS, TEACHER_KEYS, 2),
                  uld_loss(student, torch.zeros(0, 4))):
        assert value.item() == 0.0 and value.requires_grad


# ------------------------------------------------------------------------------------------ gradients
def _hidden_inputs(teacher_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(1, 3, 4, generator=generator).requires_grad_()
    teacher = torch.randn(1, 3, 4, generator=generator).requires_grad_(teacher_grad)
    return student, teacher


LOSSES = {
    "hidden_mse": lambda s, t: word_hidden_mse_loss(s, t, *poolings(), UNIT_MASK),
    "hidden_cosine": lambda s, t: word_hidden_cosine_loss(s, t, *poolings(), UNIT_MASK),
    "relations": lambda s, t: word_relations_loss({"q": s, "k": s}, {"q": t, "k": t}, *poolings(), UNIT_MASK, 2,
                                                  ("q", "k")),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_word_losses_send_gradient_to_the_student_only(name: str) -> None:
    student, teacher = _hidden_inputs(teacher_grad=False)
    LOSSES[name](student, teacher).backward()
    assert teacher.grad is None
    assert torch.isfinite(student.grad).all() and student.grad.abs().sum() > 0


def test_student_tokens_of_no_unit_get_no_gradient() -> None:
    student, teacher = _hidden_inputs(teacher_grad=False)
    student_units = torch.tensor([[0, NO_UNIT, 1]])
    word_hidden_mse_loss(student, teacher, pooling_matrix(student_units, 3), poolings()[1], UNIT_MASK).backward()
    assert student.grad[0, 1].abs().sum() == 0 and student.grad[0, 0].abs().sum() > 0


def test_attention_and_logit_losses_send_gradient_to_the_student_only() -> None:
    generator = torch.Generator().manual_seed(2)
    student_scores = torch.randn(1, 1, 4, 4, generator=generator).requires_grad_()
    teacher_attention = torch.softmax(torch.randn(1, 1, 2, 2, generator=generator), -1)
    inputs = _attention_inputs()
    for loss in (word_attention_kl_loss, word_attention_mse_loss):
        student_scores.grad = None
        loss(torch.softmax(student_scores, -1), teacher_attention, *inputs[2:]).backward()
        assert torch.isfinite(student_scores.grad).all() and student_scores.grad.abs().sum() > 0
    student_logits = torch.randn(2, 3, generator=generator).requires_grad_()
    teacher_logits = torch.randn(2, 4, generator=generator)
    for tail in (False, True):
        student_logits.grad = None
        shared_vocab_kl_loss(student_logits, teacher_logits, STUDENT_KEYS, TEACHER_KEYS, 2, tail=tail).backward()
        assert torch.isfinite(student_logits.grad).all() and student_logits.grad.abs().sum() > 0
    student_logits.grad = None
    uld_loss(student_logits, teacher_logits).backward()
    assert torch.isfinite(student_logits.grad).all() and student_logits.grad.abs().sum() > 0
    assert not teacher_logits.requires_grad and teacher_logits.grad is None


def test_a_teacher_that_requires_grad_receives_one() -> None:
    # the documented convention of biodistil.losses: nothing is detached (MetaDistil updates its teacher)
    student, teacher = _hidden_inputs(teacher_grad=True)
    word_hidden_mse_loss(student, teacher, *poolings(), UNIT_MASK).backward()
    assert teacher.grad is not None and teacher.grad[0, 2].abs().sum() == 0  # its token of no unit: none
    teacher_logits = torch.randn(2, 4).requires_grad_()
    shared_vocab_kl_loss(torch.randn(2, 3), teacher_logits, STUDENT_KEYS, TEACHER_KEYS, 2).backward()
    assert torch.isfinite(teacher_logits.grad).all()


# ------------------------------------------------------------------------------------------ end to end
LINES = ["IL-2 induced p53-deficient cells in Müller glia (n=12).", "The café patients' TNF-α levels rose.",
         "BRCA1 mutation carriers; p53 and IL-2 pathways."] * 10


def test_a_bpe_modernbert_teacher_teaches_a_wordpiece_bert_student_every_term(tmp_path) -> None:
    teacher_tokenizer = train_bpe(LINES, 300, tmp_path / "bpe")
    student_tokenizer = train_wordpiece(LINES, 150, lowercase=False, min_frequency=1)
    torch.manual_seed(0)
    teacher = model_from_architecture(modernbert_arch(layers=2, hidden=32, heads=2, window=4), teacher_tokenizer)
    student = model_from_architecture(ArchitectureConfig(num_layers=2, hidden_size=24, num_heads=2,
                                                         intermediate_size=48, max_position_embeddings=64),
                                      student_tokenizer)
    teacher.requires_grad_(False)
    batch = align_texts(LINES[:3], student_tokenizer, teacher_tokenizer)
    chosen, student_side, teacher_side = mask_same_words(
        batch, MaskingVocabulary.from_tokenizer(student_tokenizer), MaskingVocabulary.from_tokenizer(teacher_tokenizer),
        MaskingConfig(probability=0.5), torch.Generator().manual_seed(0))
    request = FeatureRequest(hidden={-1}, logits=True, attentions={-1}, qkv={-1})
    features = {}
    for name, model, inputs, side, units in (
            ("student", student, batch.student_inputs, student_side, batch.student_units),
            ("teacher", teacher, batch.teacher_inputs, teacher_side, batch.teacher_units)):
        features[name] = extract_features(model, {**inputs, "input_ids": side.input_ids}, request,
                                          first_tokens(units, chosen))
    s, t, width = features["student"], features["teacher"], batch.num_units
    pools = pooling_matrix(batch.student_units, width), pooling_matrix(batch.teacher_units, width)
    members = membership(batch.student_units, width), membership(batch.teacher_units, width)
    vocabulary = shared_vocabulary(student_tokenizer, teacher_tokenizer, student.config.vocab_size,
                                   teacher.config.vocab_size)
    student_logits, teacher_logits = s.logits.logits(), t.logits.logits()
    assert student_logits.size(0) == teacher_logits.size(0) == int(chosen.sum()) > 0
    projection = nn.Linear(24, 32)
    values = {
        "hidden_mse": word_hidden_mse_loss(projection(s.hidden_at(-1)), t.hidden_at(-1), *pools, batch.unit_mask),
        "attention_kl": word_attention_kl_loss(s.attention_at(-1), t.attention_at(-1), *members, batch.unit_mask),
        "relations": word_relations_loss(s.qkv_at(-1), t.qkv_at(-1), *pools, batch.unit_mask, 2),
        "shared_kl": shared_vocab_kl_loss(student_logits, teacher_logits, vocabulary.student_index,
                                          vocabulary.teacher_index, vocabulary.size, temperature=2.0),
        "uld": uld_loss(student_logits, teacher_logits),
    }
    assert all(torch.isfinite(v) and v > 0 for v in values.values()), values
    torch.stack(list(values.values())).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in student.bert.encoder.parameters())
    assert student.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
