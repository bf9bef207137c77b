"""Loading models and tokenizers from a local folder or a Hugging Face Hub id, with clear offline errors."""

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from biodistil.errors import BiodistilError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_masked_lm(
    name_or_path: str, dtype: str = "float32", trust_remote_code: bool = False
) -> PreTrainedModel:
    """A masked-LM model from a folder or Hub id, with SDPA attention where the family has it."""
    return _from_pretrained(
        AutoModelForMaskedLM,
        name_or_path,
        dtype=DTYPES[dtype],
        attn_implementation="sdpa",
        trust_remote_code=trust_remote_code,
    )


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    tokenizer = _from_pretrained(AutoTokenizer, name_or_path, trust_remote_code=trust_remote_code)
    if not tokenizer.is_fast:
        raise BiodistilError(
            f"The tokenizer of '{name_or_path}' has no fast (Rust) version; biodistil needs one for "
            "word alignment and speed. Convert it with transformers' convert_slow_tokenizer."
        )
    return tokenizer


def _from_pretrained(factory: Any, name_or_path: str, **kwargs: Any) -> Any:
    local = Path(name_or_path).expanduser()
    if local.exists() and not local.is_dir():
        raise BiodistilError(f"'{name_or_path}' is a file; give the model folder (with config.json) or a Hub id")
    if local.is_dir() and not (local / "config.json").is_file() and factory is AutoModelForMaskedLM:
        raise BiodistilError(f"Model folder {local} has no config.json; is it a Hugging Face model folder?")
    source = str(local) if local.is_dir() else name_or_path
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


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
