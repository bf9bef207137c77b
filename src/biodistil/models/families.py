"""What differs between encoder families: where the layers live and how the MLM head is applied.

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


def _distilbert_head(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    hidden = model.activation(model.vocab_transform(hidden))
    return model.vocab_projector(model.vocab_layer_norm(hidden))


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "bert.encoder.layer", "num_hidden_layers", lambda m, h: m.cls(h)),
    "roberta": Family("roberta", "roberta.encoder.layer", "num_hidden_layers", lambda m, h: m.lm_head(h)),
    "xlm-roberta": Family("roberta", "roberta.encoder.layer", "num_hidden_layers", lambda m, h: m.lm_head(h)),
    "distilbert": Family("distilbert", "distilbert.transformer.layer", "n_layers", _distilbert_head),
}


def family_of(config: PretrainedConfig) -> Family:
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise BiodistilError(
            f"Model type '{config.model_type}' is not supported yet; supported: {', '.join(sorted(FAMILIES))}"
        )
    return family


def layer_list(model: PreTrainedModel) -> nn.ModuleList:
    module: nn.Module = model
    for name in family_of(model.config).layers_path.split("."):
        module = getattr(module, name)
    return module  # type: ignore[return-value]


def num_layers(config: PretrainedConfig) -> int:
    return int(getattr(config, family_of(config).layers_config_key))


def hidden_size(config: PretrainedConfig) -> int:
    return int(getattr(config, "hidden_size", None) or config.dim)


def encoder_of(model: PreTrainedModel) -> nn.Module:
    return getattr(model, family_of(model.config).encoder_attr)


def mlm_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """Apply the model's MLM head to hidden states of any leading shape ([N, D] rows or [B, L, D])."""
    return family_of(model.config).head(model, hidden)
