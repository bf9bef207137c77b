"""What differs between encoder families: where the layers live, how the MLM head is applied, and where each
layer's query/key/value projections are (for attention losses under fast attention kernels).

Supporting a new family means adding one `Family` entry here.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from biodistil.errors import BiodistilError


@dataclass(frozen=True)
class Family:
    """Attribute paths of one masked-LM family (as in its `...ForMaskedLM` class)."""

    encoder_attr: str  # the bare encoder inside the masked-LM model
    layers_path: str  # the ModuleList of transformer layers, relative to the masked-LM model
    layers_config_key: str  # config field holding the number of layers
    head: Callable[[PreTrainedModel, torch.Tensor], torch.Tensor]  # hidden states -> vocabulary logits
    # query, key and value nn.Linear modules, relative to one transformer layer
    qkv_paths: tuple[str, str, str] = ("attention.self.query", "attention.self.key", "attention.self.value")
    heads_config_key: str = "num_attention_heads"  # config field holding the number of attention heads


def _distilbert_head(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    hidden = model.activation(model.vocab_transform(hidden))
    return model.vocab_projector(model.vocab_layer_norm(hidden))


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "bert.encoder.layer", "num_hidden_layers", lambda m, h: m.cls(h)),
    "roberta": Family("roberta", "roberta.encoder.layer", "num_hidden_layers", lambda m, h: m.lm_head(h)),
    "xlm-roberta": Family("roberta", "roberta.encoder.layer", "num_hidden_layers", lambda m, h: m.lm_head(h)),
    "distilbert": Family(
        "distilbert", "distilbert.transformer.layer", "n_layers", _distilbert_head,
        qkv_paths=("attention.q_lin", "attention.k_lin", "attention.v_lin"), heads_config_key="n_heads",
    ),
    "mobilebert": Family("mobilebert", "mobilebert.encoder.layer", "num_hidden_layers", lambda m, h: m.cls(h)),
}


def family_of(config: PretrainedConfig) -> Family:
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise BiodistilError(
            f"Model type '{config.model_type}' is not supported yet; supported: {', '.join(sorted(FAMILIES))}"
        )
    return family


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


def qkv_modules(model: PreTrainedModel, layer: int) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """The query, key and value projections of transformer layer `layer` (1-based, as in hidden_states)."""
    block: nn.Module = layer_list(model)[layer - 1]
    found = []
    for path in family_of(model.config).qkv_paths:
        module = block
        for name in path.split("."):
            module = getattr(module, name)
        found.append(module)
    return found[0], found[1], found[2]


def hidden_size(config: PretrainedConfig) -> int:
    return int(getattr(config, "hidden_size", None) or config.dim)


def encoder_of(model: PreTrainedModel) -> nn.Module:
    return getattr(model, family_of(model.config).encoder_attr)


def mlm_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """Apply the model's MLM head to hidden states of any leading shape ([N, D] rows or [B, L, D])."""
    return family_of(model.config).head(model, hidden)
