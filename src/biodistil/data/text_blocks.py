"""The corpus as blocks of text, for distillation across tokenizers: each tokenizer reads the same characters.

Packed token blocks (`biodistil.data.corpus`) are ids of one tokenizer; a teacher with another tokenizer cannot read
them, and decoding them does not give the text back (case, accents, spacing). Across tokenizers a **block is a piece
of text**: consecutive lines of one document, joined by a space, holding at most `block_size − 2` tokens of the
*student's* tokenizer (room for its [CLS] and [SEP]), so that the student's side is the block it would read in one
tokenizer's run; a line longer than that is cut before a word (a token that follows whitespace, or the line's start),
and a single word longer than the block at a token. Documents (blank lines) never share a block.

Blocks are built once per (corpus, student tokenizer, block size), streamed line by line through the tokenizer and
written as one Arrow stream of strings beside the token-block caches, memory-mapped when read: memory does not grow
with the corpus. `AlignedTextCollate` tokenizes a batch of blocks with both tokenizers and aligns them to words
(`biodistil.data.token_alignment.align_texts`) in the data-loading stage: the student's side is truncated at the
block size, the teacher's at `teacher_max_length` (words cut on either side are simply not shared).
"""

import hashlib
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from tokenizers import Encoding, Tokenizer
from transformers import PreTrainedTokenizerBase

from biodistil.config import CorpusConfig
from biodistil.data.arrow_rows import ArrowRows
from biodistil.data.batch import Batch
from biodistil.data.corpus import (
    LINES_PER_CHUNK,
    batched,
    corpus_fingerprint,
    default_cache_dir,
    iter_lines,
    resolve_corpus_files,
    tokenizer_fingerprint,
)
from biodistil.data.token_alignment import WordRule, align_texts
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory

TEXT_FORMAT_VERSION = 1
TEXTS_FILE = "texts.arrow"  # an Arrow stream of `text` strings, memory-mapped by ArrowRows.from_file
RECORDS_PER_BATCH = 4096


# ------------------------------------------------------------------------------------------ packing
def pack_texts(lines: Iterator[str], tokenizer: PreTrainedTokenizerBase, block_size: int) -> Iterator[str]:
    """Texts of at most `block_size` − 2 tokens of `tokenizer` (module docstring), from the corpus lines ("" marks a
    document boundary)."""
    body = block_size - 2
    backend = _plain_backend(tokenizer)
    current: list[str] = []
    used = 0
    for chunk in batched(lines, LINES_PER_CHUNK):
        encodings = iter(backend.encode_batch([line for line in chunk if line], add_special_tokens=False))
        for line in chunk:
            if not line:
                yield from _joined(current)
                current, used = [], 0
                continue
            for piece, count in _pieces(line, next(encodings), body):
                if current and used + count > body:
                    yield from _joined(current)
                    current, used = [], 0
                current.append(piece)
                used += count
    yield from _joined(current)


def _plain_backend(tokenizer: PreTrainedTokenizerBase) -> Tokenizer:
    """The tokenizer's backend without the padding or truncation a saved tokenizer may carry (MiniLM's: to 128)."""
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend


def _pieces(line: str, encoding: Encoding, body: int) -> list[tuple[str, int]]:
    """The line as pieces of at most `body` tokens with their token counts: whole when it fits, else cut before the
    last word start that keeps a piece within `body` (at `body` tokens when one word is longer)."""
    count = len(encoding.ids)
    if count <= body:
        return [(line, count)] if count else []
    starts = [start for start, _ in encoding.offsets]
    word_start = [i == 0 or start == 0 or line[start - 1].isspace() for i, start in enumerate(starts)]
    pieces, first = [], 0
    while first < count:
        last = min(first + body, count)
        if last < count:
            cut = max((i for i in range(first + 1, last + 1) if word_start[i]), default=last)
            last = cut
        end = starts[last] if last < count else len(line)
        pieces.append((line[starts[first]:end].strip(), last - first))
        first = last
    return [(text, n) for text, n in pieces if text]


def _joined(lines: list[str]) -> Iterator[str]:
    if lines:
        yield " ".join(lines)


# ------------------------------------------------------------------------------------------ the cache
def build_text_dataset(files: list[Path], tokenizer: PreTrainedTokenizerBase, block_size: int,
                       max_lines: int | None = None, cache_dir: str | Path | None = None) -> ArrowRows:
    """The corpus's text blocks (`pack_texts`), built once and memory-mapped from the cache afterwards (keyed by the
    corpus content, the tokenizer and the block size, beside the token-block caches)."""
    key = "-".join(["text", corpus_fingerprint(files, max_lines), tokenizer_fingerprint(tokenizer), f"b{block_size}",
                    f"v{TEXT_FORMAT_VERSION}"])
    target = Path(cache_dir or default_cache_dir()) / key
    if target.is_dir():
        cached, problem = _read_texts(target)
        if cached is not None:
            return cached
        print(f"The text-block cache {target} is damaged ({problem}); building it again", file=sys.stderr, flush=True)
    try:
        atomic_directory(target, lambda tmp: _write_texts(tmp, files, tokenizer, block_size, max_lines))
    except OSError as err:
        raise BiodistilError(f"Cannot write the text-block cache in {target.parent} (data.cache_dir): "
                             f"{err.strerror or err}; choose a writable folder") from None
    cached, problem = _read_texts(target)
    if cached is None:
        raise BiodistilError(f"The text-block cache {target} was written but cannot be read back ({problem})")
    return cached


def _write_texts(folder: Path, files: list[Path], tokenizer: PreTrainedTokenizerBase, block_size: int,
                 max_lines: int | None) -> None:
    schema = pa.schema([pa.field("text", pa.large_string())])
    blocks = 0
    digest = hashlib.sha256()
    with pa.OSFile(str(folder / TEXTS_FILE), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for chunk in batched(pack_texts(iter_lines(files, max_lines), tokenizer, block_size), RECORDS_PER_BATCH):
            writer.write_batch(pa.record_batch([pa.array(chunk, pa.large_string())], schema=schema))
            blocks += len(chunk)
            digest.update("\n".join(chunk).encode())
    if not blocks:
        raise BiodistilError(f"Corpus {[str(f) for f in files]} holds no text")
    (folder / "texts.json").write_text(json.dumps({"blocks": blocks, "bytes": (folder / TEXTS_FILE).stat().st_size,
                                                   "sources": [str(f) for f in files]}, indent=1))


def _read_texts(folder: Path) -> tuple[ArrowRows | None, str]:
    """The cached text blocks, checked against the count and size written beside them: (dataset, "") or (None, the
    problem)."""
    try:
        record = json.loads((folder / "texts.json").read_text())
        path = folder / TEXTS_FILE
        if path.stat().st_size != record["bytes"]:
            return None, f"{path.name} holds {path.stat().st_size:,} bytes, {record['bytes']:,} were written"
        dataset = ArrowRows.from_file(path)
        if len(dataset) != record["blocks"] or "text" not in dataset.column_names:
            return None, f"{len(dataset)} blocks instead of {record['blocks']}"
        return dataset, ""
    except Exception as err:  # pyarrow and the OS raise many types for a damaged file
        return None, f"{type(err).__name__}: {err}"


def load_text_splits(cfg: CorpusConfig, tokenizer: PreTrainedTokenizerBase
                     ) -> tuple[ArrowRows, ArrowRows | None]:
    """(train blocks, held-out blocks) of text for a corpus section, split as `load_corpus_splits` splits token
    blocks: `data.eval` files, else `eval_fraction` of the blocks from the end (at most `max_eval_blocks`)."""
    if cfg.hub_dataset:
        raise BiodistilError("Across tokenizers the corpus is read as text from files: give data.train, not "
                             "data.hub_dataset")
    train = build_text_dataset(resolve_corpus_files(cfg.train), tokenizer, cfg.block_size, cfg.max_lines,
                               cfg.cache_dir)
    if cfg.eval:
        held_out = build_text_dataset(resolve_corpus_files(cfg.eval), tokenizer, cfg.block_size, None, cfg.cache_dir)
        return train, held_out.select(range(min(len(held_out), cfg.max_eval_blocks)))
    if cfg.eval_fraction == 0:
        return train, None
    n_eval = min(cfg.max_eval_blocks, max(1, math.ceil(len(train) * cfg.eval_fraction)))
    if n_eval >= len(train):
        raise BiodistilError(f"The corpus gives only {len(train)} text blocks: too few to hold out {n_eval} for "
                             "evaluation. Give more text, a smaller data.block_size, or data.eval_fraction=0.")
    return train.select(range(len(train) - n_eval)), train.select(range(len(train) - n_eval, len(train)))


# ------------------------------------------------------------------------------------------ batches
@dataclass(frozen=True)
class AlignedTextCollate:
    """Text blocks → one aligned batch (`AlignedBatch.to_batch()`): both tokenizations, padded, and their unit ids and
    masks; the student's side truncated at `student_max_length` (the block size), the teacher's at
    `teacher_max_length`; several teachers: `more_teachers`, (tokenizer, max length) of each further one."""

    student_tokenizer: PreTrainedTokenizerBase
    teacher_tokenizer: PreTrainedTokenizerBase
    student_max_length: int
    teacher_max_length: int
    words: WordRule = "bert"
    more_teachers: tuple[tuple[PreTrainedTokenizerBase, int], ...] = ()

    def __call__(self, examples: list[dict[str, Any]]) -> Batch:
        batch = align_texts([example["text"] for example in examples], self.student_tokenizer,
                            self.teacher_tokenizer, student_max_length=self.student_max_length,
                            teacher_max_length=self.teacher_max_length, words=self.words,
                            more_teachers=self.more_teachers)
        return batch.to_batch()
