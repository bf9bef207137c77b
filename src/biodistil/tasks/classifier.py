"""A classifier for a task: a freshly initialised task head on a pretrained encoder, built from the task's labels.

Used wherever a task model is made from an encoder: fine-tuning, the kd student, a teacher loaded for its outputs.
"""

from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, PreTrainedModel
from transformers.utils import logging as transformers_logging

from biodistil.errors import BiodistilError
from biodistil.models.loading import check_weights_there
from biodistil.tasks.registry import TaskSpec


def build_classifier(model_dir: str | Path, task: TaskSpec) -> PreTrainedModel:
    """A task head on an encoder (the MLM head, if any, is dropped; the new head is freshly initialised)."""
    factory = AutoModelForTokenClassification if task.kind == "token_classification" else (
        AutoModelForSequenceClassification)
    kwargs: dict[str, Any] = {"num_labels": task.num_labels, "id2label": task.id_to_label,
                              "label2id": task.label_to_id}
    if task.kind == "multilabel_classification":
        kwargs["problem_type"] = "multi_label_classification"
    if Path(model_dir).is_dir():
        check_weights_there(Path(model_dir))
    quiet = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # the "MLM head unused, new head initialised" report is expected
    try:
        return factory.from_pretrained(str(model_dir), **kwargs)
    except (OSError, SafetensorError) as err:
        raise BiodistilError(f"Could not load an encoder from {model_dir}: {err}") from None
    finally:
        transformers_logging.set_verbosity(quiet)
