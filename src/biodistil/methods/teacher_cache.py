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

Layout of `<teacher_cache.dir>/<key>/`: `key.json` (what the key was made of), and per pattern p
`pattern-<p>/shard-<s>.arrow` (Arrow IPC files, memory-mapped when read: one row per block, blocks s·S .. (s+1)·S − 1
of the corpus, S = `shard_blocks`), beside it `shard-<s>.json` (its size and sha256), and `pattern-<p>/complete.json`
(written once every shard of the pattern exists).
The key is a hash of the teacher's weights and dtype, the tokenizer, the corpus files, the block size, the masking
settings and seed, what stands for the logits (head input, or k, m and the temperature) and the cached layers: a
change of any of them gives another folder (a rebuild). Each shard is written to a temporary file and renamed into
place, so a shard either exists whole or not at all; `build_cache` writes only the shards that are missing or
unreadable (an interrupted build resumes), each process taking the shards s ≡ rank (mod processes). A reader refuses
a pattern without `complete.json` or with a missing, truncated or foreign shard, naming it: a partial cache is never
used. Every shard's sha256 is checked when a process first reads it; a shard whose bytes changed is deleted and its
pattern marked incomplete, so the next `distill` or `cache-teacher` rebuilds it (`cache-teacher` checks every
shard's checksum before anything else, and rebuilds what is damaged).
"""

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.config import MaskingConfig, TeacherCacheConfig
from biodistil.data.corpus import corpus_fingerprint, default_cache_dir, resolve_corpus_files, tokenizer_fingerprint
from biodistil.data.masking import IGNORE_INDEX, MaskingVocabulary, pattern_seed, static_mask
from biodistil.errors import BiodistilError
from biodistil.io import atomic_write_json, file_sha256
from biodistil.models.families import hidden_size
from biodistil.models.features import FeatureRequest, TopKLogits, extract_features

CACHE_VERSION = 4
TEACHER_FIELDS = ("teacher_topk_logits", "teacher_topk_ids", "teacher_log_norm", "teacher_tail_logits",
                  "teacher_tail_ids", "teacher_head_input")


def teacher_cache_root(explicit: str | Path | None = None) -> Path:
    """`teacher_cache.dir`, else ~/.cache/biodistil/teacher-mlm (or $BIODISTIL_CACHE/teacher-mlm)."""
    return Path(explicit).expanduser() if explicit else default_cache_dir().parent / "teacher-mlm"


def weights_fingerprint(model: PreTrainedModel) -> str:
    """sha256 of a model's configuration (not where it was loaded from: one teacher spelled `models/t`, `../models/t`
    or absolute is one teacher) and every tensor of its state (names, shapes, dtypes and bytes)."""
    config = {key: value for key, value in model.config.to_dict().items() if key != "_name_or_path"}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(data.shape)}:{data.dtype}".encode())
        digest.update((data.view(torch.int16) if data.dtype == torch.bfloat16 else data).numpy().tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class CacheSpec:
    """What one cache holds and how it is laid out; `key()` names its folder."""

    teacher: str  # weights_fingerprint of the teacher
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
        payload = json.dumps({**self.__dict__, "version": CACHE_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]


def cache_spec(teacher: PreTrainedModel, dtype: torch.dtype, tokenizer: PreTrainedTokenizerBase, files: list[str],
               max_lines: int | None, block_size: int, masking: MaskingConfig, request: FeatureRequest,
               cfg: TeacherCacheConfig, temperature: float, teacher_layers: int, blocks: int) -> CacheSpec:
    """The spec of the cache of `teacher` over the corpus `files` for a cache request (`Objective.cache_request`);
    settings that do not change what is stored (k, m and T for a head-input cache) are left out of the key."""
    settings = masking.model_dump(include={"probability", "mask_ratio", "random_ratio", "whole_word", "seed"})
    layers = tuple(sorted(index + teacher_layers + 1 if index < 0 else index for index in request.hidden))
    logits = cfg.logits if request.logits else ""
    top_k = logits == "top_k"
    return CacheSpec(
        teacher=weights_fingerprint(teacher), teacher_dtype=str(dtype).removeprefix("torch."),
        teacher_layers=teacher_layers, width=hidden_size(teacher.config), tokenizer=tokenizer_fingerprint(tokenizer),
        corpus=corpus_fingerprint(resolve_corpus_files(files), max_lines), block_size=block_size, masking=settings,
        top_k=cfg.top_k if top_k else 0, tail_samples=cfg.tail_samples if top_k else 0,
        temperature=float(temperature) if top_k else 0.0, hidden_layers=layers, logits=logits,
        shard_blocks=cfg.shard_blocks, blocks=blocks,
    )


@dataclass(frozen=True)
class Cache:
    """One cache folder: `root`/<the spec's key>."""

    root: Path
    spec: CacheSpec

    @property
    def blocks(self) -> int:
        return self.spec.blocks

    @property
    def folder(self) -> Path:
        return self.root / self.spec.key()

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
        path = self.shard_path(pattern, shard)
        if not path.is_file():
            return f"{path} is missing"
        record = _read_checksum(path)
        if record is None:
            return f"{path} has no checksum record ({path.with_suffix('.json').name})"
        if path.stat().st_size != record.get("bytes"):
            return f"{path} holds {path.stat().st_size:,} bytes, {record.get('bytes'):,} were written"
        if verify and file_sha256(path) != record.get("sha256"):
            return f"{path} does not match its checksum (its bytes changed since it was written)"
        try:
            with pa.memory_map(str(path)) as source:
                reader = pa.ipc.open_file(source)
                key = (reader.schema.metadata or {}).get(b"key", b"").decode()
                rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        except (pa.ArrowInvalid, OSError) as err:
            return f"{path} is unreadable or truncated ({err})"
        if key != self.spec.key():
            return f"{path} belongs to another cache (key {key or 'none'})"
        if rows != len(self.shard_range(shard)):
            return f"{path} holds {rows} blocks, expected {len(self.shard_range(shard))}"
        return None

    def discard(self, pattern: int, shard: int) -> None:
        """Delete a damaged shard and mark its pattern incomplete, so that the next build writes it again."""
        (self.folder / f"pattern-{pattern}" / "complete.json").unlink(missing_ok=True)
        self.shard_path(pattern, shard).unlink(missing_ok=True)
        self.shard_path(pattern, shard).with_suffix(".json").unlink(missing_ok=True)

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
        atomic_write_json(cache.folder / "key.json", {**cache.spec.__dict__, "version": CACHE_VERSION})
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
            logits = features.logits_at(features.positions).float()
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
    schema = cache.schema(rank)
    arrays = [pa.array(columns[field.name], type=field.type) for field in schema]
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    path = cache.shard_path(pattern, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    atomic_write_json(path.with_suffix(".json"), {"bytes": temporary.stat().st_size, "sha256": file_sha256(temporary)})
    os.replace(temporary, path)


def _read_checksum(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


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
        self.cache = cache
        self._open: dict[tuple[int, int], dict[str, tuple[np.ndarray, np.ndarray]]] = {}

    def __getstate__(self) -> dict[str, Any]:  # worker processes open their own memory maps
        return {"cache": self.cache, "_open": {}}

    def _shard(self, pattern: int, shard: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        key = (pattern, shard)
        if key not in self._open:
            if (why := self.cache.check_shard(pattern, shard, verify=True)) is not None:
                self.cache.discard(pattern, shard)
                raise BiodistilError(f"Teacher cache {self.cache.folder} is damaged: {why}. The shard was deleted and "
                                     "its pattern marked incomplete: run the same command again (it rebuilds the "
                                     "shard first; an interrupted run resumes from its checkpoint)")
            source = pa.memory_map(str(self.cache.shard_path(pattern, shard)))
            batch = pa.ipc.open_file(source).get_batch(0)
            self._open[key] = {
                name: (column.offsets.to_numpy(), column.values.to_numpy(zero_copy_only=True))
                for name, column in zip(batch.schema.names, batch.columns, strict=True) if name != "block"
            }
        return self._open[key]

    def entry(self, block: int, pattern: int) -> dict[str, np.ndarray]:
        """The stored arrays of one (block, pattern), copied out of the memory map."""
        shard, row = divmod(block, self.cache.spec.shard_blocks)
        columns = self._shard(pattern, shard)
        return {name: np.array(values[offsets[row]:offsets[row + 1]]) for name, (offsets, values) in columns.items()}


class CachedBlocks(Dataset):
    """Statically masked blocks with the teacher's cached outputs for their (block, pattern) attached."""

    def __init__(self, blocks: Any, reader: CacheReader):
        self.blocks, self.reader = blocks, reader
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
        out = dict(item)
        if "topk_ids" in entry:
            out["teacher_topk_logits"] = torch.from_numpy(entry["topk_logits"]).reshape(-1, self.k)
            out["teacher_topk_ids"] = torch.from_numpy(entry["topk_ids"]).reshape(-1, self.k)
            out["teacher_log_norm"] = torch.from_numpy(entry["log_norm"])
        if "tail_ids" in entry:
            out["teacher_tail_logits"] = torch.from_numpy(entry["tail_logits"]).reshape(-1, self.m)
            out["teacher_tail_ids"] = torch.from_numpy(entry["tail_ids"]).reshape(-1, self.m)
        if "head_input" in entry:
            dtype = getattr(torch, self.reader.cache.spec.teacher_dtype)
            out["teacher_head_input"] = _from_stored(entry["head_input"], dtype).reshape(
                len(masked), self.reader.cache.spec.width)
        for layer in self.layers:
            states = _from_stored(entry[f"hidden_{layer}"], torch.bfloat16)
            out[f"teacher_hidden_{layer}"] = states.reshape(len(item["input_ids"]), -1)
        return out


class CachedCollate:
    """`collate` for the blocks, plus the teacher's outputs: rows of the masked positions (top-k, head input)
    concatenated in row-major order, hidden states padded to [B, L, D]."""

    def __init__(self, collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]], layers: Sequence[int]):
        self.collate, self.layers = collate, tuple(layers)

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        names = set(TEACHER_FIELDS) | {f"teacher_hidden_{layer}" for layer in self.layers}
        batch = self.collate([{k: v for k, v in item.items() if k not in names} for item in items])
        for name in TEACHER_FIELDS:
            if name in items[0]:
                batch[name] = torch.cat([item[name] for item in items])
        length = batch["input_ids"].size(1)
        for layer in self.layers:
            states = [item[f"teacher_hidden_{layer}"] for item in items]
            padded = states[0].new_zeros((len(states), length, states[0].size(-1)))
            for row, state in enumerate(states):
                padded[row, :len(state)] = state
            batch[f"teacher_hidden_{layer}"] = padded
        return batch


def topk_rows(batch: dict[str, torch.Tensor], temperature: float) -> TopKLogits:
    return TopKLogits(batch["teacher_topk_logits"], batch["teacher_topk_ids"], batch["teacher_log_norm"],
                      temperature, batch.get("teacher_tail_logits"), batch.get("teacher_tail_ids"))
