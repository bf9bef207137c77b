"""VE-KD invariants: expanded vocabulary, new-token embeddings, masking, teacher inputs, KD positions, hinge."""

import copy
from dataclasses import replace

import pytest
import torch
from numerics import CLOSE, perturbed

from biodistil.config import (
    ArchitectureConfig,
    DistillRecipe,
    MaskingConfig,
    ObjectiveConfig,
    TermConfig,
    validate_recipe,
)
from biodistil.data.batch import Batch
from biodistil.data.corpus import collate_blocks, pack_blocks
from biodistil.data.masking import MaskingVocabulary
from biodistil.data.vocab import train_wordpiece
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.methods.vekd import VocabExpansionMaskBatch, expanded_student
from biodistil.models.logits import LinearRows, LogitRows
from biodistil.models.student import model_from_architecture
from biodistil.models.vocab_expansion import (
    expand_tokenizer,
    select_new_tokens,
    teacher_pieces,
    train_domain_vocabulary,
)
from biodistil.training.engine import make_accelerator

VEKD_TERMS = [
    TermConfig(loss="hidden_cosine", positions="known", epsilon=0.0),
    TermConfig(loss="logit_kl", positions="known", epsilon=0.0),
    TermConfig(loss="logit_mse", positions="known", epsilon=0.0, vocab_reduction="sum"),
    TermConfig(loss="mlm"),
]


@pytest.fixture(scope="module")
def small_teacher(tmp_path_factory, corpus_file):
    """A teacher whose 70-entry vocabulary splits most corpus words, so expansion finds many new tokens."""
    lines = corpus_file.read_text().splitlines()
    tokenizer = train_wordpiece(lines, vocab_size=70, min_frequency=1)
    torch.manual_seed(0)
    model = model_from_architecture(ArchitectureConfig(
        num_layers=4, hidden_size=16, num_heads=2, intermediate_size=32, max_position_embeddings=64, dropout=0.0),
        tokenizer)
    folder = tmp_path_factory.mktemp("small-teacher")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.eval(), tokenizer, folder


@pytest.fixture(scope="module")
def vekd(tmp_path_factory, small_teacher, corpus_file):
    teacher, tokenizer, folder = small_teacher
    run = tmp_path_factory.mktemp("vekd-run")
    recipe = validate_recipe(DistillRecipe, {
        "teacher": {"name_or_path": str(folder)}, "data": {"train": [str(corpus_file)]},
        "student": {"init": "teacher_layers", "layers": [0, 2],
                    "vocab_expansion": {"vocab_size": 150, "min_frequency": 1}},
        "objective": {"terms": [t.model_dump() for t in VEKD_TERMS]},
    })
    student, expanded, base = expanded_student(recipe, teacher, tokenizer, run, make_accelerator("no"))
    return teacher, tokenizer, student.eval(), expanded, base


def blocks(corpus_file, tokenizer, count=4):
    lines = iter(corpus_file.read_text().splitlines())
    return Batch.of(collate_blocks(list(pack_blocks(lines, tokenizer, 32))[:count], tokenizer.pad_token_id))


def test_expanded_vocabulary_keeps_teacher_ids_and_appends_domain_tokens(vekd, corpus_file):
    _, tokenizer, student, expanded, base = vekd
    assert base == len(tokenizer) == 70 and len(expanded) == 150
    vocab = expanded.get_vocab()
    assert all(vocab[token] == index for token, index in tokenizer.get_vocab().items())
    assert student.config.vocab_size == 150
    batch = blocks(corpus_file, expanded)
    assert (batch.input_ids >= base).float().mean() > 0.1, "the corpus is read with the new tokens"


def test_new_token_embeddings_start_as_the_mean_of_their_teacher_pieces(vekd):
    teacher, tokenizer, student, expanded, base = vekd
    vocab = expanded.get_vocab()
    teacher_rows = teacher.get_input_embeddings().weight
    student_rows = student.get_input_embeddings().weight
    for token, index in vocab.items():
        if index >= base:
            pieces = teacher_pieces(token, tokenizer.get_vocab(), tokenizer.unk_token_id)
            assert torch.allclose(student_rows[index], teacher_rows[pieces].mean(0), atol=1e-6), token
            assert torch.allclose(student.cls.predictions.bias[index], teacher.cls.predictions.bias[pieces].mean())
    assert torch.equal(student_rows[:base], teacher_rows[:base])


def test_teacher_pieces_greedy_longest_match():
    vocab = {"[UNK]": 0, "hep": 1, "he": 2, "##pat": 3, "##o": 4, "##cyte": 5, "##at": 6, "o": 7, "##p": 8}
    assert teacher_pieces("hepatocyte", vocab, 0) == [1, 6, 4, 5]  # hep ##at ##o ##cyte
    assert teacher_pieces("##patocyte", vocab, 0) == [3, 4, 5], "a continuation entry splits into ## pieces"
    assert teacher_pieces("xyz", vocab, 0) == [0]


def test_domain_tokens_follow_the_teacher_normaliser(corpus_file):
    lines = corpus_file.read_text().splitlines()
    lower = train_wordpiece(lines, vocab_size=70, min_frequency=1, lowercase=True)
    domain = train_domain_vocabulary([line.upper() for line in lines], lower, 150, 1)
    assert all(t == t.lower() for t in domain if not t.startswith("[")), "upper-case text, lower-cased tokens"
    new = select_new_tokens(domain, lower, 20)
    assert len(new) == 20 and not set(new) & set(lower.get_vocab())
    expanded = expand_tokenizer(lower, new)
    assert expanded.tokenize("INTERLEUKIN") == expanded.tokenize("interleukin")


def masker(expanded, base, **masking):
    return VocabExpansionMaskBatch(MaskingVocabulary.from_tokenizer(expanded), MaskingConfig(**masking), base)


def test_masking_new_tokens_are_targets_and_teacher_never_sees_an_unknown_id(vekd, corpus_file):
    _, tokenizer, _, expanded, base = vekd
    batch = blocks(corpus_file, expanded, count=8)
    batch.attention_mask[0, 20:] = 0
    batch.input_ids[0, 20:] = expanded.pad_token_id
    new = (batch.input_ids >= base) & batch.attention_mask.bool()
    special = torch.tensor(sorted(tokenizer.all_special_ids))
    for seed in range(20):
        out = masker(expanded, base, probability=0.3)(batch, torch.Generator().manual_seed(seed))
        teacher_ids = out.teacher["input_ids"]
        assert int(teacher_ids.max()) < base, "the teacher never receives an id outside its vocabulary"
        assert torch.equal(out.masks["new_tokens"], new)
        assert torch.equal(out.labels[new], batch.input_ids[new]), "new tokens are always MLM targets"
        assert (teacher_ids[new] == tokenizer.mask_token_id).all(), "the teacher reads [MASK] at new tokens"
        replaced = (out.input_ids != batch.input_ids) & (out.input_ids != tokenizer.mask_token_id)
        assert (out.input_ids[replaced] < base).all(), "random replacements come from the teacher's vocabulary"
        assert not torch.isin(out.input_ids[replaced], special).any()
        ordinary_targets = (out.labels != -100) & ~new
        assert (batch.input_ids[ordinary_targets] < base).all()
        same = ~new & (out.input_ids < base)
        assert torch.equal(teacher_ids[same], out.input_ids[same]), "elsewhere both read the same ids"
    many = masker(expanded, base, probability=0.15)(batch, torch.Generator().manual_seed(0))
    share = ((many.labels != -100) & ~new).sum() / (~new & batch.attention_mask.bool()).sum()
    assert 0.05 < share.item() < 0.3, "about 15% of ordinary tokens are chosen"


def test_the_teacher_forward_only_gets_teacher_ids(vekd, corpus_file):
    teacher, _, student, expanded, base = vekd
    module = MaskedLMModule(student, Objective(ObjectiveConfig(terms=VEKD_TERMS), student, teacher), teacher, base)
    seen = []
    handle = teacher.get_input_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0].max()))
    batch = masker(expanded, base)(blocks(corpus_file, expanded), torch.Generator().manual_seed(1))
    try:
        loss, logs = module(batch)
    finally:
        handle.remove()
    assert seen and max(int(s) for s in seen) < base
    assert torch.isfinite(loss) and {"loss_mlm", "loss_logit_kl", "loss_logit_kl_raw"} <= set(logs)


def test_kd_terms_ignore_student_outputs_at_new_token_positions(vekd, corpus_file):
    teacher, _, student, expanded, base = vekd
    student = perturbed(copy.deepcopy(student), seed=9)  # KD terms far above rounding noise
    objective = Objective(ObjectiveConfig(terms=VEKD_TERMS), student, teacher)
    module = MaskedLMModule(student, objective, teacher, base)
    batch = masker(expanded, base)(blocks(corpus_file, expanded), torch.Generator().manual_seed(2))
    new = batch.masks["new_tokens"]
    assert new.any()
    captured = {}
    original = objective.forward
    generator = torch.Generator().manual_seed(10)

    def perturb_new_positions(inputs):
        captured["before"] = original(inputs)[1]
        rows = new[inputs.student.logits.positions]
        head = inputs.student.logits.source  # the head's decoder input: logits are formed from it
        moved = head.inputs.clone()
        moved[rows] += 5.0 * torch.randn(moved[rows].shape, generator=generator)
        logits = LogitRows(inputs.student.logits.positions, LinearRows(moved, head.weight, head.bias))
        features = inputs.student = replace(inputs.student, logits=logits)
        last = features.hidden_at(-1).clone()
        last[new] = torch.randn(last[new].shape, generator=generator)
        features.hidden[features.num_layers] = last
        captured["after"] = original(inputs)[1]
        return captured["after"]

    objective.forward = perturb_new_positions
    with torch.no_grad():
        module(batch)
    before, after = captured["before"], captured["after"]
    for name in ("loss_hidden_cosine", "loss_logit_kl", "loss_logit_mse"):
        assert before[name].item() > 1e-3, name
        assert after[name].item() == pytest.approx(before[name].item(), **CLOSE), name
    assert after["loss_mlm"].item() != pytest.approx(before["loss_mlm"].item()), "the MLM does see them"


def test_hinge_zero_below_epsilon_and_gradient_above(vekd, corpus_file):
    teacher, _, student, expanded, base = vekd
    batch = masker(expanded, base)(blocks(corpus_file, expanded), torch.Generator().manual_seed(3))
    for epsilon, expect_gradient in ((1e6, False), (0.0, True)):
        student.zero_grad(set_to_none=True)
        terms = [TermConfig(loss="logit_mse", positions="known", epsilon=epsilon, hinge_weight=2.0,
                            vocab_reduction="sum")]
        module = MaskedLMModule(student, Objective(ObjectiveConfig(terms=terms), student, teacher), teacher, base)
        loss, logs = module(batch)
        loss.backward()
        gradient = sum(p.grad.abs().sum() for p in student.parameters() if p.grad is not None)
        if expect_gradient:  # max(W·L − 0, 0) = W·L, with gradient
            assert loss.item() == pytest.approx(2.0 * logs["loss_logit_mse_raw"].item(), rel=1e-6)
            assert gradient > 0
        else:  # W·L < ε: the term is zero and passes no gradient
            assert loss.item() == 0.0 and logs["loss_logit_mse_raw"].item() > 0
            assert gradient == 0
