"""Token tasks read from span-annotated documents (task formats brat, pubtator, bioc, span_jsonl).

A split of such a task is its documents (`biodistil.documents.readers`), split into tagged sentences by the one
alignment (`biodistil.documents.alignment`, with its policy for what does not fit BIO tags and the counts of what
became of every gold entity), and, when several splits name the same file (a corpus without a split of its own, or
a dev set halved into dev and test), the split's share of a seeded shuffle of that file's documents
(`SpanSettings.split`). The task's labels are BIO tags of the entity types: given (as types or as
tags), or read from the train split's documents. A span whose type is not among them is an error naming its file
and line. A file is read and tagged once per version and process (`_tagged`).
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from biodistil.documents.alignment import Alignment, SentenceExample, SpanPolicy, tag_documents
from biodistil.documents.model import SpanDocument, types_of
from biodistil.documents.readers import SPAN_FORMATS, SPAN_READERS, read_span_documents
from biodistil.errors import BiodistilError

__all__ = ["SPAN_FORMATS", "SpanSettings", "SpanSplit", "read_span_split", "tags_for_types", "types_of_tags"]


class SpanSettings(BaseModel):
    """How a span task's documents become tagged sentences, and its split when the corpus has none."""

    model_config = ConfigDict(extra="forbid")

    boundary: Literal["expand", "contract"] = Field(
        "expand", description="an entity boundary inside a word: widen to whole words (expand) or narrow (contract)")
    discontinuous: Literal["extent", "first", "drop"] = Field(
        "extent", description="a discontinuous span: its extent, its first fragment, or dropped (counted)")
    split: dict[str, float] | None = Field(
        None, description="shares of the documents per split, e.g. {train: 0.8, dev: 0.1, test: 0.1}: the splits "
                          "that name the same file divide its documents in these proportions (drawn with `seed`)")
    seed: int = 0

    @field_validator("split")
    @classmethod
    def _shares(cls, split: dict[str, float] | None) -> dict[str, float] | None:
        if split is None:
            return None
        split = {"dev" if k in ("devel", "validation") else k: v for k, v in split.items()}
        if set(split) - {"train", "dev", "test"} or any(v < 0 for v in split.values()) or not sum(split.values()):
            raise ValueError(f"split {split}: expected shares of train, dev and test (not all 0)")
        return split

    @property
    def policy(self) -> SpanPolicy:
        return SpanPolicy(self.boundary, self.discontinuous)


@dataclass(frozen=True)
class SpanSplit:
    """A split of a span task: its gold documents, their tagged sentences, what became of each gold entity."""

    documents: list[SpanDocument]
    examples: list[SentenceExample]
    alignment: Alignment


def span_reader_options(format_name: str) -> list[str]:
    """The keyword options a span format's reader accepts."""
    import inspect

    return list(inspect.signature(SPAN_READERS[format_name]).parameters)[1:]


def tags_for_types(types: Sequence[str]) -> list[str]:
    """O, then B- and I- of each type."""
    return ["O"] + [f"{prefix}-{kind}" for kind in types for prefix in ("B", "I")]


def types_of_tags(labels: Sequence[str]) -> list[str]:
    """The entity types of B-/I- tags, in order."""
    return list(dict.fromkeys(label[2:] for label in labels if label[:2] in ("B-", "I-")))


def read_span_split(format_name: str, path: Path, options: dict[str, Any], settings: SpanSettings, split: str,
                    sharing: Sequence[str] = (), types: Sequence[str] | None = None, heading: str = "") -> SpanSplit:
    """The split's documents and tagged sentences; `sharing`: the splits that name the same file, which divide its
    documents by `settings.split` (a file one split names is read whole). A span of a type outside `types` (when
    given) is an error naming its file and line. What became of the gold entities is printed on stderr, after
    `heading`, the first time this process reads the split."""
    try:
        stamp = (path.stat().st_mtime_ns, path.stat().st_size)
    except OSError:
        stamp = (-1, -1)
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))
    documents, examples, alignment = _tagged(format_name, path.resolve(), stamp, key, settings.policy,
                                             _shares_key(settings, sharing), split, heading)
    if types is not None:
        _check_types(documents, set(types))
    return SpanSplit(list(documents), list(examples), alignment)


def _shares_key(settings: SpanSettings, sharing: Sequence[str]) -> tuple[tuple[str, float], ...] | None:
    if len(set(sharing)) < 2:
        return None
    if settings.split is None:
        raise BiodistilError(f"splits {sorted(set(sharing))} name the same file; give `spans.split` (their shares, "
                             "e.g. {train: 0.8, dev: 0.1, test: 0.1}) so that they hold different documents")
    shares = {name: settings.split.get(name, 0.0) for name in sharing}
    total = sum(shares.values()) or 1.0
    return (*sorted((name, share / total) for name, share in shares.items()), ("seed", settings.seed))


@functools.lru_cache(maxsize=8)
def _tagged(format_name: str, path: Path, stamp: tuple[int, int], options: tuple[tuple[str, Any], ...],
            policy: SpanPolicy, shares: tuple[tuple[str, float], ...] | None, split: str,
            heading: str) -> tuple[tuple[SpanDocument, ...], tuple[SentenceExample, ...], Alignment]:
    """One read and tagging per file version, options and split (a study reads the same splits for every run)."""
    documents = read_span_documents(format_name, path, **dict(options))
    if shares is not None:
        documents = _share(documents, dict(shares), split)
    examples, alignment = tag_documents(documents, policy)
    print(alignment.summary(heading), file=sys.stderr, flush=True)
    return tuple(documents), tuple(examples), alignment


def _share(documents: list[SpanDocument], shares: dict[str, float], split: str) -> list[SpanDocument]:
    """The split's share of the documents: ids sorted, shuffled with the seed, cut by the shares in the order train,
    dev, test; kept in file order."""
    seed = int(shares.pop("seed"))
    ids = sorted({document.id for document in documents})
    random.Random(seed).shuffle(ids)
    start = 0.0
    for name in ("train", "dev", "test"):
        share = shares.get(name, 0.0)
        if name == split:
            chosen = set(ids[round(start * len(ids)):round((start + share) * len(ids))])
            return [document for document in documents if document.id in chosen]
        start += share
    return []


def _check_types(documents: Sequence[SpanDocument], types: set[str]) -> None:
    for document in documents:
        for span in document.spans:
            if span.type not in types:
                raise BiodistilError(f"{document.where(span)}: entity type '{span.type}' is not among the task's "
                                     f"types {sorted(types)}; add it to the task's labels (or leave labels out to "
                                     "read them from the data)")


def labels_from_documents(documents: Sequence[SpanDocument]) -> list[str]:
    """The BIO tags of the types the documents use (sorted)."""
    return tags_for_types(types_of(list(documents)))
