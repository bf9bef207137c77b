"""Loading a teacher: a fine-tuned classifier checked against its task, and freezing a teacher that only serves."""

from pathlib import Path

from torch import nn
from transformers import AutoConfig, PreTrainedModel

from biodistil.errors import BiodistilError
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.registry import TaskSpec

_ARCHITECTURE = {"token_classification": "ForTokenClassification",
                 "sequence_classification": "ForSequenceClassification",
                 "multilabel_classification": "ForSequenceClassification"}


def load_teacher_classifier(name_or_path: str | Path, task: TaskSpec) -> PreTrainedModel:
    """A teacher fine-tuned on `task`, in eval mode: its config must name a classification head with the task's
    labels (`check_teacher_for_task`)."""
    check_teacher_for_task(name_or_path, task)
    model = build_classifier(name_or_path, task)
    model.eval()
    return model


def check_teacher_for_task(name_or_path: str | Path, task: TaskSpec) -> None:
    """Refuse a teacher whose config names no classification head of the task's kind, or other labels."""
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


def freeze(model: nn.Module) -> None:
    """Eval mode and no gradients, for a teacher."""
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
