"""ModernBERT as teacher and student, on tiny offline models: hooked attention equals eager attention on global and
local layers with padding, students keep their layers' attention types, every task-agnostic term runs between
ModernBERT and BERT models, and the exported student loads with AutoModelForMaskedLM."""

import copy

import pytest
import torch
from modernbert_fixtures import modernbert_arch, padded_batch, save_modernbert, train_bpe
from numerics import CLOSE, perturbed
from transformers import AutoConfig, AutoModelForMaskedLM

from biodistil.config import ArchitectureConfig, ObjectiveConfig, StudentConfig, TermConfig
from biodistil.data.batch import Batch
from biodistil.errors import BiodistilError
from biodistil.losses.layers import attention_kl_loss, attention_mse_loss
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.models.attention import restrict_to_window
from biodistil.models.families import attention_window, global_period, layer_list, qkv_modules
from biodistil.models.features import FeatureRequest, extract_features
from biodistil.models.saving import export_model
from biodistil.models.student import build_student, model_from_architecture, student_from_teacher_layers

GLOBAL, LOCAL = "full_attention", "sliding_attention"


@pytest.fixture(scope="module")
def bpe(corpus_file, tmp_path_factory):
    return train_bpe(corpus_file.read_text().splitlines(), 400, tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def modernbert_dir(bpe, tmp_path_factory):
    return save_modernbert(bpe, tmp_path_factory.mktemp("modernbert"))


@pytest.fixture()
def modernbert(modernbert_dir):
    return AutoModelForMaskedLM.from_pretrained(modernbert_dir).eval()


def bert_student(tokenizer, hidden: int = 16, layers: int = 2):
    torch.manual_seed(1)
    arch = ArchitectureConfig(num_layers=layers, hidden_size=hidden, num_heads=2, intermediate_size=32,
                              max_position_embeddings=64, dropout=0.0)
    return model_from_architecture(arch, tokenizer)


def test_hooked_attention_equals_eager_attention_on_global_and_local_layers(modernbert):
    eager_config = copy.deepcopy(modernbert.config)
    eager = AutoModelForMaskedLM.from_config(eager_config, attn_implementation="eager").eval()
    eager.load_state_dict(modernbert.state_dict())
    assert modernbert.config.layer_types == [GLOBAL, LOCAL, LOCAL, GLOBAL]
    batch = padded_batch(modernbert.config.vocab_size)
    features = extract_features(modernbert, batch, FeatureRequest(attentions={1, 2, 3, 4}), None)
    assert modernbert.config._attn_implementation == "sdpa", "the model keeps its fast kernel"
    with torch.no_grad():
        reference = eager(**batch, output_attentions=True).attentions
    real = batch["attention_mask"].bool()
    pairs = (real[:, None, :, None] & real[:, None, None, :]).expand_as(reference[0])
    for layer in range(1, 5):
        assert torch.allclose(features.attentions[layer][pairs], reference[layer - 1][pairs], atol=1e-6), layer
        assert features.attentions[layer][1, :, :5, 7:].abs().max() == 0, "no weight on padded keys"
    # a local layer (window ±2) gives no weight beyond its window; a global one does
    assert attention_window(modernbert.config, 2) == 2 and attention_window(modernbert.config, 1) is None
    assert features.attentions[2][0, :, 0, 3:].abs().max() == 0
    assert features.attentions[1][0, :, 0, 3:].min() > 0


def test_qkv_hooks_only_on_inspected_layers_and_removed(modernbert):
    batch = padded_batch(modernbert.config.vocab_size)
    features = extract_features(modernbert, batch, FeatureRequest(qkv={-1}, attention_scores={2}), None)
    assert set(features.qkv) == {4} and set(features.attention_scores) == {2}
    assert {name: tuple(x.shape) for name, x in features.qkv[4].items()} == {n: (2, 12, 32) for n in "qkv"}
    for layer in range(1, 5):
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in qkv_modules(modernbert, layer))


def test_queries_and_keys_carry_the_rotary_embedding(modernbert):
    """Q·Kᵀ/√d from the hooked (rotated) Q and K is the model's own score: its softmax is the eager attention, and
    a token repeated at two positions has different rotated queries but the same values."""
    ids = torch.tensor([[7, 9, 7, 11]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    qkv = extract_features(modernbert, batch, FeatureRequest(qkv={1}), None).qkv[1]
    # layer 1 reads the embeddings directly: the same token at positions 0 and 2 has the same V, a rotated Q
    assert torch.allclose(qkv["v"][0, 0], qkv["v"][0, 2], atol=1e-6)
    assert (qkv["q"][0, 0] - qkv["q"][0, 2]).abs().max() > 1e-3


def test_global_period():
    assert global_period([GLOBAL, LOCAL, LOCAL, GLOBAL, LOCAL, LOCAL]) == 3
    assert global_period([GLOBAL, LOCAL]) == 2 and global_period([GLOBAL, GLOBAL]) == 1
    assert global_period([LOCAL, GLOBAL]) is None and global_period([GLOBAL, LOCAL, GLOBAL, GLOBAL]) is None


def test_student_layers_keep_their_attention_type(bpe, tmp_path):
    teacher = AutoModelForMaskedLM.from_pretrained(save_modernbert(bpe, tmp_path / "t6", layers=6)).eval()
    assert teacher.config.layer_types == [GLOBAL, LOCAL, LOCAL] * 2
    alternate = student_from_teacher_layers(teacher)  # layers 0, 2, 4: G, L, L — period 3 kept
    assert alternate.config.layer_types == [GLOBAL, LOCAL, LOCAL]
    assert alternate.config.global_attn_every_n_layers == 3
    explicit = student_from_teacher_layers(teacher, [2, 0, 3])  # L, G, G: no period, so the field goes
    assert explicit.config.layer_types == [LOCAL, GLOBAL, GLOBAL]
    assert not hasattr(explicit.config, "global_attn_every_n_layers")
    export_model(explicit, bpe, tmp_path / "explicit")
    assert AutoConfig.from_pretrained(tmp_path / "explicit").layer_types == [LOCAL, GLOBAL, GLOBAL]
    # ModernBERT's layer 0 has no pre-attention norm: teacher layer 0 at position 1 gets the embedding norm
    blocks = layer_list(explicit)
    assert isinstance(blocks[0].attn_norm, torch.nn.Identity)
    assert torch.equal(blocks[1].attn_norm.weight, teacher.model.embeddings.norm.weight)
    # each student layer computes its teacher layer's attention (same window, same rotary base) on the same input
    batch = padded_batch(teacher.config.vocab_size)
    taught = extract_features(alternate, batch, FeatureRequest(attentions={1, 2}), None).attentions
    source = extract_features(teacher, batch, FeatureRequest(attentions={1}), None).attentions
    assert torch.allclose(taught[1], source[1], atol=1e-6)
    assert taught[2][0, :, 0, 3:].abs().max() == 0, "student layer 2 is local like teacher layer 2"


def test_students_of_bare_encoders_and_classifiers(modernbert_dir):
    """`evaluate`'s and `finetune`'s model.layers copy layers of the bare encoder or a classifier the same way."""
    from transformers import AutoModel, AutoModelForTokenClassification

    for factory in (AutoModel, AutoModelForTokenClassification):
        model = factory.from_pretrained(modernbert_dir)
        student = student_from_teacher_layers(model, [1, 0])
        assert type(student) is type(model) and student.config.layer_types == [LOCAL, GLOBAL]
        norm = layer_list(student)[1].attn_norm.weight
        source = model.embeddings.norm.weight if factory is AutoModel else model.model.embeddings.norm.weight
        assert torch.equal(norm, source)


def test_modernbert_student_from_an_architecture(bpe):
    student = model_from_architecture(modernbert_arch(layers=5, every=2, window=8), bpe)
    assert student.config.layer_types == [GLOBAL, LOCAL, GLOBAL, LOCAL, GLOBAL]
    assert student.config.local_attention == 8 and student.config.pad_token_id == bpe.pad_token_id
    with pytest.raises(ValueError, match="global/local"):
        ArchitectureConfig(model_type="bert", local_attention=8)


def test_restrict_to_window_by_hand():
    # one query row over 3 keys (0.5, 0.3, 0.2) at query position 0: window 1 keeps keys 0, 1 → (0.625, 0.375, 0)
    probabilities = torch.tensor([[[[0.5, 0.3, 0.2], [0.2, 0.6, 0.2], [0.1, 0.1, 0.8]]]])
    restricted = restrict_to_window(probabilities, 1)
    assert torch.allclose(restricted[0, 0, 0], torch.tensor([0.625, 0.375, 0.0]))
    assert torch.allclose(restricted[0, 0, 1], probabilities[0, 0, 1]) and restrict_to_window(probabilities, None) \
        is probabilities
    # MSE with window 1 counts the 7 pairs with |i − j| ≤ 1 only: (0.3² + 0.2²) / 7 against zeros off one entry
    teacher = torch.zeros_like(probabilities)
    student = torch.zeros_like(probabilities)
    student[0, 0, 0, 1], student[0, 0, 0, 2], student[0, 0, 1, 0] = 0.3, 0.9, 0.2
    mask = torch.ones(1, 3, dtype=torch.bool)
    assert attention_mse_loss(student, teacher, mask, window=1).item() == pytest.approx((0.09 + 0.04) / 7)
    assert attention_mse_loss(student, teacher, mask).item() == pytest.approx((0.09 + 0.81 + 0.04) / 9)
    # KL with a window ignores the keys beyond it, where the teacher has no weight
    uniform = torch.full((1, 1, 3, 3), 1 / 3)
    windowed = restrict_to_window(uniform, 1)
    assert attention_kl_loss(windowed, windowed, mask, window=1).item() == pytest.approx(0.0, abs=1e-7)


LAYER_TERMS = [
    TermConfig(loss="hidden_mse", layer_map="uniform"), TermConfig(loss="hidden_cosine", layer_map="uniform"),
    TermConfig(loss="attention_mse", layer_map="uniform"),
    TermConfig(loss="attention_mse", layer_map="uniform", attention_map="scores"),
    TermConfig(loss="attention_kl", layer_map="uniform", token_reduction="sum"),
    TermConfig(loss="minilm_relations", num_relation_heads=2), TermConfig(loss="soft_ce"),
    TermConfig(loss="logit_kl"), TermConfig(loss="logit_mse"), TermConfig(loss="mlm"),
]


def _pair(kind: str, bpe, modernbert, tmp_path):
    """(student, teacher) for ModernBERT→ModernBERT, ModernBERT→BERT (other width) and BERT→ModernBERT."""
    if kind == "modernbert->modernbert":
        return perturbed(student_from_teacher_layers(modernbert, [0, 2]), seed=3), modernbert
    if kind == "modernbert->bert":
        return perturbed(bert_student(bpe), seed=3), modernbert
    teacher = perturbed(bert_student(bpe, hidden=32, layers=4), seed=5).eval()
    return perturbed(model_from_architecture(modernbert_arch(layers=2, hidden=16), bpe), seed=3), teacher


@pytest.mark.parametrize("kind", ["modernbert->modernbert", "modernbert->bert", "bert->modernbert"])
def test_every_term_runs_between_families_and_ignores_padding(kind, bpe, modernbert, tmp_path):
    student, teacher = _pair(kind, bpe, modernbert, tmp_path)
    module = MaskedLMModule(student, Objective(ObjectiveConfig(terms=LAYER_TERMS), student, teacher), teacher).eval()
    batch = padded_batch(len(bpe), pad=bpe.pad_token_id)
    labels = batch["input_ids"].masked_fill(torch.rand(2, 12, generator=torch.Generator().manual_seed(1)) > 0.4, -100)
    batch = Batch(batch, labels.masked_fill(batch["attention_mask"] == 0, -100))
    changed = batch.replace(inputs={**batch.inputs,
                                    "input_ids": batch.input_ids.masked_fill(batch.attention_mask == 0, 23)})
    loss, logs = module(batch)
    _, logs_changed = module(changed)
    assert len(logs) == len(LAYER_TERMS) and torch.isfinite(loss)
    for name, value in logs.items():
        assert 1e-3 < value.item() < 1e3, (name, value.item())
        assert logs_changed[name].item() == pytest.approx(value.item(), **CLOSE), name
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert qkv_modules(student, 1)[0].weight.grad.abs().sum() > 0, "attention terms reach the student's Q/K"


def test_build_student_from_a_modernbert_teacher_keeps_its_tokenizer(modernbert, bpe):
    student, tokenizer = build_student(StudentConfig(init="teacher_layers"), modernbert, bpe)
    assert tokenizer is bpe and student.config.num_hidden_layers == 2
    assert student.config.layer_types == [GLOBAL, LOCAL] and student.config.global_attn_every_n_layers == 2


def test_exported_student_loads_with_auto_model_for_masked_lm(modernbert, bpe, tmp_path):
    student = student_from_teacher_layers(modernbert, [0, 3])
    export_model(student, bpe, tmp_path / "student")
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path / "student").eval()
    batch = padded_batch(len(bpe), pad=bpe.pad_token_id)
    with torch.no_grad():
        assert torch.allclose(loaded(**batch).logits, student.eval()(**batch).logits, atol=1e-5)
    assert loaded.config.layer_types == [GLOBAL, GLOBAL]


def test_vocabulary_expansion_refuses_a_bpe_teacher_clearly(modernbert, bpe):
    from biodistil.models.vocab_expansion import wordpiece_settings

    with pytest.raises(BiodistilError, match="WordPiece"):
        wordpiece_settings(bpe)
