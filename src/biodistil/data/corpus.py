"""Plain-text corpora, tokenized once, packed into fixed-length blocks and cached as memory-mapped Arrow.

A corpus is one or more UTF-8 text files (one sentence or paragraph per line, a blank line between
documents). Blocks are `[CLS] tokens... [SEP]` of `block_size` tokens, documents joined by [SEP]. The cache
is keyed by the corpus content, the tokenizer and the block size, so a change of any of them rebuilds it.
"""

import contextlib
import glob
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from biodistil.config import CorpusConfig
from biodistil.data.arrow_rows import ArrowRows
from biodistil.embedded import cache_root
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory

CACHE_FORMAT_VERSION = 2
BLOCKS_FILE = "blocks.arrow"  # an Arrow stream of `input_ids` lists, memory-mapped by ArrowRows.from_file
LINES_PER_CHUNK = 4096  # lines tokenized at a time when reading line by line (data.max_lines)
RANGE_BYTES = 4 << 20  # bytes of a corpus file a worker reads and tokenizes at a time


def resolve_corpus_files(patterns: list[str]) -> list[Path]:
    """Expand files, folders (every *.txt below) and glob patterns into a sorted, de-duplicated file list."""
    files: list[Path] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if path.is_dir():
            matches = sorted(p for p in path.rglob("*.txt") if p.is_file())
        elif path.is_file():
            matches = [path]
        else:
            matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not matches:
            raise BiodistilError(f"Corpus entry '{pattern}' matches no file (expected a text file, folder or glob)")
        files.extend(matches)
    return list(dict.fromkeys(p.resolve() for p in files))


def iter_lines(files: list[Path], max_lines: int | None = None) -> Iterator[str]:
    """Lines of the corpus files in order, stripped; a blank string marks a document boundary."""
    emitted = 0
    for path in files:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if b"\x00" in raw:
                    raise BiodistilError(f"{path}:{number}: contains NUL bytes; is this a binary file?")
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as err:
                    raise BiodistilError(f"{path}:{number}: not valid UTF-8 ({err.reason})") from None
                yield line
                emitted += 1
                if max_lines is not None and emitted >= max_lines:
                    return
        yield ""


def corpus_fingerprint(files: list[Path], max_lines: int | None) -> str:
    digest = hashlib.sha256(f"max_lines={max_lines}".encode())
    for path in files:
        digest.update(str(path).encode())
        with path.open("rb") as handle:
            for chunk in iter(lambda h=handle: h.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:16]


def pack_blocks(lines: Iterator[str], tokenizer: PreTrainedTokenizerBase, block_size: int) -> Iterator[dict]:
    """Yield {"input_ids": [...]} blocks of exactly `block_size` tokens (the last one may be shorter), in one
    process (the corpus cache builds the same blocks with every core it may use: `build_block_dataset`)."""
    encoder = _LineEncoder(tokenizer.backend_tokenizer.to_str(), _frame_ids(tokenizer)[1])
    chunks = (encoder(batch) for batch in batched(lines, LINES_PER_CHUNK))
    for blocks in pack_arrays(chunks, *_frame_ids(tokenizer), block_size):
        yield from ({"input_ids": row.tolist()} for row in blocks)


def _frame_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        cls_id, sep_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    if cls_id is None or sep_id is None:
        raise BiodistilError("The tokenizer has neither [CLS]/[SEP] nor <s>/</s> tokens to frame blocks with")
    return cls_id, sep_id


class _LineEncoder:
    """Lines → one int32 array of their token ids, a [SEP] for each document boundary (a blank line; runs of blank
    lines give one). Holds the tokenizer as its JSON, so that worker processes can build their own."""

    def __init__(self, tokenizer_json: str, sep_id: int):
        self.tokenizer_json, self.sep_id = tokenizer_json, sep_id
        self._tokenizer: Tokenizer | None = None
        self._words: _BertWords | None = None

    def __getstate__(self) -> dict:
        return {"tokenizer_json": self.tokenizer_json, "sep_id": self.sep_id, "_tokenizer": None, "_words": None}

    def __call__(self, lines: list[str]) -> np.ndarray:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.from_str(self.tokenizer_json)
            self._tokenizer.no_padding()  # a saved tokenizer may pad or cut every encoding (MiniLM's: to 128)
            self._tokenizer.no_truncation()
            self._words = _BertWords.for_tokenizer(self._tokenizer, self.tokenizer_json)
        pieces: list[list[int]] = []
        slow: list[tuple[int, str]] = []  # (place in pieces, line) for the tokenizer itself
        boundary = False
        for line in lines:
            if not line:
                boundary = True
                continue
            if boundary:
                pieces.append([self.sep_id])
                boundary = False
            ids = self._words.encode(line) if self._words is not None else None
            if ids is None:
                slow.append((len(pieces), line))
            pieces.append(ids or [])
        if boundary:
            pieces.append([self.sep_id])
        if slow:
            encoded = self._tokenizer.encode_batch_fast([line for _, line in slow], add_special_tokens=False)
            for (place, _), encoding in zip(slow, encoded, strict=True):
                pieces[place] = encoding.ids
        total = sum(len(piece) for piece in pieces)
        return np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int32, count=total)


_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")
_BERT_WORDS = re.compile(r"[A-Za-z0-9]+|[^ A-Za-z0-9]")


class _BertWords:
    """The ids a BERT WordPiece tokenizer (BertNormalizer, BertPreTokenizer, WordPiece: BERT, BioBERT, PubMedBERT,
    MiniLM) gives a line of printable ASCII, computed word by word with a cache of each word's pieces: on such a
    line the normalizer only lowercases (when it does) and the pre-tokenizer splits at spaces and isolates every
    other non-alphanumeric character, so the result equals the tokenizer's own (tested), about twice as fast. Any
    other line — non-ASCII, tabs, an added token such as "[SEP]" in the text — is left to the tokenizer."""

    MAX_WORDS = 200_000  # the cache is emptied when it holds this many words: memory stays bounded

    def __init__(self, tokenizer: Tokenizer, lowercase: bool, added: list[str]):
        self.model, self.lowercase, self.added = tokenizer.model, lowercase, added
        self.words: dict[str, list[int]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer, spec_json: str) -> "_BertWords | None":
        spec = json.loads(spec_json)
        kinds = [(spec.get(part) or {}).get("type") for part in ("normalizer", "pre_tokenizer", "model")]
        if kinds != ["BertNormalizer", "BertPreTokenizer", "WordPiece"]:
            return None
        added = [token["content"] for token in spec.get("added_tokens", [])]
        return cls(tokenizer, bool(spec["normalizer"].get("lowercase", True)), added)

    def encode(self, line: str) -> list[int] | None:
        if not _PRINTABLE_ASCII.fullmatch(line) or any(token in line for token in self.added):
            return None
        ids: list[int] = []
        for word in _BERT_WORDS.findall(line.lower() if self.lowercase else line):
            pieces = self.words.get(word)
            if pieces is None:
                if len(self.words) >= self.MAX_WORDS:
                    self.words.clear()
                pieces = self.words[word] = [token.id for token in self.model.tokenize(word)]
            ids += pieces
        return ids


def pack_arrays(chunks: Iterable[np.ndarray], cls_id: int, sep_id: int, block_size: int) -> Iterator[np.ndarray]:
    """[n, block_size] arrays of `[CLS] tokens... [SEP]` blocks from a stream of token arrays (documents joined by
    one [SEP], never two in a row nor one at a block's start), and last the shorter final block as a [1, m] array."""
    body = block_size - 2
    buffer = np.empty(0, dtype=np.int32)
    for chunk in chunks:
        if len(chunk) and chunk[0] == sep_id and (not len(buffer) or buffer[-1] == sep_id):
            chunk = chunk[1:]
        buffer = np.concatenate([buffer, chunk]) if len(buffer) else chunk
        full = len(buffer) // body
        if full:
            yield _framed(buffer[:full * body].reshape(full, body), cls_id, sep_id)
            buffer = buffer[full * body:]
    while len(buffer) and buffer[-1] == sep_id:
        buffer = buffer[:-1]
    if len(buffer):
        yield _framed(buffer.reshape(1, -1), cls_id, sep_id)


def _framed(rows: np.ndarray, cls_id: int, sep_id: int) -> np.ndarray:
    framed = np.empty((rows.shape[0], rows.shape[1] + 2), dtype=np.int32)
    framed[:, 0], framed[:, 1:-1], framed[:, -1] = cls_id, rows, sep_id
    return framed


def batched(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive lists of `size` items (the last one shorter)."""
    batch: list[Any] = []
    for line in items:
        batch.append(line)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def default_cache_dir() -> Path:
    return cache_root() / "corpora"


def build_block_dataset(
    files: list[Path], tokenizer: PreTrainedTokenizerBase, block_size: int,
    max_lines: int | None = None, cache_dir: str | Path | None = None, workers: int | None = None,
) -> ArrowRows:
    """Tokenized, packed blocks of the corpus, built once (tokenized by `workers` processes, default: the torch
    thread count the run chose) and memory-mapped from the cache afterwards."""
    key = "-".join(
        [corpus_fingerprint(files, max_lines), tokenizer_fingerprint(tokenizer), f"b{block_size}",
         f"v{CACHE_FORMAT_VERSION}"]
    )
    target = Path(cache_dir or default_cache_dir()) / key
    if (target / BLOCKS_FILE).is_file() or target.is_dir():
        cached, problem = _read_cache(target)
        if cached is not None:
            return cached
        print(f"The corpus cache {target} is damaged ({problem}); building it again", file=sys.stderr, flush=True)
    workers = workers or max(1, torch.get_num_threads())
    try:
        atomic_directory(target, lambda tmp: _write_blocks(tmp, files, tokenizer, block_size, max_lines, workers))
    except OSError as err:
        raise BiodistilError(f"Cannot write the corpus cache in {target.parent} (data.cache_dir, default "
                             f"$BIODISTIL_CACHE/corpora): {err.strerror or err}; choose a writable folder with "
                             "space for the tokenized corpus") from None
    cached, problem = _read_cache(target)
    if cached is None:
        raise BiodistilError(f"The corpus cache {target} was written but cannot be read back ({problem})")
    return cached


def _read_cache(folder: Path) -> tuple[ArrowRows | None, str]:
    """The cached blocks (memory-mapped), checked against the count and size written beside them: (dataset, "") or
    (None, the problem)."""
    try:
        record = json.loads((folder / "blocks.json").read_text())
        path = folder / BLOCKS_FILE
        if path.stat().st_size != record["bytes"]:
            return None, f"{path.name} holds {path.stat().st_size:,} bytes, {record['bytes']:,} were written"
        dataset = ArrowRows.from_file(path)
        if len(dataset) != record["blocks"] or "input_ids" not in dataset.column_names:
            return None, f"{len(dataset)} blocks instead of {record['blocks']}"
        if len(dataset):
            dataset[len(dataset) - 1]  # reads the end of the memory-mapped file
        return dataset, ""
    except Exception as err:  # pyarrow and the OS raise many types for a damaged file
        return None, f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def _write_blocks(folder: Path, files: list[Path], tokenizer: PreTrainedTokenizerBase, block_size: int,
                  max_lines: int | None, workers: int) -> None:
    """Stream the corpus through the tokenizer into one Arrow stream file of blocks, never holding more than a few
    chunks in memory: `workers` processes each read and tokenize byte ranges of the files (in order), the main
    process packs their token arrays into blocks and writes them."""
    cls_id, sep_id = _frame_ids(tokenizer)
    encoder = _LineEncoder(tokenizer.backend_tokenizer.to_str(), sep_id)
    schema = pa.schema([pa.field("input_ids", pa.list_(pa.int32()))])
    blocks = 0
    with _token_arrays(files, max_lines, encoder, workers) as arrays, \
            pa.OSFile(str(folder / BLOCKS_FILE), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for array in pack_arrays(arrays, cls_id, sep_id, block_size):
            offsets = pa.array(np.arange(0, array.size + 1, array.shape[1], dtype=np.int32))
            writer.write_batch(pa.record_batch([pa.ListArray.from_arrays(offsets, pa.array(array.ravel()))],
                                               schema=schema))
            blocks += array.shape[0]
    if not blocks:
        raise BiodistilError(f"Corpus {[str(f) for f in files]} holds no text")
    (folder / "sources.json").write_text(json.dumps([str(f) for f in files], indent=1))
    (folder / "blocks.json").write_text(json.dumps({"blocks": blocks,
                                                    "bytes": (folder / BLOCKS_FILE).stat().st_size}))


@dataclass(frozen=True)
class _Range:
    """Bytes [start, end) of a corpus file, cut at line ends; `last` marks the file's end (a document boundary)."""

    path: str
    start: int
    end: int
    last: bool


def _ranges(files: list[Path], size: int = RANGE_BYTES) -> Iterator[_Range]:
    for path in files:
        total = path.stat().st_size
        with path.open("rb") as handle:
            start = 0
            while start < total:
                handle.seek(min(start + size, total))
                handle.readline()  # to the end of the line the cut falls in
                end = min(handle.tell(), total)
                yield _Range(str(path), start, end, end >= total)
                start = end
        if not total:
            yield _Range(str(path), 0, 0, True)


def _range_lines(item: _Range) -> list[str]:
    """The stripped lines of a byte range ("" after its file's last line); bad bytes are an error naming the file
    and line."""
    with open(item.path, "rb") as handle:
        handle.seek(item.start)
        data = handle.read(item.end - item.start)
    where = data.find(b"\x00")
    if where >= 0:
        raise BiodistilError(f"{item.path}:{_line_number(item, where)}: contains NUL bytes; is this a binary file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BiodistilError(f"{item.path}:{_line_number(item, err.start)}: not valid UTF-8 ({err.reason})") from None
    lines = [line.strip() for line in text.split("\n")]
    if lines and not lines[-1] and text.endswith("\n"):
        lines.pop()  # the split after the last newline
    return [*lines, ""] if item.last else lines


def _line_number(item: _Range, offset: int) -> int:
    """The 1-based line of byte `offset` of a range (counted from the file's start: only for error messages)."""
    with open(item.path, "rb") as handle:
        return handle.read(item.start + offset).count(b"\n") + 1


_WORKER_ENCODER: _LineEncoder | None = None


def _encode_range(item: _Range) -> np.ndarray:
    return _WORKER_ENCODER(_range_lines(item))  # type: ignore[misc]


def _start_worker(encoder: _LineEncoder) -> None:
    global _WORKER_ENCODER
    _WORKER_ENCODER = encoder
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


@contextlib.contextmanager
def _token_arrays(files: list[Path], max_lines: int | None, encoder: _LineEncoder,
                  workers: int) -> Iterator[Iterator[np.ndarray]]:
    """The token arrays of the corpus, in order: byte ranges read and tokenized by a pool of `workers` processes
    (forked where the system allows, which costs no start-up), or in this process (one worker, a corpus of one
    range, or `max_lines`, which reads line by line), with the tokenizer's own thread pool off."""
    ranges = list(_ranges(files)) if max_lines is None else []
    if workers > 1 and len(ranges) > 1:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else None)
        with context.Pool(workers, initializer=_start_worker, initargs=(encoder,)) as pool:
            yield pool.imap(_encode_range, ranges, chunksize=1)
        return
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        if max_lines is None:
            yield (encoder(_range_lines(item)) for item in ranges)
        else:
            yield map(encoder, batched(iter_lines(files, max_lines), LINES_PER_CHUNK))
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def load_corpus_splits(
    cfg: CorpusConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[ArrowRows, ArrowRows | None]:
    """(train blocks, held-out blocks) for a corpus section of a recipe."""
    if cfg.hub_dataset:
        train = _hub_blocks(cfg, tokenizer)
    else:
        train = build_block_dataset(
            resolve_corpus_files(cfg.train), tokenizer, cfg.block_size, cfg.max_lines, cfg.cache_dir
        )
    if cfg.eval:
        held_out = build_block_dataset(
            resolve_corpus_files(cfg.eval), tokenizer, cfg.block_size, None, cfg.cache_dir
        )
        return train, held_out.select(range(min(len(held_out), cfg.max_eval_blocks)))
    if cfg.eval_fraction == 0:
        return train, None
    n_eval = min(cfg.max_eval_blocks, max(1, math.ceil(len(train) * cfg.eval_fraction)))
    if n_eval >= len(train):
        raise BiodistilError(
            f"The corpus gives only {len(train)} blocks of {cfg.block_size} tokens: too few to hold out "
            f"{n_eval} for evaluation. Give more text, a smaller data.block_size, or data.eval_fraction=0."
        )
    return train.select(range(len(train) - n_eval)), train.select(range(len(train) - n_eval, len(train)))


def _hub_blocks(cfg: CorpusConfig, tokenizer: PreTrainedTokenizerBase) -> ArrowRows:
    import datasets  # only here: ~86 MB with pandas, for a corpus from the Hub

    try:
        source = datasets.load_dataset(cfg.hub_dataset, split="train")
    except Exception as err:  # the datasets library raises many types for "unreachable"
        raise BiodistilError(
            f"Could not load Hub dataset '{cfg.hub_dataset}' ({type(err).__name__}: {err}). Offline, export "
            "it to text files on a connected machine and list them under data.train."
        ) from None
    if cfg.hub_text_column not in source.column_names:
        raise BiodistilError(
            f"Hub dataset '{cfg.hub_dataset}' has no column '{cfg.hub_text_column}'; columns: {source.column_names}"
        )
    lines = (str(text).strip() for text in source[cfg.hub_text_column])
    blocks = list(pack_blocks(lines, tokenizer, cfg.block_size))
    return ArrowRows.from_pylist(blocks)


def collate_blocks(examples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of {"input_ids"} blocks into input_ids and attention_mask tensors."""
    length = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n] = torch.as_tensor(example["input_ids"], dtype=torch.long)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}
