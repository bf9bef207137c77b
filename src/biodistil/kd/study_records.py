"""A study carried between machines: the records of its finished runs, without their weights.

A study of many runs can take longer than a machine is held (a CI box, a lent server, a working session).
`pack_study` writes what the study's finished runs and teachers left that the rest of the study reads — recipes,
metrics, reports, test and dev predictions, provenance, and the study's teacher store whole (the teachers' scores
and predictions, and their outputs over every transfer set a kd run has read or will read) — into one `.tar.gz`:
no weights, student tokenizers, checkpoints, worker logs, the student's `init_model` or the runs' copies of their
transfer sets, and no unfinished run (it runs again). Every model folder keeps its `config.json` (a teacher its
tokenizer too) and `weights-left-out.json` (`LEFT_OUT_WEIGHTS`): the fingerprint of the whole folder, which
`teachers.store.teacher_fingerprint` reads where the weights are missing, so the store's entries are found without
the teacher.

`unpack_study` makes a new study folder of such a file (tarfile's "data" filter: no paths outside it, no links out,
no device files); `biodistil study --from-records FILE` does so and continues the study (`kd.study`): finished runs are
kept, a kd run whose teacher outputs are all stored runs from them, and a teacher whose outputs a remaining run cannot
find is fine-tuned again and used only when its fingerprint is the recorded one — the same weights to the bit (on
another kind of CPU it is refused).
"""

import gzip
import io
import json
import os
import re
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory
from biodistil.models.loading import LEFT_OUT_WEIGHTS, TOKENIZER_FILES
from biodistil.teachers.store import left_out_fingerprint, teacher_fingerprint
from biodistil.training.run import SUMMARY, finished

RECORD_SUFFIXES = (".json", ".jsonl", ".yaml", ".md")
STORE = "cache"  # the study's teacher store (`kd.study`): its entries' tables are packed whole
TEACHER_FOLDER = re.compile(r"teacher(-.+)?")  # <task>/teacher, teacher-seed-S, teacher-NAME
SKIPPED_FOLDERS = ("init_model", "logs", "onnx", "best")  # made again from the recipe, or a run's console or scratch
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")  # pack_study's one-file form; any other name: a folder
GZIP_OVER = 64 * 1024  # a folder's members larger than this are gzipped (predictions, teacher-output tables)


def pack_study(folder: Path, out: Path) -> dict[str, int]:
    """Write `out` from the study in `folder`, atomically: its own records and those of each finished run (an
    unfinished one is left out: it runs again), as one `.tar.gz` (`ARCHIVE_SUFFIXES`) or, any other name, as a folder
    of the same files, the large ones gzipped (what a git repository keeps best: a file that did not change is not
    stored again). Returns the counts of runs packed (`runs`, and per task and arm or teacher folder) and left out
    (`unfinished`), and the `bytes` written."""
    folder = Path(folder)
    if not (folder / "config.yaml").is_file():
        raise BiodistilError(f"{folder}: not a study folder (no config.yaml, the record of its recipe)")
    counts = {"runs": 0, "unfinished": 0}
    members = sorted(_records(folder, folder, counts), key=lambda member: member[0])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.name.endswith(ARCHIVE_SUFFIXES):
        partial = out.with_name(f".{out.name}.partial")
        with partial.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, \
                tarfile.open(fileobj=zipped, mode="w") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        os.replace(partial, out)
        return {**counts, "bytes": out.stat().st_size}
    atomic_directory(out, lambda tmp: _write_members(tmp, members))
    return {**counts, "bytes": sum(path.stat().st_size for path in out.rglob("*") if path.is_file())}


def _write_members(folder: Path, members: list[tuple[str, bytes]]) -> None:
    """Each member as a file; one over `GZIP_OVER` bytes gzipped as `NAME.gz` (reproducibly: the same content gives
    the same bytes, which git stores once)."""
    for name, data in members:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if len(data) > GZIP_OVER:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (folder / name).write_bytes(data)


def _records(folder: Path, root: Path, counts: dict[str, int]) -> Iterator[tuple[str, bytes]]:
    """(name in the archive, content) of every record below `folder` that the study keeps."""
    if folder != root and (folder / "config.yaml").is_file():  # a run's folder
        if finished(folder, quiet=True) is None:
            counts["unfinished"] += 1
            return
        counts["runs"] += 1
        group = folder.parent.relative_to(root).as_posix() if folder.name.startswith("seed-") else \
            folder.relative_to(root).as_posix()  # <task>/<arm>[/start-k] of its seeds, or a teacher's folder
        counts[group] = counts.get(group, 0) + 1
    if folder.name in SKIPPED_FOLDERS or folder.name.startswith(("checkpoint", ".")):
        return  # a hidden folder: an entry being written (`io.atomic_directory`)
    stored = folder.parent == root / STORE
    if any(folder.glob("*.arrow")) and not stored:
        return  # a run's copy of its transfer set (a datasets folder): not read once the run is finished
    if (folder / "config.json").is_file() and folder != root:
        yield from _model_records(folder, root, teacher=TEACHER_FOLDER.fullmatch(folder.parent.name) is not None)
        return
    for path in sorted(folder.iterdir()):
        if path.is_dir() and not path.is_symlink():
            yield from _records(path, root, counts)
        elif path.is_file() and (stored or path.suffix in RECORD_SUFFIXES) and not path.name.startswith("."):
            yield path.relative_to(root).as_posix(), path.read_bytes()


def _model_records(folder: Path, root: Path, teacher: bool) -> Iterator[tuple[str, bytes]]:
    """A model folder's config (a teacher's tokenizer too: a kd run reads it beside the stored outputs) and the
    fingerprint of the whole folder (weights and tokenizer included)."""
    name = folder.relative_to(root).as_posix()
    kept = ["config.json", *(TOKENIZER_FILES if teacher else ())]
    for file in (folder / kept_name for kept_name in kept):
        if file.is_file():
            yield f"{name}/{file.name}", file.read_bytes()
    if left_out_fingerprint(folder) is not None:  # unpacked earlier, without weights: carried on as it is
        yield f"{name}/{LEFT_OUT_WEIGHTS}", (folder / LEFT_OUT_WEIGHTS).read_bytes()
        return
    record = {"fingerprint": teacher_fingerprint(folder),
              "left_out": sorted(path.name for path in folder.iterdir() if path.suffix in WEIGHT_SUFFIXES)}
    yield f"{name}/{LEFT_OUT_WEIGHTS}", (json.dumps(record, indent=1) + "\n").encode()


def unpack_study(records: Path, folder: Path) -> None:
    """A new study folder `folder` from the records `pack_study` wrote (a .tar.gz or a folder)."""
    records, folder = Path(records), Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise BiodistilError(f"{folder} is not empty: a study starts from records only in a new folder (continue the "
                             "study there with --resume, or give another --out)")
    expected = (f"{records}: expected the records of a study (`biodistil pack-study`), with its config.yaml at the "
                "top; {} has none")
    if records.is_dir():
        if not (records / "config.yaml").is_file():
            raise BiodistilError(expected.format("this folder"))
        _copy_records(records, folder)
    else:
        try:
            with tarfile.open(records, mode="r:gz") as tar:
                if "config.yaml" not in tar.getnames():
                    raise BiodistilError(expected.format("this file"))
                tar.extractall(folder, filter="data")
        except (OSError, tarfile.TarError, EOFError) as err:
            raise BiodistilError(f"{records}: cannot read it as a study's records (.tar.gz): {err}") from None
    if (folder / SUMMARY).is_file():
        print(f"{folder}: the records include a finished study's summary; continuing counts a second look if runs "
              "are added", flush=True)


def _copy_records(records: Path, folder: Path) -> None:
    """The plain files of a records folder copied into `folder`; a link is refused (it could lead outside)."""
    for path in sorted(records.rglob("*")):
        if path.is_symlink():
            raise BiodistilError(f"{path}: a link among a study's records; expected plain files only")
        if path.is_file():
            target = folder / path.relative_to(records)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".gz":  # no record of a study ends so: one `_write_members` gzipped
                try:
                    target.with_suffix("").write_bytes(gzip.decompress(path.read_bytes()))
                except (OSError, EOFError) as err:
                    raise BiodistilError(f"{path}: damaged ({err}); pack the study's records again") from None
            else:
                shutil.copyfile(path, target)
