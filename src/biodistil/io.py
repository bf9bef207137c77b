"""File I/O shared by every stage: atomic file and folder writes (a reader sees the old content or the new, never
half of it), exclusive locks on the folders a process writes, YAML that refuses duplicate keys, and JSON that stays
standard (NaN written as null, read back as NaN)."""

import fcntl
import hashlib
import json
import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import yaml

from biodistil.errors import BiodistilError

LOCK_FILE = ".biodistil.lock"
STALE_SECONDS = 24 * 3600  # a temporary folder of another host is removed only when this old


@contextmanager
def atomic_open(path: Path) -> Iterator[IO[str]]:
    """A text file to write `path` through: a temporary file in the same folder, renamed onto `path` when the block
    ends (removed when it raises, so a crash or Ctrl-C leaves no half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and an atomic rename (`atomic_open`)."""
    with atomic_open(path) as handle:
        handle.write(text)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def atomic_write_jsonl(path: Path, records: Iterable[Any]) -> None:
    """One JSON value per line (non-ASCII characters kept as they are), written as `atomic_write_text` writes."""
    atomic_write_text(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))


def atomic_directory(target: Path, fill: Callable[[Path], None]) -> None:
    """Build a folder with `fill(tmp_dir)` beside `target`, then swap it into place in one rename.

    An interrupted write leaves only a hidden `.tmp-<name>-<host>-<pid>-*` folder, which a later call removes once
    its process is gone (or, from another host, after a day); the temporary folder of a live process building the
    same target (two runs sharing a cache) is left alone, and the last rename wins.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".tmp-{target.name}-*"):
        if is_stale_temporary(stale, target.name):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-{socket.gethostname()}-{os.getpid()}-",
                                dir=target.parent))
    try:
        fill(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-{socket.gethostname()}-{os.getpid()}-old-",
                                        dir=target.parent))
            os.replace(target, old / "content")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_stale_temporary(folder: Path, name: str) -> bool:
    """Whether a `.tmp-<name>-<host>-<pid>-*` folder was left by a process that is gone: one of this host whose pid
    no longer runs; one of another host (or of the older unlabelled layout) after a day."""
    ours = f".tmp-{name}-{socket.gethostname()}-"
    pid = folder.name[len(ours):].split("-", 1)[0] if folder.name.startswith(ours) else ""
    if pid.isdigit():
        return not process_alive(int(pid))
    try:
        return time.time() - folder.stat().st_mtime > STALE_SECONDS
    except OSError:
        return False


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_HELD_LOCKS: dict[tuple[int, int], IO[str]] = {}  # (device, inode) of the lock file → its open handle


def lock_folder(folder: Path, what: str = "run folder") -> None:
    """Hold an exclusive lock on `folder` for the rest of this process (an advisory `flock` on its
    `.biodistil.lock`, released by the system when the process ends, however it ends). A folder locked by another
    live process is refused with its holder (pid, host, start time); a lock left by a dead process is free, so it is
    taken over. Taking a lock this process already holds is a no-op."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    if _held_here(path):  # also under another name: a folder moved while this process holds it
        return
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the process lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise BiodistilError(f"The {what} {folder} is in use by {holder}; wait for it to finish, or choose another "
                             "folder (two processes writing one folder would mix their outputs)") from None
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    handle.write(f"pid {os.getpid()} on host {socket.gethostname()}, started {started}\n")
    handle.flush()
    status = os.fstat(handle.fileno())
    _HELD_LOCKS[status.st_dev, status.st_ino] = handle


def _held_here(path: Path) -> bool:
    try:
        status = path.stat()
    except OSError:
        return False
    return (status.st_dev, status.st_ino) in _HELD_LOCKS


def clear_folder(folder: Path) -> None:
    """Remove everything in `folder` but its lock file (the lock stays held while the folder starts again)."""
    for entry in Path(folder).iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (first on line {seen[key] + 1}); a later value would "
                    "replace the earlier one silently", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """YAML text (safe: no Python objects) with duplicate keys refused; errors are yaml.YAMLError with a mark."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (what a cache records of each file it writes, and checks when it reads)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def read_text(path: Path, what: str = "file", advice: str = "") -> str:
    """The text of a file biodistil reads back (a recipe, a run's record, a cache's manifest): the one guarded read.
    A file that cannot be read, or holds bytes that are not UTF-8 text (a copy cut short, a disk error, another
    file written over it), is an error naming it, saying what it is and, with `advice`, what to do."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        problem = f"is damaged: byte {err.start} is not UTF-8 text"
    except OSError as err:
        problem = f"cannot be read ({err.strerror or err})"
    raise BiodistilError(f"{path}: the {what} {problem}" + (f"; {advice}" if advice else "")) from None


def read_json(path: Path, what: str = "JSON file", advice: str = "") -> Any:
    """The JSON content of `path` (through `read_text`); a truncated or malformed file is an error naming it."""
    text = read_text(path, what, advice)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BiodistilError(f"{path}: the {what} is damaged (not JSON: {err})" + (f"; {advice}" if advice else "")) \
            from None


def read_record(path: Path, note: str | None = "its stage runs again") -> Any | None:
    """A run's own record (a finished cell's or arm's metrics.json, a summary), or None when it is missing or damaged
    (a disk that filled, a copy cut short): a damaged record says so (`note`: what follows; None: silently) and counts
    as missing, so whatever reads it rebuilds it or treats its run as unfinished."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        if note is not None:
            print(f"{path}: damaged record ({type(err).__name__}); {note}", flush=True)
        return None


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
    """Drop the JSON-lines records of `path` written after `last_step` (a resumed run writes them again), and a last
    line left half-written (a process killed, or a full disk, during an append). A damaged line elsewhere (garbage,
    bytes that are not text) is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        return
    lines = path.read_bytes().splitlines()
    kept = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a record")
        except ValueError:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
            if number == len(lines):
                print(f"{path}:{number}: dropped a half-written last record", flush=True)
                continue
            raise BiodistilError(f"{path}:{number}: not a JSON record; the metrics file is damaged (move it away "
                                 "to continue without the earlier records)") from None
        if record.get("step", 0) <= last_step:
            kept.append(line)
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file biodistil wrote (metrics.jsonl), skipping lines that are not records (a
    damaged line is reported where the file is repaired: `truncate_jsonl`)."""
    records = []
    for raw in Path(path).read_bytes().splitlines():
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
