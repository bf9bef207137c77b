"""Building a student: from teacher layers, from an architecture, or from an existing compact model."""

import copy
import re

import torch
from transformers import AutoConfig, AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from biodistil.config import ArchitectureConfig, StudentConfig
from biodistil.errors import BiodistilError
from biodistil.models.families import family_of, layers_path, num_layers
from biodistil.models.loading import load_masked_lm, load_tokenizer
from biodistil.models.vocab_transfer import transfer_vocabulary


def build_student(
    cfg: StudentConfig, teacher: PreTrainedModel, teacher_tokenizer: Tokenizer,
    student_tokenizer: Tokenizer | None = None,
) -> tuple[PreTrainedModel, Tokenizer]:
    """The student and its tokenizer, as the recipe's `student.init` asks: with `student_tokenizer` (a vocabulary of
    its own, `student.tokenizer`), an architecture sized for it, or teacher layers whose embeddings are transferred
    to it (`biodistil.models.vocab_transfer`); else on the teacher's tokenizer."""
    tokenizer = student_tokenizer or teacher_tokenizer
    if cfg.init == "teacher_layers":
        student = student_from_teacher_layers(teacher, cfg.layers)
        if student_tokenizer is not None:
            transfer_vocabulary(student, teacher, student_tokenizer, teacher_tokenizer)
        return student, tokenizer
    if cfg.init == "architecture":
        assert cfg.architecture is not None
        return model_from_architecture(cfg.architecture, tokenizer), tokenizer
    assert cfg.name_or_path is not None
    student = load_masked_lm(cfg.name_or_path, trust_remote_code=cfg.trust_remote_code)
    return student, load_tokenizer(cfg.name_or_path, trust_remote_code=cfg.trust_remote_code)


def alternate_layers(num_teacher_layers: int) -> list[int]:
    """Every other teacher layer, starting at the first: 12 layers -> 0, 2, 4, 6, 8, 10.

    Each student layer keeps its teacher layer's attention type (ModernBERT: global or local), so a teacher that is
    global every n-th layer with n odd (ModernBERT's n = 3) gives a student that is again global every n-th layer:
    teacher layer 2i is global exactly when i % n == 0.
    """
    return list(range(0, num_teacher_layers, 2))


def student_from_teacher_layers(teacher: PreTrainedModel, layers: list[int] | None = None) -> PreTrainedModel:
    """A shallower copy of the teacher: its embeddings, heads and the chosen layers (0-based) in order.

    Works on any model class of a family (masked LM, bare encoder, classifier): the copy has the teacher's class.
    Per-layer config fields follow their layers (ModernBERT's `layer_types`: student layer i keeps the attention
    type of teacher layer layers[i]).
    """
    total = num_layers(teacher.config)
    layers = alternate_layers(total) if layers is None else list(layers)
    bad = [i for i in layers if not 0 <= i < total]
    if not layers or bad or len(set(layers)) != len(layers):
        raise BiodistilError(
            f"student.layers={layers} is invalid: give distinct teacher layer indices in 0..{total - 1}"
        )
    family = family_of(teacher.config)
    config = copy.deepcopy(teacher.config)
    setattr(config, family.layers_config_key, len(layers))
    if family.layer_config is not None:
        family.layer_config(config, layers)
    student = type(teacher)._from_config(config, dtype=torch.float32)  # the teacher's attention implementation
    state = _layer_subset_state(teacher, layers)
    if family.layer_state is not None:
        family.layer_state(state, set(student.state_dict()), layers_path(teacher))
    student.load_state_dict(state, strict=True)
    return student


def _layer_subset_state(teacher: PreTrainedModel, layers: list[int]) -> dict[str, torch.Tensor]:
    """The teacher's weights in float32, with teacher layer layers[i] renamed to layer i and other layers left out."""
    prefix = layers_path(teacher)
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.(.*)$")
    position = {teacher_index: student_index for student_index, teacher_index in enumerate(layers)}
    state = {}
    for key, value in teacher.state_dict().items():
        match = pattern.match(key)
        if match is None:
            state[key] = value.float()
        elif int(match.group(1)) in position:
            state[f"{prefix}.{position[int(match.group(1))]}.{match.group(2)}"] = value.float()
    return state


def model_from_architecture(arch: ArchitectureConfig, tokenizer: Tokenizer) -> PreTrainedModel:
    """A randomly initialised masked-LM model of the given shape, sized for the tokenizer's vocabulary."""
    config = architecture_config(arch, tokenizer)
    return AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa")


def architecture_config(arch: ArchitectureConfig, tokenizer: Tokenizer) -> PretrainedConfig:
    common = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    if arch.model_type == "distilbert":
        return AutoConfig.for_model(
            "distilbert",
            dim=arch.hidden_size,
            n_layers=arch.num_layers,
            n_heads=arch.num_heads,
            hidden_dim=arch.intermediate_size,
            max_position_embeddings=arch.max_position_embeddings,
            dropout=arch.dropout,
            attention_dropout=arch.dropout,
            **common,
        )
    if arch.model_type == "modernbert":
        return _modernbert_config(arch, tokenizer)
    extra_positions = 2 if arch.model_type == "roberta" else 0  # RoBERTa offsets positions past padding
    return AutoConfig.for_model(
        arch.model_type,
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        intermediate_size=arch.intermediate_size,
        max_position_embeddings=arch.max_position_embeddings + extra_positions,
        hidden_dropout_prob=arch.dropout,
        attention_probs_dropout_prob=arch.dropout,
        type_vocab_size=1 if arch.model_type == "roberta" else 2,
        **common,
    )


def _modernbert_config(arch: ArchitectureConfig, tokenizer: Tokenizer) -> PretrainedConfig:
    """A ModernBERT of the given shape: layer i global when i % n == 0, local otherwise; `dropout` applies to the
    embeddings, attention and MLP (ModernBERT's own models train without dropout: set it to 0 for theirs);
    `intermediate_size` is the width of each half of its gated MLP; [CLS]/[SEP] are the tokenizer's."""
    return AutoConfig.for_model(
        "modernbert",
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        intermediate_size=arch.intermediate_size,
        max_position_embeddings=arch.max_position_embeddings,
        global_attn_every_n_layers=arch.global_attention_every or 3,
        local_attention=arch.local_attention or 128,
        embedding_dropout=arch.dropout,
        attention_dropout=arch.dropout,
        mlp_dropout=arch.dropout,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        cls_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        sep_token_id=tokenizer.sep_token_id,
    )


def check_same_vocabulary(
    teacher: PreTrainedModel, teacher_tokenizer: Tokenizer, student: PreTrainedModel, student_tokenizer: Tokenizer
) -> None:
    """Fail early when teacher and student would not read the same token ids the same way."""
    teacher_vocab, student_vocab = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if teacher_vocab != student_vocab:
        only_teacher = sorted(set(teacher_vocab) - set(student_vocab))[:5]
        only_student = sorted(set(student_vocab) - set(teacher_vocab))[:5]
        moved = [t for t in teacher_vocab if t in student_vocab and teacher_vocab[t] != student_vocab[t]][:5]
        raise BiodistilError(
            "Teacher and student tokenizers differ "
            f"(teacher {len(teacher_vocab)} tokens, student {len(student_vocab)}; only in teacher: {only_teacher}, "
            f"only in student: {only_student}, different ids: {moved}). Use the teacher's tokenizer for the "
            "student (student.init=teacher_layers or architecture), or a method that maps vocabularies (VE-KD)."
        )
    for name, model, tokenizer in (("teacher", teacher, teacher_tokenizer), ("student", student, student_tokenizer)):
        if model.config.vocab_size < len(tokenizer):
            raise BiodistilError(
                f"The {name}'s embedding matrix has {model.config.vocab_size} rows but its tokenizer has "
                f"{len(tokenizer)} tokens"
            )
