"""The one store of teacher outputs: where entries live, how they are named, and the file format both kinds use.

Key rule: `teacher_fingerprint` hashes what the teacher *is*: the content of its config (not where it was loaded from,
so one teacher spelled `models/t`, `../models/t` or absolute is one teacher), the bytes of its weight files and of its
tokenizer files, read from its folder or, for a Hub id, from the Hub cache's snapshot of the revision the id resolves
to now — never its name: a teacher updated on the Hub, or retrained into the same folder, gets new entries.

Root: `teacher_cache.dir` / `kd.cache_dir` when a recipe gives one, else ~/.cache/biodistil/teacher (or
$BIODISTIL_CACHE/teacher). An entry is a folder `<kind>-<key>` (`mlm-…` per corpus, `task-…` per transfer set), the
key a hash of what the outputs depend on (`entry_key`, always with the teacher's `teacher_fingerprint` and
`STORE_VERSION`), with `key.json` saying what the key was made of.

Tables: Arrow IPC files of one record batch (list columns hold a row's values flattened), each beside a checksum
record `<name>.json` (its size and sha256), written to a temporary file and renamed into place after the record, so
a table exists whole or not at all. A reader checks the record (size always, sha256 when asked) and memory-maps the
file: a list column comes back as (offsets, values) numpy views of the mapped bytes, which the readers index to
build each batch's tensors without copying the store into Python objects.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from biodistil.data.corpus import default_cache_dir
from biodistil.errors import BiodistilError
from biodistil.io import atomic_write_json, file_sha256
from biodistil.models.loading import LEFT_OUT_WEIGHTS, model_folder, weights_left_out

STORE_VERSION = 5  # of the layout and meaning of every entry: a change rebuilds all entries
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "merges.txt", "vocab.json",
                   "special_tokens_map.json")
_LOCATION_KEYS = ("_name_or_path", "transformers_version")  # say where and with what it was saved, not what it is


def store_root(explicit: str | Path | None = None) -> Path:
    """The folder entries live in: `explicit` (a recipe's cache folder), else ~/.cache/biodistil/teacher."""
    return Path(explicit).expanduser() if explicit else default_cache_dir().parent / "teacher"


def teacher_fingerprint(name_or_path: str | Path) -> str:
    """sha256 of a teacher's config content, weight files and tokenizer files (the key rule of the module docstring)."""
    folder = model_folder(str(name_or_path))
    recorded = left_out_fingerprint(folder)
    if recorded is not None:
        return recorded
    digest = hashlib.sha256(b"teacher-v1")
    digest.update(json.dumps(_config_content(folder), sort_keys=True).encode())
    weights = sorted({*folder.glob("*.safetensors"), *folder.glob("*.bin")})
    for path in [*weights, *(folder / name for name in TOKENIZER_FILES)]:
        if path.is_file():
            digest.update(path.name.encode())
            with path.open("rb") as handle:
                for chunk in iter(lambda h=handle: h.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def left_out_fingerprint(folder: Path) -> str | None:
    """The recorded fingerprint of a model folder packed without its weights (`kd.study_records`), else None."""
    if not weights_left_out(Path(folder)):
        return None
    record = Path(folder) / LEFT_OUT_WEIGHTS
    try:
        return str(json.loads(record.read_text(encoding="utf-8"))["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BiodistilError(f"{record}: expected JSON with the packed model's fingerprint ({err})") from None


def _config_content(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BiodistilError(f"Teacher {folder}: cannot read its config.json ({err})") from None
    return {key: value for key, value in config.items() if key not in _LOCATION_KEYS}


def entry_key(payload: dict[str, Any]) -> str:
    """The name of the entry whose outputs depend on `payload` (teacher fingerprint, inputs, settings)."""
    text = json.dumps({**payload, "store_version": STORE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def write_table(path: Path, schema: pa.Schema, columns: dict[str, list[Any]]) -> None:
    """One table, atomically: the Arrow file under a temporary name, its checksum record, then the rename."""
    arrays = [pa.array(columns[field.name], type=field.type) for field in schema]
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    atomic_write_json(_record_path(path), {"bytes": temporary.stat().st_size, "sha256": file_sha256(temporary)})
    os.replace(temporary, path)


def check_table(path: Path, key: str, rows: int | None = None, verify: bool = False) -> str | None:
    """Why the table cannot be used — missing, without its checksum record, of another size than written, (with
    `verify`) bytes that no longer match their sha256, unreadable, another entry's (`key`), or not `rows` rows — or
    None when it can."""
    if not path.is_file():
        return f"{path} is missing"
    record = _read_record(path)
    if record is None:
        return f"{path} has no checksum record ({_record_path(path).name})"
    if path.stat().st_size != record.get("bytes"):
        return f"{path} holds {path.stat().st_size:,} bytes, {record.get('bytes'):,} were written"
    if verify and file_sha256(path) != record.get("sha256"):
        return f"{path} does not match its checksum (its bytes changed since it was written)"
    try:
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            found = (reader.schema.metadata or {}).get(b"key", b"").decode()
            count = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
    except (pa.ArrowInvalid, OSError) as err:
        return f"{path} is unreadable or truncated ({err})"
    if found != key:
        return f"{path} belongs to another entry (key {found or 'none'})"
    if rows is not None and count != rows:
        return f"{path} holds {count} rows, expected {rows}"
    return None


def discard_table(path: Path) -> None:
    """Delete a table and its checksum record (a damaged one, so that it is written again)."""
    path.unlink(missing_ok=True)
    _record_path(path).unlink(missing_ok=True)


@dataclass(frozen=True)
class MappedTable:
    """A table's columns as numpy views of the memory-mapped file: `lists[name]` = (offsets [R + 1], values) for a
    list column (row r's values are values[offsets[r]:offsets[r + 1]]), `scalars[name]` [R] for the others."""

    lists: dict[str, tuple[np.ndarray, np.ndarray]]
    scalars: dict[str, np.ndarray]

    def row(self, name: str, index: int) -> np.ndarray:
        offsets, values = self.lists[name]
        return values[offsets[index]:offsets[index + 1]]


def map_table(path: Path) -> MappedTable:
    """The table at `path`, memory-mapped (check it with `check_table` first)."""
    batch = pa.ipc.open_file(pa.memory_map(str(path))).get_batch(0)
    lists, scalars = {}, {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if pa.types.is_list(column.type):
            lists[name] = (column.offsets.to_numpy(), column.values.to_numpy(zero_copy_only=True))
        else:
            scalars[name] = column.to_numpy(zero_copy_only=True)
    return MappedTable(lists, scalars)


def _record_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(_record_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
