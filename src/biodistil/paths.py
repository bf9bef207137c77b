"""Paths, decided once: what a user gives is made absolute when a recipe is read (against the working folder), and
what a run writes down for its own later use is relative to the run folder, so that the folder can move.

* `absolute`: a file, folder or glob the user gave (`--out runs/demo`, `data.train: [corpus/*.txt]`);
* `model_reference`: a model folder (absolute) or a Hub id (kept as given: `org/name` is a Hub id unless such a
  local folder exists or the name can only be a path);
* `task_reference`: a built-in task name, or a task YAML file (absolute);
* `recorded` / `recalled`: a path inside a run folder as a record stores it, and back;
* `label_from_path` / `unique_labels`: the short, folder-safe names of models in folders and reports.
"""

import os
import re
from pathlib import Path

TASK_FILE_SUFFIXES = (".yaml", ".yml")
LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")  # what a model's name may not hold


def absolute(path: str | os.PathLike) -> str:
    """`path` with `~` expanded, made absolute against the working folder and normalised (no `..`, no `.`); symbolic
    links are kept, so the run records the path the user chose."""
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def looks_like_path(name: str) -> bool:
    """Whether `name` can only be a local path: a Hub id is 'name' or 'org/name', never absolute or relative."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/") or "\\" in name:
        return True
    return "/" in name and Path(name.split("/")[0]).is_dir()  # runs/model where runs/ is a local folder


def model_reference(name: str) -> str:
    """A model as a recipe records it: an existing local folder or anything that can only be a path, absolute; a
    Hub id as given."""
    if Path(name).expanduser().exists() or looks_like_path(name):
        return absolute(name)
    return name


def task_reference(name: str) -> str:
    """A task as a recipe records it: a task YAML file, absolute; a built-in task name as given."""
    if name.endswith(TASK_FILE_SUFFIXES) or "/" in name or Path(name).expanduser().is_file():
        return absolute(name)
    return name


def recorded(path: str | os.PathLike, root: str | os.PathLike) -> str:
    """How a record in run folder `root` stores `path`: relative to `root` when inside it (the record survives a
    move of the folder), else absolute."""
    full, base = Path(absolute(path)), Path(absolute(root))
    try:
        return full.relative_to(base).as_posix() or "."
    except ValueError:
        return str(full)


def recalled(stored: str | os.PathLike, root: str | os.PathLike) -> Path:
    """The path a record of run folder `root` stored with `recorded` (relative to `root`, or absolute)."""
    return Path(root) / stored


def label_from_path(path: str, depth: int = 1) -> str:
    """A short name for a model path: its last `depth` components, skipping a final `model` folder.

    `runs/demo/teacher/model` → `teacher`; `dmis-lab/biobert-base-cased-v1.2` → `biobert-base-cased-v1.2`.
    """
    parts = [p for p in Path(path).parts if p not in ("/", ".", "..")]
    if len(parts) > 1 and parts[-1] == "model":
        parts = parts[:-1]
    label = "-".join(parts[-depth:]) if parts else "model"
    return LABEL_CHARS.sub("_", label).strip("._") or "model"


def unique_labels(entries: list[tuple[str | None, str]]) -> list[str]:
    """Names for (name, path) pairs: the given name, else the shortest path suffix that makes it unique."""
    labels = [name or label_from_path(path) for name, path in entries]
    for depth in range(2, 8):
        clashes = {label for label in labels if labels.count(label) > 1}
        if not clashes:
            break
        labels = [
            label_from_path(path, depth) if label in clashes and name is None else label
            for label, (name, path) in zip(labels, entries, strict=True)
        ]
    clashes = sorted({label for label in labels if labels.count(label) > 1})
    if clashes:
        raise ValueError(f"models share the name(s) {clashes}; give each a name: {{name: ..., path: ...}}")
    return labels
