"""Loading models and tokenizers from a local folder, a Hugging Face Hub id or an embedded model name, with
clear offline errors.

Encoder-only checkpoints (no MLM head: sentence encoders, many clinical models) load as masked LMs too; the
head weights the checkpoint lacks are freshly initialised, and `untrained_head_weights(model)` lists them so
that a method whose terms read the teacher's vocabulary logits can refuse such a teacher before any work.
"""

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as transformers_logging

from biodistil.embedded import resolve_model_name
from biodistil.errors import BiodistilError
from biodistil.models.families import family_of
from biodistil.paths import looks_like_path

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
        dtype=DTYPES[dtype],  # attention: transformers' default, SDPA where the family has it (MPNet: eager)
        trust_remote_code=trust_remote_code,
        output_loading_info=True,
    )
    encoder = f"{family_of(model.config).encoder_attr}."
    setattr(model, _UNTRAINED_HEAD, sorted(k for k in info["missing_keys"] if not k.startswith(encoder)))
    return model


def load_encoder(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedModel:
    """The bare encoder of a checkpoint (any head it has is dropped), with SDPA attention where its family has it."""
    return _from_pretrained(AutoModel, name_or_path, trust_remote_code=trust_remote_code)


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


def check_model(name_or_path: str, what: str = "model", trust_remote_code: bool = False) -> None:
    """Fail at once, with a message that names `what` (e.g. "model.name_or_path"), when a model cannot be loaded:
    a folder that does not exist or lacks config.json, tokenizer or weights, weights that are corrupt or
    truncated, or a Hub id that can be neither downloaded nor found in the Hub's cache."""
    try:
        config = _from_pretrained(AutoConfig, name_or_path, trust_remote_code=trust_remote_code)
        tokenizer = _from_pretrained(AutoTokenizer, name_or_path, trust_remote_code=trust_remote_code)
    except BiodistilError as err:
        raise BiodistilError(f"{what}: {err}") from None
    check_tokenizer_fits(tokenizer, config, f"{what} ({resolve_model_name(name_or_path)})")
    local = Path(resolve_model_name(name_or_path)).expanduser()
    if not local.is_dir():
        return
    weights = sorted(local.glob("*.safetensors"))
    if weights_left_out(local):  # a carried study's teacher: its outputs are in the study's store, else loading says
        return
    if not weights and not any(local.glob("*.bin")):
        raise BiodistilError(f"{what}: model folder {local} holds no weights (model.safetensors); export or "
                             "download the model again")
    for path in weights:
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as err:
            raise BiodistilError(f"{what}: the weights file {path} is corrupt or truncated ({_first_line(err)}); "
                                 "export or download the model again") from None


def check_tokenizer_fits(tokenizer: Any, config: Any, where: str) -> None:
    """The tokenizer must fit the model: no token id beyond the embedding's rows, and ordinary tokens besides the
    special ones (MLM masking draws its random replacements from them)."""
    rows = getattr(config, "vocab_size", None)
    size = len(tokenizer)
    if rows is not None and size > rows:
        raise BiodistilError(f"{where}: the tokenizer has {size:,} tokens but the model's embedding only {rows:,} "
                             "rows, so some token ids have no embedding; is the tokenizer the model's own? Save the "
                             "model's tokenizer into its folder (or resize the embeddings before saving)")
    special = len(set(tokenizer.all_special_ids))
    if size <= special + 1:
        raise BiodistilError(f"{where}: the tokenizer has {size} tokens, {special} of them special, beside a model of "
                             f"{rows} embedding rows; is it the model's own tokenizer? Save the tokenizer the model "
                             "was trained with into its folder")


LEFT_OUT_WEIGHTS = "weights-left-out.json"  # a model folder's fingerprint where its weights were not packed


class WeightsLeftOut(BiodistilError):
    """A model folder that holds the records of a model packed without its weights (`kd.study_records`)."""

    def __init__(self, folder: Path):
        self.folder = folder
        super().__init__(
            f"Model folder {folder} holds only the records of a model packed without its weights ({LEFT_OUT_WEIGHTS}: "
            "a study carried to this machine by `biodistil pack-study`); `biodistil study --from-records` fine-tunes "
            "again a teacher whose outputs a remaining run cannot find in the study's store, and any other model of "
            "the study must be trained again to be loaded")

# files of which a saved tokenizer has at least one
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model")


def _from_pretrained(factory: Any, name_or_path: str, **kwargs: Any) -> Any:
    name_or_path = resolve_model_name(name_or_path)
    local = Path(name_or_path).expanduser()
    if local.exists() and not local.is_dir():
        raise BiodistilError(f"'{name_or_path}' is a file; give the model folder (with config.json) or a Hub id")
    if not local.exists() and looks_like_path(name_or_path):
        raise BiodistilError(
            f"Model folder {local} does not exist (a Hub id has the form 'name' or 'org/name'); check the path, "
            "e.g. the model/ folder of a finished run")
    if local.is_dir():
        check_model_folder(local, tokenizer=factory is AutoTokenizer)
        if factory not in (AutoConfig, AutoTokenizer):
            check_weights_there(local)
    elif not hub_reachable():
        kwargs["local_files_only"] = True  # the Hub's local cache only: no download retries
    source = str(local) if local.is_dir() else name_or_path
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # missing head weights are reported by biodistil, not a load table
    try:
        return factory.from_pretrained(source, **kwargs)
    except SafetensorError as err:
        raise BiodistilError(
            f"The weights of {source} are corrupt or truncated ({_first_line(err)}); export or download the model "
            "again") from None
    except OSError as err:
        if local.is_dir():
            raise BiodistilError(f"Could not load {factory.__name__} from folder {local}: {err}") from None
        why = ("the Hugging Face Hub cannot be reached from this machine and its cache does not hold it"
               if kwargs.get("local_files_only") else f"the Hugging Face Hub did not provide it ({_first_line(err)})")
        where = f"no folder {local.absolute()}" + ("" if local.is_absolute() else
                                                    f" (a relative path is read from the working folder {Path.cwd()})")
        raise BiodistilError(
            f"Could not load '{name_or_path}': there is {where}, and as a Hub id {why}. If you meant a local folder, "
            "correct the path (or run from the folder it is relative to); if it is a Hub model and this machine is "
            f"offline, download it on a connected machine (`hf download {name_or_path} --local-dir DIR`) and pass "
            "DIR instead."
        ) from None
    finally:
        transformers_logging.set_verbosity(verbosity)


def check_model_folder(folder: Path, tokenizer: bool = False) -> None:
    """A Hugging Face model folder: config.json, weights, and (`tokenizer`) the tokenizer's files."""
    if tokenizer:
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise BiodistilError(
                f"Model folder {folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:3])}, ...); save "
                "the tokenizer of the model it came from into it (tokenizer.save_pretrained)")
        return
    if not (folder / "config.json").is_file():
        raise BiodistilError(f"Model folder {folder} has no config.json; is it a Hugging Face model folder?")


def weights_left_out(folder: Path) -> bool:
    """Whether `folder` holds the records of a model packed without its weights (`LEFT_OUT_WEIGHTS`)."""
    return (folder / LEFT_OUT_WEIGHTS).is_file() and not any(folder.glob("*.safetensors"))


def check_weights_there(folder: Path) -> None:
    """Refuse to load the weights of a model folder packed without them (`WeightsLeftOut`)."""
    if weights_left_out(folder):
        raise WeightsLeftOut(folder)


MODEL_FILE_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model")  # config, weights, tokenizer (no pickles)


def model_folder(name_or_path: str) -> Path:
    """The folder a model is loaded from: a local folder as it is, or for a Hub id the Hugging Face cache's snapshot
    of its current revision (fetched or updated first when the Hub can be reached), so that a fingerprint of the
    folder's files fingerprints what the model *is*, never its name."""
    local = Path(resolve_model_name(name_or_path)).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    offline = not hub_reachable()
    try:
        return Path(snapshot_download(str(name_or_path), allow_patterns=list(MODEL_FILE_PATTERNS),
                                      local_files_only=offline))
    except Exception as err:  # huggingface_hub raises several types for "not there"
        where = "the Hub cannot be reached and its cache does not hold it" if offline else _first_line(err)
        raise BiodistilError(f"Could not find the files of '{name_or_path}' ({where}); download the model "
                             f"(`hf download {name_or_path} --local-dir DIR`) and pass DIR instead") from None


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub can be reached (False at once under HF_HUB_OFFLINE): one connection attempt,
    instead of the many retries, each printed, of a download on a machine without network."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
