"""Paths, decided once: what a user gives is made absolute when a recipe is read (against the working folder), and
what a run writes down for its own later use is relative to the run folder, so that the folder can move.

* `absolute`: a file, folder or glob the user gave (`--out runs/demo`, `data.train: [corpus/*.txt]`);
* `model_reference`: a model folder (absolute) or a Hub id (kept as given: `org/name` is a Hub id unless such a
  local folder exists or the name can only be a path);
* `task_reference`: a built-in task name, or a task YAML file (absolute);
* `recorded` / `recalled`: a path inside a run folder as a record stores it, and back.
"""

import os
from pathlib import Path

TASK_FILE_SUFFIXES = (".yaml", ".yml")


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
