"""Who the teacher is — the one key rule of every teacher-output entry — and loading a teacher.

`teacher_fingerprint` hashes what the teacher *is*: the content of its config (not where it was loaded from, so one
teacher spelled `models/t`, `../models/t` or absolute is one teacher), the bytes of its weight files and of its
tokenizer files, read from its folder or, for a Hub id, from the Hub cache's snapshot of the revision the id
resolves to now. A teacher updated on the Hub, or retrained into the same folder, gets new entries; never a name.
"""

import hashlib
import json
from pathlib import Path

from torch import nn
from transformers import AutoConfig, PreTrainedModel

from biodistil.errors import BiodistilError
from biodistil.models.loading import model_folder
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.registry import TaskSpec

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "merges.txt", "vocab.json",
                   "special_tokens_map.json")
_LOCATION_KEYS = ("_name_or_path", "transformers_version")  # say where and with what it was saved, not what it is
_ARCHITECTURE = {"token_classification": "ForTokenClassification",
                 "sequence_classification": "ForSequenceClassification",
                 "multilabel_classification": "ForSequenceClassification"}


def teacher_fingerprint(name_or_path: str | Path) -> str:
    """sha256 of a teacher's config content, weight files and tokenizer files (see the module docstring)."""
    folder = model_folder(str(name_or_path))
    digest = hashlib.sha256(b"teacher-v1")
    digest.update(json.dumps(_config_content(folder), sort_keys=True).encode())
    weights = sorted({*folder.glob("*.safetensors"), *folder.glob("*.bin")})
    for path in [*weights, *(folder / name for name in TOKENIZER_FILES)]:
        if path.is_file():
            digest.update(path.name.encode())
            with path.open("rb") as handle:
                for chunk in iter(lambda h=handle: h.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def _config_content(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BiodistilError(f"Teacher {folder}: cannot read its config.json ({err})") from None
    return {key: value for key, value in config.items() if key not in _LOCATION_KEYS}


def load_teacher_classifier(name_or_path: str | Path, task: TaskSpec) -> PreTrainedModel:
    """A teacher fine-tuned on `task`, in eval mode: its config must name a classification head with the task's
    labels."""
    try:
        config = AutoConfig.from_pretrained(str(name_or_path))
    except OSError as err:
        raise BiodistilError(f"Teacher {name_or_path}: cannot read its config ({err})") from None
    heads = [name for name in (config.architectures or []) if name.endswith(_ARCHITECTURE[task.kind])]
    labels = [config.id2label[i] for i in sorted(config.id2label)] if config.id2label else []
    if not heads or labels != task.labels:
        raise BiodistilError(
            f"Teacher {name_or_path} is not fine-tuned on task {task.name}: its config has architectures "
            f"{config.architectures} and labels {labels}; expected a *{_ARCHITECTURE[task.kind]} model with labels "
            f"{task.labels}. Fine-tune it first with `biodistil finetune`."
        )
    model = build_classifier(name_or_path, task)
    model.eval()
    return model


def freeze(model: nn.Module) -> None:
    """Eval mode and no gradients, for a teacher."""
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
