"""The `task:` section of the task-side recipes (finetune, transfer, kd): which task, where its data is, and the
settings that override the registry's, with the two helpers every command uses to apply it."""

from pydantic import Field

from biodistil.config import LocalPath, Section, TaskRef
from biodistil.data.formats import Example
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.splits import read_split


class TaskConfig(Section):
    """The task of the task registry (`tasks/builtin_tasks.yaml`, or a task YAML file) and its data."""

    name: TaskRef = Field(min_length=1, description="built-in task name or path of a task YAML file")
    data_dir: LocalPath | None = Field(None, description="data folder; default $BIODISTIL_DATA, else ../shared/data")
    fold: int | None = Field(None, ge=1, description="cross-validation tasks: the fold (1..cv_folds)")
    max_length: int | None = Field(None, ge=8, description="override the task's max_length (sub-words)")
    max_examples: int | None = Field(None, ge=1, description="use N examples of each split (a fixed random subset "
                                                               "in file order, the same as fine-tuning's)")
    train_examples: int | None = Field(None, ge=1, description="a labelled budget: train on a seeded subset of N "
                                       "training examples (the subset transfer.labelled keeps the labels of); dev "
                                       "and test stay whole (or max_examples)")

    def split_limit(self, split: str) -> int | None:
        """The examples kept of `split`: the labelled budget for train when set, else max_examples."""
        return self.train_examples if split == "train" and self.train_examples is not None else self.max_examples


def task_spec(cfg: TaskConfig) -> TaskSpec:
    """The registry task of a recipe, with its max_length override."""
    task = get_task(cfg.name)
    return task.model_copy(update={"max_length": cfg.max_length}) if cfg.max_length else task


def load_task_split(task: TaskSpec, cfg: TaskConfig, split: str) -> list[Example]:
    """A split of the task, capped at `max_examples` with the same seeded subset fine-tuning uses; [] when the
    task has no such split."""
    return read_split(task, split, cfg.data_dir, cfg.fold, cfg.split_limit(split))
