"""Reading a task's split, whole or as a seeded subset.

A subset is drawn once per key (task, split and fold; or a transfer source) and kept in file order: task files
are often sorted by label, so their first lines would not be a fair sample, and the same key gives the same
subset to every model, seed and run.
"""

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from biodistil.data.formats import Example
from biodistil.tasks.registry import TaskSpec

Item = TypeVar("Item")


def seeded_subset(items: Sequence[Item], limit: int | None, key: str) -> list[Item]:
    """`limit` items drawn at random with a generator seeded by `key`, in their original order (all of them when
    `limit` is None or not smaller than their number)."""
    if limit is None or limit >= len(items):
        return list(items)
    keep = sorted(random.Random(key).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def read_split(
    task: TaskSpec, split: str, data_root: str | Path | None, fold: int | None = None, limit: int | None = None
) -> list[Example]:
    """A split, or its seeded subset of `limit` examples (the same for every model and seed); [] when the task
    has no such split."""
    if split not in task.files:
        return []
    examples = task.load_split(split, data_root, fold)
    return seeded_subset(examples, limit, f"{task.name}/{split}/{fold}")
