"""What differs between encoder families: where the layers live, how the MLM head is applied, how each layer's
queries, keys and values are read (for attention losses under fast attention kernels), how far each layer's
attention reaches, and what a student made of some of the layers must change in its config.

Supporting a new family means adding one `Family` entry here.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.activations import gelu

from biodistil.errors import BiodistilError
from biodistil.models.logits import LinearRows
from biodistil.models.qkv import FusedRotaryProjection, QKVReader, SeparateProjections

BERT_QKV = SeparateProjections()  # attention.self.query|key|value
LayerConfig = Callable[[PretrainedConfig, list[int]], None]  # student config from the chosen teacher layers (0-based)
LayerState = Callable[[dict[str, torch.Tensor], set[str], str], None]  # (state, student keys, layers path)


def _global(config: PretrainedConfig, layer: int) -> int | None:
    return None


@dataclass(frozen=True)
class Family:
    """Attribute paths and per-family behaviour of one masked-LM family (as in its `...ForMaskedLM` class)."""

    encoder_attr: str  # the bare encoder inside the masked-LM model
    layers_path: str  # the ModuleList of transformer layers, relative to the masked-LM model
    layers_config_key: str  # config field holding the number of layers
    head: Callable[[PreTrainedModel, torch.Tensor], LinearRows]  # hidden states -> the MLM decoder's input rows
    qkv: QKVReader = BERT_QKV  # per-head Q, K, V of one layer from hooks
    heads_config_key: str = "num_attention_heads"  # config field holding the number of attention heads
    # w such that query i of transformer layer l (1-based) sees keys j with |i − j| ≤ w; None: every key
    window: Callable[[PretrainedConfig, int], int | None] = _global
    layer_config: LayerConfig | None = None  # per-layer config fields a layer subset must carry over
    layer_state: LayerState | None = None  # fixes to copied layer weights that depend on the layer's position
    takes_token_type_ids: bool = True
    # the module (path relative to the masked-LM model) whose output [L_q, L_k, H] is a bias every layer adds to its
    # attention scores (MPNet's relative-position bias); None: scores are Q·Kᵀ/√d alone
    score_bias: str | None = None
    # positions the position embeddings hold beyond the longest input: RoBERTa and MPNet number positions after the
    # padding index, so a table of n positions takes inputs of n − 2 tokens
    reserved_positions: int = 0


def _bert_head(model: PreTrainedModel, hidden: torch.Tensor) -> LinearRows:
    head = model.cls.predictions
    return LinearRows(head.transform(hidden), head.decoder.weight, head.decoder.bias)


def _roberta_head(model: PreTrainedModel, hidden: torch.Tensor) -> LinearRows:
    head = model.lm_head
    return LinearRows(head.layer_norm(gelu(head.dense(hidden))), head.decoder.weight, head.decoder.bias)


def _distilbert_head(model: PreTrainedModel, hidden: torch.Tensor) -> LinearRows:
    hidden = model.vocab_layer_norm(model.activation(model.vocab_transform(hidden)))
    return LinearRows(hidden, model.vocab_projector.weight, model.vocab_projector.bias)


def _mobilebert_head(model: PreTrainedModel, hidden: torch.Tensor) -> LinearRows:
    """MobileBERT's decoder is the tied embeddings [V, E] widened by an extra [hidden − E, V] matrix."""
    head = model.cls.predictions
    weight = torch.cat([head.decoder.weight.t(), head.dense.weight], dim=0).t()
    return LinearRows(head.transform(hidden), weight, head.decoder.bias)


def _modernbert_head(model: PreTrainedModel, hidden: torch.Tensor) -> LinearRows:
    return LinearRows(model.head(hidden), model.decoder.weight, model.decoder.bias)


def _modernbert_window(config: PretrainedConfig, layer: int) -> int | None:
    """A sliding-attention layer lets query i see keys j with |i − j| ≤ local_attention // 2 (transformers'
    bidirectional sliding-window mask); a full-attention layer sees every key."""
    if config.layer_types[layer - 1] == "sliding_attention":
        return int(config.local_attention) // 2
    return None


def global_period(layer_types: list[str]) -> int | None:
    """The smallest n with layer i global exactly when i % n == 0 (ModernBERT's `global_attn_every_n_layers`),
    or None when the pattern has no such period."""
    for period in range(1, len(layer_types) + 1):
        if all((kind == "full_attention") == (i % period == 0) for i, kind in enumerate(layer_types)):
            return period
    return None


def _modernbert_layer_config(config: PretrainedConfig, layers: list[int]) -> None:
    """Student layer i keeps the attention type (and so the window and rotary base) of teacher layer layers[i]:
    `layer_types` is copied per layer; `global_attn_every_n_layers` is set to the student's own period, or removed
    when its pattern has none (transformers reads `layer_types`; the period is only what the pattern is built from)."""
    config.layer_types = [config.layer_types[i] for i in layers]
    period = global_period(config.layer_types)
    if period is not None:
        config.global_attn_every_n_layers = period
    elif hasattr(config, "global_attn_every_n_layers"):
        del config.global_attn_every_n_layers


def _modernbert_layer_state(state: dict[str, torch.Tensor], student_keys: set[str], layers: str) -> None:
    """ModernBERT's first layer has no pre-attention norm: the embedding norm precedes it. A teacher layer copied to
    student position 0 leaves its `attn_norm` behind; teacher layer 0 copied to a later position gets, as its
    `attn_norm`, the embedding norm it was trained behind."""
    embedding_norm = f"{layers.removesuffix('layers')}embeddings.norm"
    for key in [k for k in state if k not in student_keys and ".attn_norm." in k]:
        del state[key]
    for key in sorted(student_keys - state.keys()):
        if ".attn_norm." in key:
            state[key] = state[f"{embedding_norm}.{key.rsplit('.', 1)[1]}"]


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "bert.encoder.layer", "num_hidden_layers", _bert_head),
    "roberta": Family("roberta", "roberta.encoder.layer", "num_hidden_layers", _roberta_head, reserved_positions=2),
    "xlm-roberta": Family("roberta", "roberta.encoder.layer", "num_hidden_layers", _roberta_head,
                          reserved_positions=2),
    "distilbert": Family(
        "distilbert", "distilbert.transformer.layer", "n_layers", _distilbert_head,
        qkv=SeparateProjections(("attention.q_lin", "attention.k_lin", "attention.v_lin")), heads_config_key="n_heads",
        takes_token_type_ids=False,
    ),
    "mobilebert": Family("mobilebert", "mobilebert.encoder.layer", "num_hidden_layers", _mobilebert_head),
    "mpnet": Family(  # its LM head is RoBERTa's; its attention adds a relative-position bias shared by every layer
        "mpnet", "mpnet.encoder.layer", "num_hidden_layers", _roberta_head,
        qkv=SeparateProjections(("attention.attn.q", "attention.attn.k", "attention.attn.v")),
        takes_token_type_ids=False, score_bias="mpnet.encoder.relative_attention_bias", reserved_positions=2,
    ),
    "modernbert": Family(
        "model", "model.layers", "num_hidden_layers", _modernbert_head, qkv=FusedRotaryProjection(),
        window=_modernbert_window, layer_config=_modernbert_layer_config, layer_state=_modernbert_layer_state,
        takes_token_type_ids=False,
    ),
}


def position_limit(config: PretrainedConfig, default: int = 512) -> int:
    """Longest input (in tokens, special ones included) the model's position embeddings allow; `default` where the
    config records no table. Families that number positions after the padding index reserve two (RoBERTa, MPNet)."""
    family = FAMILIES.get(config.model_type)
    reserved = family.reserved_positions if family else 0
    return int(getattr(config, "max_position_embeddings", None) or default) - reserved


def family_of(config: PretrainedConfig) -> Family:
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise BiodistilError(
            f"Model type '{config.model_type}' is not supported yet; supported: {', '.join(sorted(FAMILIES))}"
        )
    return family


def score_bias_module(model: PreTrainedModel) -> nn.Module | None:
    """The module whose output is the bias every layer adds to its attention scores (`Family.score_bias`)."""
    family = family_of(model.config)
    if family.score_bias is None:
        return None
    path = family.score_bias if hasattr(model, family.encoder_attr) else \
        family.score_bias.removeprefix(f"{family.encoder_attr}.")
    module: nn.Module = model
    for part in path.split("."):
        module = getattr(module, part)
    return module


def layers_path(model: PreTrainedModel) -> str:
    """Where the transformer layers are inside `model`: a masked LM or classifier holds the bare encoder under
    `encoder_attr` (bert.encoder.layer); a bare encoder holds them directly (encoder.layer)."""
    family = family_of(model.config)
    if hasattr(model, family.encoder_attr):
        return family.layers_path
    return family.layers_path.removeprefix(f"{family.encoder_attr}.")


def layer_list(model: PreTrainedModel) -> nn.ModuleList:
    module: nn.Module = model
    for name in layers_path(model).split("."):
        module = getattr(module, name)
    return module  # type: ignore[return-value]


def num_layers(config: PretrainedConfig) -> int:
    return int(getattr(config, family_of(config).layers_config_key))


def num_heads(config: PretrainedConfig) -> int:
    return int(getattr(config, family_of(config).heads_config_key))


def qkv_modules(model: PreTrainedModel, layer: int) -> tuple[nn.Module, ...]:
    """The modules whose hooks read Q/K/V of transformer layer `layer` (1-based, as in hidden_states)."""
    return family_of(model.config).qkv.modules(layer_list(model)[layer - 1])


def qkv_widths(model: PreTrainedModel, layer: int) -> tuple[int, int, int]:
    """The widths H·d of the queries, keys and values of transformer layer `layer` (1-based)."""
    return family_of(model.config).qkv.widths(layer_list(model)[layer - 1])


def attention_window(config: PretrainedConfig, layer: int) -> int | None:
    """w when query i of transformer layer `layer` (1-based) sees only keys j with |i − j| ≤ w; None: every key."""
    return family_of(config).window(config, layer)


def takes_token_type_ids(config: PretrainedConfig) -> bool:
    return family_of(config).takes_token_type_ids


def hidden_size(config: PretrainedConfig) -> int:
    return int(getattr(config, "hidden_size", None) or config.dim)


def encoder_of(model: PreTrainedModel) -> nn.Module:
    return getattr(model, family_of(model.config).encoder_attr)


def mlm_head(model: PreTrainedModel, hidden: torch.Tensor) -> LinearRows:
    """The model's MLM head up to its decoder, on hidden states of any leading shape ([N, D] rows or [B, L, D]):
    the decoder's input rows and its weight and bias, whose product gives the vocabulary logits."""
    return family_of(model.config).head(model, hidden)


def mlm_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The model's MLM head on hidden states of any leading shape: vocabulary logits."""
    return mlm_head(model, hidden).logits()


def head_only(model: PreTrainedModel) -> PreTrainedModel:
    """The masked LM with every parameter its MLM head does not read moved to the meta device (no memory): what is
    left forms logits from last hidden states (`mlm_logits`) and nothing else. The head's parameters are found by
    back-propagating through it once (tied embeddings stay: they are the decoder)."""
    params = list(model.parameters())
    trainable = [param.requires_grad for param in params]
    probe = torch.zeros(1, hidden_size(model.config), dtype=params[0].dtype, device=params[0].device)
    with torch.enable_grad():
        for param in params:
            param.requires_grad_(True)
            param.grad = None
        mlm_logits(model, probe).float().sum().backward()
    used = {id(param) for param in params if param.grad is not None}
    for param, flag in zip(params, trainable, strict=True):
        param.grad = None
        param.requires_grad_(flag)
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in used:
                setattr(module, name, nn.Parameter(param.to("meta"), requires_grad=False))
    return model
