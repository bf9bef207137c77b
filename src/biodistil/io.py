"""File I/O shared by every stage: atomic file and folder writes (a reader sees the old content or the new, never
half of it), and JSON that stays standard (NaN written as null, read back as NaN)."""

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def atomic_directory(target: Path, fill: Callable[[Path], None]) -> None:
    """Build a folder with `fill(tmp_dir)` beside `target`, then swap it into place in one rename.

    An interrupted write leaves only a hidden `.tmp-*` folder, which the next call removes.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".tmp-{target.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        fill(tmp)
        if target.exists():
            old = target.with_name(f".tmp-{target.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_json(path: Path) -> Any:
    """The JSON content of `path`; an unreadable or malformed file is an error naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise BiodistilError(f"{path}: cannot read JSON ({err})") from None


def jsonable(value: Any) -> Any:
    """The value with NaN and infinities as None, so that JSON files stay standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def number(value: float | None) -> float:
    """A score read back from JSON: None (an undefined score) is NaN."""
    return math.nan if value is None else float(value)


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop the JSON-lines records of `path` written after `last_step` (a resumed run writes them again)."""
    path = Path(path)
    if path.is_file():
        kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line)["step"] <= last_step]
        atomic_write_text(path, "".join(line + "\n" for line in kept))
