"""Loading models and tokenizers from a local folder, a Hugging Face Hub id or an embedded model name, with
clear offline errors.

Encoder-only checkpoints (no MLM head: sentence encoders, many clinical models) load as masked LMs too; the
head weights the checkpoint lacks are freshly initialised, and `untrained_head_weights(model)` lists them so
that a method whose terms read the teacher's vocabulary logits can refuse such a teacher before any work.
"""

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from biodistil.errors import BiodistilError
from biodistil.models.embedded import resolve_model_name
from biodistil.models.families import family_of

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_UNTRAINED_HEAD = "_biodistil_untrained_head"


def load_masked_lm(
    name_or_path: str, dtype: str = "float32", trust_remote_code: bool = False
) -> PreTrainedModel:
    """A masked-LM model from a folder or Hub id, with SDPA attention where the family has it.

    The MLM-head weights missing from the checkpoint are remembered on the model (`untrained_head_weights`).
    """
    model, info = _from_pretrained(
        AutoModelForMaskedLM,
        name_or_path,
        dtype=DTYPES[dtype],
        attn_implementation="sdpa",
        trust_remote_code=trust_remote_code,
        output_loading_info=True,
    )
    encoder = f"{family_of(model.config).encoder_attr}."
    setattr(model, _UNTRAINED_HEAD, sorted(k for k in info["missing_keys"] if not k.startswith(encoder)))
    return model


def load_encoder(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedModel:
    """The bare encoder of a checkpoint (any head it has is dropped), with SDPA attention."""
    return _from_pretrained(AutoModel, name_or_path, attn_implementation="sdpa", trust_remote_code=trust_remote_code)


def untrained_head_weights(model: PreTrainedModel) -> list[str]:
    """The MLM-head weights that `load_masked_lm` initialised freshly (empty: the head was trained)."""
    return list(getattr(model, _UNTRAINED_HEAD, []))


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    tokenizer = _from_pretrained(AutoTokenizer, name_or_path, trust_remote_code=trust_remote_code)
    if not tokenizer.is_fast:
        raise BiodistilError(
            f"The tokenizer of '{name_or_path}' has no fast (Rust) version; biodistil needs one for "
            "word alignment and speed. Convert it with transformers' convert_slow_tokenizer."
        )
    return tokenizer


def _from_pretrained(factory: Any, name_or_path: str, **kwargs: Any) -> Any:
    name_or_path = resolve_model_name(name_or_path)
    local = Path(name_or_path).expanduser()
    if local.exists() and not local.is_dir():
        raise BiodistilError(f"'{name_or_path}' is a file; give the model folder (with config.json) or a Hub id")
    if local.is_dir() and not (local / "config.json").is_file() and factory is not AutoTokenizer:
        raise BiodistilError(f"Model folder {local} has no config.json; is it a Hugging Face model folder?")
    source = str(local) if local.is_dir() else name_or_path
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # missing head weights are reported by biodistil, not a load table
    try:
        return factory.from_pretrained(source, **kwargs)
    except OSError as err:
        if local.is_dir():
            raise BiodistilError(f"Could not load {factory.__name__} from folder {local}: {err}") from None
        raise BiodistilError(
            f"Could not load '{name_or_path}': it is not a local folder, and the Hugging Face Hub did not "
            f"provide it ({_first_line(err)}). If this machine is offline, download the model on a "
            f"connected machine (`hf download {name_or_path} --local-dir DIR`) and pass DIR instead."
        ) from None
    finally:
        transformers_logging.set_verbosity(verbosity)


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
