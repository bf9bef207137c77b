"""Loading a teacher: a fine-tuned classifier checked against its task, freezing a teacher that only serves, and the
pre-flight table of several teachers (what each contributes to each term)."""

from pathlib import Path
from typing import Any

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


def render_teacher_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """The pre-flight table as text (or a Markdown table, for a report): teacher × term (rows: teacher, weight, tokens
    and per term what it gives)."""
    names = list(rows[0]["terms"]) if rows else []
    cells = [["teacher", "λ", "tokens", *names]]
    cells += [[row["teacher"], f"{row['weight']:.2f}", row["tokens"], *(row["terms"][name] for name in names)]
              for row in rows]
    if not markdown:
        return "\n".join(["Teachers (pre-flight):", *(" | ".join(line) for line in cells)])
    header, *body = (f"| {' | '.join(line)} |" for line in cells)
    return "\n".join(["Teachers (pre-flight):", "", header, "|" + "---|" * len(cells[0]), *body])
