"""Provenance: what a run was made from, written beside its config as `provenance.json`, so that a model can be
audited (a clinical model above all): the code (biodistil's version, and its git commit when run from a checkout),
the libraries, the machine and threads, the seeds, the identity of every model the recipe names (the sha256 of its
weights, or a Hub id and the revision it resolved to — never only a name) and a fingerprint of every data file
(size and sha256; for files over `FULL_HASH_BYTES`, the sha256 of their first and last MiB and their size).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from biodistil.config import nested_section, path_kind, resolve_model_ref
from biodistil.embedded import embedded_entry_of_folder
from biodistil.io import file_sha256
from biodistil.paths import absolute, task_reference
from biodistil.training.machine import describe_machine
from biodistil.version import __version__

FULL_HASH_BYTES = 256 << 20
LIBRARIES = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "safetensors", "onnxruntime",
             "huggingface_hub")
DATA_FIELDS = ("train", "eval", "corpus", "path", "data_dir", "root")  # path fields that name inputs, not outputs


def code_identity() -> dict[str, Any]:
    """biodistil's version and, run from a checkout, its commit (and whether the checkout has changes)."""
    return {"version": __version__, **_git()}


def provenance(recipe: BaseModel) -> dict[str, Any]:
    """The provenance record of a run of `recipe` (resolved: its paths are absolute)."""
    models: dict[str, Any] = {}
    data: dict[str, Any] = {}
    _walk(recipe, "", models, data)
    return {"biodistil": code_identity(), "libraries": _versions(), "machine": describe_machine(),
            "seed": getattr(getattr(recipe, "run", None), "seed", None), "models": models, "data": data}


def _walk(section: BaseModel, prefix: str, models: dict[str, Any], data: dict[str, Any]) -> None:
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        key = f"{prefix}{name}"
        if value is None:
            continue
        kind = path_kind(field)
        if kind is resolve_model_ref:
            models[key] = model_identity(str(value))
        elif kind is task_reference:
            data[key] = _task_files(str(value), getattr(section, "data_dir", None))
        elif kind is absolute and name in DATA_FIELDS:
            files = [file_fingerprint(path) for item in (value if isinstance(value, list) else [value])
                     for path in _files(item)]
            if files:
                data[key] = files
        elif name == "path" and isinstance(value, str):  # a transfer source: relative to the data folder
            files = [file_fingerprint(path) for path in _source_files(value)]
            if files:
                data[key] = files
        elif isinstance(value, BaseModel) and nested_section(field) is not None:
            _walk(value, f"{key}.", models, data)
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            for index, item in enumerate(value):
                _walk(item, f"{key}.{index}.", models, data)


def model_identity(name_or_path: str) -> dict[str, Any]:
    """What a model is: the embedded model's published name, revision and sha256; a local folder's weights
    (sha256 per file); a Hub id and the revision its cached snapshot holds."""
    folder = Path(name_or_path)
    entry = embedded_entry_of_folder(folder)
    if entry is not None:
        return {"embedded": entry.name, "source": entry.description.split(":")[0], "sha256": entry.sha256}
    if folder.is_dir():
        weights = sorted(folder.glob("*.safetensors"))
        # the full sha256 whatever the size (a BERT-base teacher's 440 MB take ~1 s): a model is named by its hash
        return {"folder": str(folder), "weights": {path.name: file_sha256(path) for path in weights}}
    from biodistil.errors import BiodistilError
    from biodistil.models.loading import model_folder

    try:
        snapshot = model_folder(name_or_path)
    except BiodistilError:
        return {"hub_id": name_or_path, "revision": None}
    return {"hub_id": name_or_path, "revision": snapshot.name}


def file_fingerprint(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    if size <= FULL_HASH_BYTES:
        return {"path": str(path), "bytes": size, "sha256": file_sha256(path)}
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(size - (1 << 20))
        digest.update(handle.read(1 << 20))
    return {"path": str(path), "bytes": size, "sha256_first_last_mib": digest.hexdigest()}


def _files(pattern: str) -> list[Path]:
    from biodistil.data.corpus import resolve_corpus_files

    path = Path(pattern)
    if path.is_dir() and not any(path.rglob("*.txt")):
        return []  # a data folder: its task files are listed with the task
    try:
        return resolve_corpus_files([pattern])
    except Exception:  # a missing input is reported by the run itself
        return []


def _source_files(value: str) -> list[Path]:
    from biodistil.data.paths import resolve_data_root
    from biodistil.errors import BiodistilError

    path = Path(value)
    if not path.is_absolute():
        try:
            path = resolve_data_root(None) / value
        except BiodistilError:
            return []
    return [path] if path.is_file() else _files(str(path)) if path.is_dir() else []


def _task_files(name: str, data_dir: str | None) -> list[dict[str, Any]]:
    """The files of a task (every split and fold) that exist: absolute ones as they are, relative ones under the
    data folder (when there is one)."""
    from biodistil.data.paths import resolve_data_root
    from biodistil.errors import BiodistilError
    from biodistil.tasks.registry import get_task

    try:
        task = get_task(name)
    except BiodistilError:
        return []
    try:
        root: Path | None = resolve_data_root(data_dir)
    except BiodistilError:
        root = None
    relatives = {relative.replace("{fold}", str(fold)) for relative in task.files.values()
                 for fold in (task.folds or [None])}
    paths = sorted(Path(relative) if Path(relative).is_absolute() else root / relative
                   for relative in relatives if Path(relative).is_absolute() or root is not None)
    return [file_fingerprint(path) for path in paths if path.is_file()]


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _git() -> dict[str, Any]:
    """The commit of the checkout biodistil runs from (nothing when installed from a package)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return {}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit, "git_dirty": bool(dirty)}

