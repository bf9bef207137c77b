"""Plain-text corpora, tokenized once, packed into fixed-length blocks and cached as memory-mapped Arrow.

A corpus is one or more UTF-8 text files (one sentence or paragraph per line, a blank line between
documents). Blocks are `[CLS] tokens... [SEP]` of `block_size` tokens, documents joined by [SEP]. The cache
is keyed by the corpus content, the tokenizer and the block size, so a change of any of them rebuilds it.
"""

import glob
import hashlib
import json
import math
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import datasets
import torch
from datasets.exceptions import DatasetGenerationError
from transformers import PreTrainedTokenizerBase

from biodistil.config import CorpusConfig
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory

CACHE_FORMAT_VERSION = 1
_TOKENIZE_BATCH = 2000


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
    """Yield {"input_ids": [...]} blocks of exactly `block_size` tokens (the last one may be shorter)."""
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        cls_id, sep_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    if cls_id is None or sep_id is None:
        raise BiodistilError("The tokenizer has neither [CLS]/[SEP] nor <s>/</s> tokens to frame blocks with")
    body = block_size - 2
    buffer: list[int] = []
    for batch in _batches(lines, _TOKENIZE_BATCH):
        encoded = tokenizer(batch, add_special_tokens=False)["input_ids"]
        for text, ids in zip(batch, encoded, strict=True):
            if not text:
                if buffer and buffer[-1] != sep_id:
                    buffer.append(sep_id)
                continue
            buffer.extend(ids)
        while len(buffer) >= body:
            yield {"input_ids": [cls_id, *buffer[:body], sep_id]}
            buffer = buffer[body:]
    while buffer and buffer[-1] == sep_id:
        buffer.pop()
    if buffer:
        yield {"input_ids": [cls_id, *buffer, sep_id]}


def _batches(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def default_cache_dir() -> Path:
    return Path(os.environ.get("BIODISTIL_CACHE", Path.home() / ".cache" / "biodistil")) / "corpora"


def build_block_dataset(
    files: list[Path], tokenizer: PreTrainedTokenizerBase, block_size: int,
    max_lines: int | None = None, cache_dir: str | Path | None = None,
) -> datasets.Dataset:
    """Tokenized, packed blocks of the corpus, built once and memory-mapped from the cache afterwards."""
    key = "-".join(
        [corpus_fingerprint(files, max_lines), tokenizer_fingerprint(tokenizer), f"b{block_size}",
         f"v{CACHE_FORMAT_VERSION}"]
    )
    target = Path(cache_dir or default_cache_dir()) / key
    if (target / "dataset_info.json").is_file():
        cached, problem = _read_cache(target)
        if cached is not None:
            return cached
        print(f"The corpus cache {target} is damaged ({problem}); building it again", file=sys.stderr, flush=True)
    try:
        atomic_directory(target, lambda tmp: _write_blocks(tmp, files, tokenizer, block_size, max_lines))
    except OSError as err:
        raise BiodistilError(f"Cannot write the corpus cache in {target.parent} (data.cache_dir, default "
                             f"$BIODISTIL_CACHE/corpora): {err.strerror or err}; choose a writable folder with "
                             "space for the tokenized corpus") from None
    cached, problem = _read_cache(target)
    if cached is None:
        raise BiodistilError(f"The corpus cache {target} was written but cannot be read back ({problem})")
    return cached


def _read_cache(folder: Path) -> tuple[datasets.Dataset | None, str]:
    """The cached blocks, checked against the count written beside them: (dataset, "") or (None, the problem)."""
    try:
        dataset = datasets.load_from_disk(str(folder))
        expected = json.loads((folder / "blocks.json").read_text())["blocks"] if (folder / "blocks.json").is_file() \
            else len(dataset)
        if len(dataset) != expected or "input_ids" not in dataset.column_names:
            return None, f"{len(dataset)} blocks instead of {expected}"
        if len(dataset):
            dataset[len(dataset) - 1]  # reads the end of the memory-mapped file
        return dataset, ""
    except Exception as err:  # pyarrow, datasets and the OS raise many types for a damaged file
        return None, f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def _write_blocks(
    folder: Path, files: list[Path], tokenizer: PreTrainedTokenizerBase, block_size: int, max_lines: int | None
) -> None:
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    generate = lambda: pack_blocks(iter_lines(files, max_lines), tokenizer, block_size)  # noqa: E731
    if next(generate(), None) is None:
        raise BiodistilError(f"Corpus {[str(f) for f in files]} holds no text")
    try:
        dataset = datasets.Dataset.from_generator(generate, features=features, cache_dir=str(folder / "_build"))
    except DatasetGenerationError as err:
        cause = err.__cause__ or err.__context__
        if isinstance(cause, BiodistilError):
            raise cause from None
        raise
    dataset.save_to_disk(str(folder / "data"))
    blocks = len(dataset)
    del dataset
    shutil.rmtree(folder / "_build", ignore_errors=True)
    for item in (folder / "data").iterdir():
        item.rename(folder / item.name)
    (folder / "data").rmdir()
    (folder / "sources.json").write_text(json.dumps([str(f) for f in files], indent=1))
    (folder / "blocks.json").write_text(json.dumps({"blocks": blocks}))


def load_corpus_splits(
    cfg: CorpusConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
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


def _hub_blocks(cfg: CorpusConfig, tokenizer: PreTrainedTokenizerBase) -> datasets.Dataset:
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
    return datasets.Dataset.from_list(blocks)


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
