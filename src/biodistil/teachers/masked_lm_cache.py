"""A cache of a masked-LM teacher's outputs over a corpus: task-agnostic distillation without running the teacher.

The teacher's outputs depend on the masked input, so an entry belongs to one (block, mask pattern) of static masking
(`biodistil.data.masking.StaticMaskedBlocks`: pattern p of block b is drawn from (masking seed, b, p) alone). When the
objective's terms read the teacher's logits, an entry holds, for every masked position of the block, either (`logits:
head`) the teacher's last hidden state in its own dtype — the input of its MLM head, which forms the exact logits
while the student trains — or (`logits: top_k`) its top-k logits minus the position's largest logit (float16: near 0,
where the mass is, they are most precise), their token ids (int32), the log-normaliser log Σ_j exp((z_j − max z) / T)
over the whole vocabulary at the objective's temperature (float32), from which `topk_kl_loss` recovers the teacher's
exact tempered probabilities of the k tokens and its tail mass, and m draws from the rest of the vocabulary. When the
terms read them, it also holds the teacher's hidden states of the mapped layers at every position (bfloat16, stored
as their 16-bit patterns).

An entry of the teacher store (`biodistil.teachers.store`: root, key rule, table format), `<root>/mlm-<key>/`:
`key.json` (what the key was made of), and per pattern p the tables `pattern-<p>/shard-<s>.arrow` (one row per block,
blocks s·S .. (s+1)·S − 1 of the corpus, S = `shard_blocks`) with their checksum records, and
`pattern-<p>/complete.json` (written once every shard of the pattern exists).
The key is a hash of the teacher (`teacher_fingerprint`) and its dtype, the tokenizer, the corpus files, the block
size, the masking settings and seed, what stands for the logits (head input, or k, m and the temperature) and the
cached layers: a change of any of them gives another folder (a rebuild). A shard exists whole or not at all;
`build_cache` writes only the shards that are missing or unreadable (an interrupted build resumes), each process
taking the shards s ≡ rank (mod processes). A reader refuses
a pattern without `complete.json` or with a missing, truncated or foreign shard, naming it: a partial cache is never
used. Every shard's sha256 is checked when a process first reads it; when one's bytes changed, every shard is checked,
the damaged ones are deleted and their patterns marked incomplete, so that the next `distill` or `cache-teacher`
rebuilds them all in one pass (`cache-teacher` checks every shard's checksum before anything else, and rebuilds what is
damaged).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from biodistil.config import MaskingConfig, TeacherCacheConfig
from biodistil.data.batch import Batch
from biodistil.data.corpus import corpus_fingerprint, resolve_corpus_files, tokenizer_fingerprint
from biodistil.data.masking import IGNORE_INDEX, MaskingVocabulary, pattern_seed, static_mask
from biodistil.errors import BiodistilError
from biodistil.io import atomic_write_json
from biodistil.models.families import hidden_size, mlm_head, num_layers
from biodistil.models.features import FeatureRequest, Features, extract_features
from biodistil.models.logits import LogitRows, TopKLogits
from biodistil.teachers.loading import freeze
from biodistil.teachers.store import (
    STORE_VERSION,
    MappedTable,
    check_table,
    discard_table,
    entry_key,
    map_table,
    teacher_fingerprint,
    write_table,
)

ROW_FIELDS = ("topk_logits", "topk_ids", "log_norm", "tail_logits", "tail_ids", "head_input")  # per masked position


@dataclass(frozen=True)
class CacheSpec:
    """What one cache holds and how it is laid out; `key()` names its folder."""

    teacher: str  # teacher_fingerprint of the teacher
    teacher_dtype: str
    teacher_layers: int
    width: int  # the teacher's hidden size
    tokenizer: str
    corpus: str  # corpus_fingerprint of the source files (and max_lines)
    block_size: int
    masking: dict[str, Any]
    top_k: int
    tail_samples: int
    temperature: float
    hidden_layers: tuple[int, ...]  # hidden-state indices 0..teacher_layers
    logits: str  # what stands for the teacher's logits at the masked positions: "head", "top_k", or "" (none read)
    shard_blocks: int
    blocks: int  # blocks of the corpus (the held-out ones at its end included)

    def key(self) -> str:
        return entry_key(self.__dict__)


def cache_spec(teacher: str | Path, config: PretrainedConfig, dtype: torch.dtype, tokenizer: PreTrainedTokenizerBase,
               files: list[str], max_lines: int | None, block_size: int, masking: MaskingConfig,
               request: FeatureRequest, cfg: TeacherCacheConfig, temperature: float, blocks: int) -> CacheSpec:
    """The spec of the cache of the teacher at `teacher` (its folder or Hub id; `config` its configuration) over the
    corpus `files` for a cache request (`Objective.cache_request`); settings that do not change what is stored (k, m
    and T for a head-input cache) are left out of the key."""
    teacher_layers = num_layers(config)
    settings = masking.model_dump(include={"probability", "mask_ratio", "random_ratio", "whole_word", "seed"})
    layers = tuple(sorted(index + teacher_layers + 1 if index < 0 else index for index in request.hidden))
    logits = cfg.logits if request.logits else ""
    top_k = logits == "top_k"
    return CacheSpec(
        teacher=teacher_fingerprint(teacher), teacher_dtype=str(dtype).removeprefix("torch."),
        teacher_layers=teacher_layers, width=hidden_size(config), tokenizer=tokenizer_fingerprint(tokenizer),
        corpus=corpus_fingerprint(resolve_corpus_files(files), max_lines), block_size=block_size, masking=settings,
        top_k=cfg.top_k if top_k else 0, tail_samples=cfg.tail_samples if top_k else 0,
        temperature=float(temperature) if top_k else 0.0, hidden_layers=layers, logits=logits,
        shard_blocks=cfg.shard_blocks, blocks=blocks,
    )


@dataclass(frozen=True)
class Cache:
    """One cache folder: `root`/mlm-<the spec's key>."""

    root: Path
    spec: CacheSpec

    @property
    def blocks(self) -> int:
        return self.spec.blocks

    @property
    def folder(self) -> Path:
        return self.root / f"mlm-{self.spec.key()}"

    @property
    def shards(self) -> int:
        return -(-self.blocks // self.spec.shard_blocks)

    def shard_path(self, pattern: int, shard: int) -> Path:
        return self.folder / f"pattern-{pattern}" / f"shard-{shard:05d}.arrow"

    def shard_range(self, shard: int) -> range:
        start = shard * self.spec.shard_blocks
        return range(start, min(start + self.spec.shard_blocks, self.blocks))

    def complete(self, pattern: int) -> bool:
        return (self.folder / f"pattern-{pattern}" / "complete.json").is_file()

    def schema(self, rank: int = 0) -> pa.Schema:
        fields = [pa.field("block", pa.int64()), pa.field("positions", pa.list_(pa.int16()))]
        if self.spec.logits == "top_k":
            fields += [pa.field("topk_logits", pa.list_(pa.float16())), pa.field("topk_ids", pa.list_(pa.int32())),
                       pa.field("log_norm", pa.list_(pa.float32()))]
            if self.spec.tail_samples:
                fields += [pa.field("tail_logits", pa.list_(pa.float16())), pa.field("tail_ids", pa.list_(pa.int32()))]
        if self.spec.logits == "head":  # in the teacher's own dtype (16-bit ones as their bit patterns): exact
            bits = pa.float32() if self.spec.teacher_dtype == "float32" else pa.int16()
            fields.append(pa.field("head_input", pa.list_(bits)))
        fields += [pa.field(f"hidden_{layer}", pa.list_(pa.int16())) for layer in self.spec.hidden_layers]
        return pa.schema(fields, metadata={"key": self.spec.key(), "rank": str(rank)})

    def check_shard(self, pattern: int, shard: int, verify: bool = False) -> str | None:
        """Why the shard cannot be used (missing, without its checksum record, unreadable, another cache's, wrong
        size; with `verify`, bytes that no longer match its sha256), or None."""
        return check_table(self.shard_path(pattern, shard), self.spec.key(), len(self.shard_range(shard)), verify)

    def discard(self, pattern: int, shard: int) -> None:
        """Delete a damaged shard and mark its pattern incomplete, so that the next build writes it again."""
        (self.folder / f"pattern-{pattern}" / "complete.json").unlink(missing_ok=True)
        discard_table(self.shard_path(pattern, shard))

    def size_bytes(self, patterns: Sequence[int]) -> int:
        return sum(self.shard_path(p, s).stat().st_size for p in patterns for s in range(self.shards)
                   if self.shard_path(p, s).is_file())


# ----------------------------------------------------------------------------------------------- writing
@dataclass
class BuildReport:
    built: int = 0
    reused: int = 0


def build_cache(cache: Cache, teacher: PreTrainedModel, blocks: Callable[[int], Sequence[int]],
                vocab: MaskingVocabulary, masking: MaskingConfig, patterns: Sequence[int], batch_size: int,
                pad_id: int, rank: int = 0, processes: int = 1, barrier: Callable[[], None] = lambda: None,
                progress: bool = True, stop_after_shards: int | None = None, verify: bool = False) -> BuildReport:
    """Write the shards of `patterns` that are missing or unusable (with `verify`, also those whose bytes no longer
    match their checksum); this process takes shards s ≡ rank (mod processes). `blocks(b)` gives block b's token ids.
    After every process is done (`barrier`), the main process checks each pattern's shards and marks it complete.
    `stop_after_shards` stops after writing that many (tests of an interrupted build)."""
    report = BuildReport()
    if rank == 0:
        cache.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cache.folder / "key.json", {**cache.spec.__dict__, "store_version": STORE_VERSION})
    barrier()
    todo = []
    for pattern, shard in ((p, s) for p in patterns for s in range(rank, cache.shards, processes)):
        why = cache.check_shard(pattern, shard, verify)
        if why is not None:
            if cache.shard_path(pattern, shard).exists():
                print(f"Teacher cache: {why}; building it again", flush=True)
            cache.discard(pattern, shard)
            todo.append((pattern, shard))
    report.reused = sum(1 for p in patterns for s in range(rank, cache.shards, processes)) - len(todo)
    for pattern, shard in tqdm(todo, desc="teacher cache", unit="shard", disable=not (progress and rank == 0)):
        if stop_after_shards is not None and report.built >= stop_after_shards:
            break
        _write_shard(cache, teacher, blocks, vocab, masking, pattern, shard, batch_size, pad_id, rank)
        report.built += 1
    barrier()
    if rank == 0 and stop_after_shards is None:
        for pattern in patterns:
            if cache.complete(pattern):
                continue
            problems = [why for s in range(cache.shards) if (why := cache.check_shard(pattern, s))]
            if problems:
                raise BiodistilError(f"Teacher cache {cache.folder}: pattern {pattern} is incomplete after building: "
                                     f"{problems[0]}")
            atomic_write_json(cache.folder / f"pattern-{pattern}" / "complete.json",
                              {"pattern": pattern, "shards": cache.shards, "blocks": cache.blocks})
    barrier()
    return report


@torch.inference_mode()
def _write_shard(cache: Cache, teacher: PreTrainedModel, blocks: Callable[[int], Sequence[int]],
                 vocab: MaskingVocabulary, masking: MaskingConfig, pattern: int, shard: int, batch_size: int,
                 pad_id: int, rank: int) -> None:
    spec = cache.spec
    columns: dict[str, list[Any]] = {name: [] for name in cache.schema().names}
    device = next(teacher.parameters()).device
    head = {spec.teacher_layers} if spec.logits == "head" else set()
    request = FeatureRequest(hidden=set(spec.hidden_layers) | head, logits=spec.logits == "top_k")
    numbers = list(cache.shard_range(shard))
    generator = torch.Generator(device=device).manual_seed(pattern_seed(masking.seed, shard, pattern) ^ 0x7A11)
    for start in range(0, len(numbers), batch_size):
        chunk = numbers[start:start + batch_size]
        masked = [static_mask(blocks(b), vocab, masking, masking.seed, b, pattern) for b in chunk]
        length = max(len(ids) for ids, _ in masked)
        ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        labels = torch.full((len(chunk), length), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((len(chunk), length), dtype=torch.long)
        for row, (corrupted, target) in enumerate(masked):
            ids[row, :len(corrupted)], labels[row, :len(target)], attention[row, :len(corrupted)] = corrupted, target, 1
        positions = labels != IGNORE_INDEX
        features = extract_features(teacher, {"input_ids": ids.to(device), "attention_mask": attention.to(device)},
                                    request, positions.to(device))
        counts = positions.sum(1).tolist()
        if spec.logits == "head":
            head_inputs = _as_stored(features.hidden[spec.teacher_layers][positions.to(device)]).split(counts)
        if spec.logits == "top_k":
            logits = features.logits.logits().float()
            logits = logits - logits.max(dim=-1, keepdim=True).values
            top = logits.topk(spec.top_k, dim=-1)
            log_norm = torch.logsumexp(logits / spec.temperature, dim=-1)
            values = top.values.to(torch.float16).cpu().split(counts)
            top_ids = top.indices.to(torch.int32).cpu().split(counts)
            norms = log_norm.cpu().split(counts)
            if spec.tail_samples:
                draws = _tail_draws(logits, top.indices, spec, generator)
                tail_values = logits.gather(-1, draws).to(torch.float16).cpu().split(counts)
                tail_ids = draws.to(torch.int32).cpu().split(counts)
        for row, block in enumerate(chunk):
            n = int(attention[row].sum())
            columns["block"].append(block)
            columns["positions"].append(positions[row].nonzero().squeeze(1).to(torch.int16).numpy())
            if spec.logits == "head":
                columns["head_input"].append(head_inputs[row].reshape(-1).numpy())
            if spec.logits == "top_k":
                columns["topk_logits"].append(values[row].reshape(-1).numpy())
                columns["topk_ids"].append(top_ids[row].reshape(-1).numpy())
                columns["log_norm"].append(norms[row].numpy())
                if spec.tail_samples:
                    columns["tail_logits"].append(tail_values[row].reshape(-1).numpy())
                    columns["tail_ids"].append(tail_ids[row].reshape(-1).numpy())
            for layer in spec.hidden_layers:
                state = features.hidden[layer][row, :n].to(torch.bfloat16)
                columns[f"hidden_{layer}"].append(_as_stored(state).reshape(-1).numpy())
    write_table(cache.shard_path(pattern, shard), cache.schema(rank), columns)


def _as_stored(states: torch.Tensor) -> torch.Tensor:
    """Hidden states on the CPU as stored: 16-bit values as their bit patterns (int16), float32 as they are."""
    states = states.cpu().contiguous()
    return states if states.dtype == torch.float32 else states.view(torch.int16)


def _from_stored(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Stored hidden states back in `dtype` (the inverse of `_as_stored`)."""
    stored = torch.from_numpy(values)
    return stored if dtype == torch.float32 else stored.view(dtype)


def _tail_draws(logits: torch.Tensor, top: torch.Tensor, spec: CacheSpec, generator: torch.Generator) -> torch.Tensor:
    """[M, m] tokens drawn with replacement from each row's tempered distribution outside its top-k tokens."""
    if spec.top_k >= logits.size(-1):  # no tail: the draws are never read
        return top[:, :1].expand(-1, spec.tail_samples)
    tail = torch.softmax(logits / spec.temperature, dim=-1).scatter_(-1, top, 0.0)
    return torch.multinomial(tail, spec.tail_samples, replacement=True, generator=generator)


# ----------------------------------------------------------------------------------------------- reading
class CacheReader:
    """The entries of a complete cache, read from memory-mapped shards (opened lazily, once per process)."""

    def __init__(self, cache: Cache, patterns: Sequence[int]):
        for pattern in patterns:
            if not cache.complete(pattern):
                raise BiodistilError(
                    f"Teacher cache {cache.folder} has no complete pattern {pattern} (an interrupted or missing "
                    "build); run `biodistil cache-teacher` with the recipe (it resumes) or `biodistil distill`, which "
                    "builds what is missing first")
            for shard in range(cache.shards):
                if (why := cache.check_shard(pattern, shard)) is not None:
                    raise BiodistilError(f"Teacher cache {cache.folder} is damaged: {why}; run `biodistil "
                                         "cache-teacher` with the recipe to rebuild the shard")
        self.cache, self.patterns = cache, list(patterns)
        self._open: dict[tuple[int, int], MappedTable] = {}

    def __getstate__(self) -> dict[str, Any]:  # worker processes open their own memory maps
        return {"cache": self.cache, "patterns": self.patterns, "_open": {}}

    def _shard(self, pattern: int, shard: int) -> MappedTable:
        key = (pattern, shard)
        if key not in self._open:
            if (why := self.cache.check_shard(pattern, shard, verify=True)) is not None:
                damaged = self.discard_damaged()
                raise BiodistilError(
                    f"Teacher cache {self.cache.folder} is damaged: {why}. A check of all its shards found "
                    f"{len(damaged)} of {self.cache.shards * len(self.patterns)} damaged ({', '.join(damaged[:3])}"
                    f"{', …' if len(damaged) > 3 else ''}); they were deleted and their patterns marked incomplete. "
                    "Run the same command again: it rebuilds all of them first (an interrupted run resumes from its "
                    "checkpoint); `biodistil cache-teacher` with the recipe rebuilds them without training")
            self._open[key] = map_table(self.cache.shard_path(pattern, shard))
        return self._open[key]

    def discard_damaged(self) -> list[str]:
        """Check every shard of the reader's patterns against its sha256, delete the damaged ones and mark their
        patterns incomplete (so that the next build writes them all again); returns their names."""
        damaged = []
        for pattern in self.patterns:
            for shard in range(self.cache.shards):
                if self.cache.check_shard(pattern, shard, verify=True) is not None:
                    self.cache.discard(pattern, shard)
                    damaged.append(f"pattern-{pattern}/shard-{shard:05d}")
        return damaged

    def entry(self, block: int, pattern: int) -> dict[str, np.ndarray]:
        """The stored arrays of one (block, pattern), copied out of the memory map."""
        shard, row = divmod(block, self.cache.spec.shard_blocks)
        table = self._shard(pattern, shard)
        return {name: np.array(table.row(name, row)) for name in table.lists}


class CachedBlocks(Dataset):
    """Statically masked blocks with the teacher's cached outputs for their (block, pattern) attached."""

    def __init__(self, blocks: Any, reader: CacheReader, payload_index: int = 0):
        self.blocks, self.reader, self.payload_index = blocks, reader, payload_index
        spec = reader.cache.spec
        self.k, self.m, self.layers = spec.top_k, spec.tail_samples, spec.hidden_layers

    def __len__(self) -> int:
        return len(self.blocks)

    def set_epoch(self, epoch: int) -> None:
        self.blocks.set_epoch(epoch)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.blocks[index]
        entry = self.reader.entry(item["block"], item["pattern"])
        masked = (item["labels"] != IGNORE_INDEX).nonzero().squeeze(1)
        if not np.array_equal(entry["positions"], masked.numpy()):
            raise BiodistilError(f"Teacher cache {self.reader.cache.folder}: block {item['block']}, pattern "
                                 f"{item['pattern']} was masked differently from this run's masks")
        teacher: dict[str, torch.Tensor] = {}
        if "topk_ids" in entry:
            teacher["topk_logits"] = torch.from_numpy(entry["topk_logits"]).reshape(-1, self.k)
            teacher["topk_ids"] = torch.from_numpy(entry["topk_ids"]).reshape(-1, self.k)
            teacher["log_norm"] = torch.from_numpy(entry["log_norm"])
        if "tail_ids" in entry:
            teacher["tail_logits"] = torch.from_numpy(entry["tail_logits"]).reshape(-1, self.m)
            teacher["tail_ids"] = torch.from_numpy(entry["tail_ids"]).reshape(-1, self.m)
        if "head_input" in entry:
            dtype = getattr(torch, self.reader.cache.spec.teacher_dtype)
            teacher["head_input"] = _from_stored(entry["head_input"], dtype).reshape(
                len(masked), self.reader.cache.spec.width)
        for layer in self.layers:
            states = _from_stored(entry[f"hidden_{layer}"], torch.bfloat16)
            teacher[f"hidden_{layer}"] = states.reshape(len(item["input_ids"]), -1)
        return {**item, f"teacher@{self.payload_index}": teacher}


class CachedCollate:
    """`collate` for the blocks, plus the teacher's outputs: rows of the masked positions (top-k, head input)
    concatenated in row-major order, hidden states padded to [B, L, D]."""

    def __init__(self, collate: Callable[[list[dict[str, Any]]], Batch], layers: Sequence[int], payload_index: int = 0):
        self.collate, self.layers, self.payload_index = collate, tuple(layers), payload_index

    def __call__(self, items: list[dict[str, Any]]) -> Batch:
        batch = self.collate(items)
        payload = batch.payload(self.payload_index)
        stored = [item[f"teacher@{self.payload_index}"] for item in items]
        for name in ROW_FIELDS:
            if name in stored[0]:
                payload[name] = torch.cat([entry[name] for entry in stored])
        length = batch.input_ids.size(1)
        for layer in self.layers:
            states = [entry[f"hidden_{layer}"] for entry in stored]
            padded = states[0].new_zeros((len(states), length, states[0].size(-1)))
            for row, state in enumerate(states):
                padded[row, :len(state)] = state
            payload[f"hidden_{layer}"] = padded
        return batch


class MaskedLMOutputs:
    """A complete cache as a teacher signal's source (`biodistil.teachers.signal.CachedTeacher`): the blocks get
    their stored outputs in the data-loading stage (`data`), and `features` reads them from the batch: the hidden
    states of the mapped layers and what stands for the logits at the masked positions — formed exactly by the
    teacher's MLM head (`head`: the teacher reduced to it, `head_only`) from its stored input, or the stored top-k
    (`TopKLogits`: the logit terms become the top-k KL)."""

    def __init__(self, reader: CacheReader, head: PreTrainedModel | None = None):
        spec = reader.cache.spec
        if spec.logits == "head" and head is None:
            raise ValueError("a cache of the teacher's head input needs the teacher's head to form its logits")
        if head is not None:
            freeze(head)
        self.reader, self.head = reader, head
        self.layers, self.teacher_layers, self.temperature = spec.hidden_layers, spec.teacher_layers, spec.temperature

    def data(self, dataset: Dataset, collate: Callable, payload_index: int = 0) -> tuple[Dataset, Callable]:
        return CachedBlocks(dataset, self.reader, payload_index), CachedCollate(collate, self.layers, payload_index)

    def features(self, batch: Batch, request: FeatureRequest, positions: torch.Tensor | None,
                 payload_index: int = 0) -> Features:
        stored = batch.payload(payload_index)
        hidden = {layer: stored[f"hidden_{layer}"].float() for layer in self.layers}
        logits = None
        if request.logits and self.head is not None:
            with torch.inference_mode():
                logits = LogitRows(positions, mlm_head(self.head, stored["head_input"].to(self.head.dtype)))
        elif request.logits:
            logits = LogitRows(positions, TopKLogits(
                stored["topk_logits"], stored["topk_ids"], stored["log_norm"], self.temperature,
                stored.get("tail_logits"), stored.get("tail_ids")))
        return Features(hidden=hidden, logits=logits, num_layers=self.teacher_layers)
