"""What the server serves: a loaded, warmed-up `Predictor`, the sub-words its requests cost, and the model's facts.

Requests' documents run through `Predictor.__call__` as they are — the same path as `biodistil predict` and the
Python API, with each request's own ids — so a record served is the record `predict` writes for that text (an int8
graph's dynamic activation scales are computed per batch, so its near-ties may fall otherwise in another batch).
Documents asked for in a document format (`formats.py`) run through `Predictor.predict_documents`, as `predict
--format` runs them.
"""

from __future__ import annotations

import copy
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from biodistil.documents.model import SpanDocument
from biodistil.export.predict import Document, Predictor
from biodistil.serving.formats import FORMATS
from biodistil.serving.settings import ServeSettings

WARM_UP_TEXT = "BRCA1 and BRCA2 mutations increase the risk of breast and ovarian cancer in women."


class Service:
    """A `Predictor` ready to answer: loaded, warmed up (batch 1 and a full batch at several lengths), its batch-1
    latency measured."""

    def __init__(self, settings: ServeSettings):
        """Loads the model in the calling thread (the model's own), with `settings.threads` CPU threads (default: the
        usable cores — one model call runs at a time, so it may have them all)."""
        import torch

        from biodistil.training.machine import usable_cores

        self.settings = settings
        threads = settings.threads or usable_cores()
        torch.set_num_threads(threads)
        self.predictor = Predictor(settings.model, settings.runtime, settings.batch_size, settings.threshold,
                                   threads, settings.max_length, settings.device, max_padding=settings.max_padding)
        # a Rust tokenizer of its own for counting on the event loop while the model thread encodes (a fast tokenizer
        # shared by two threads can fail, "Already borrowed", when one sets its truncation as the other encodes),
        # called without transformers' wrapper, which costs more than the count itself
        self.counter, self._counting = copy.deepcopy(self.predictor.tokenizer.backend_tokenizer), threading.Lock()
        self.counter.no_truncation()
        self.counter.no_padding()
        self.batch1_ms = self._warm_up()

    def __call__(self, documents: Sequence[Document | SpanDocument]) -> list[Any]:
        """One result per document, in order: a `Document`'s record (`Predictor.__call__`), a `SpanDocument` with its
        predicted spans (`Predictor.predict_documents`). `Predictor` batches each kind by length."""
        plain = [d for d in documents if isinstance(d, Document)]
        annotated = [d for d in documents if isinstance(d, SpanDocument)]
        records = iter(self.predictor(plain) if plain else [])
        predicted = iter(self.predictor.predict_documents(annotated) if annotated else [])
        return [next(records) if isinstance(d, Document) else next(predicted) for d in documents]

    def formats(self) -> tuple[str, ...]:
        """The formats this model answers in: a token classifier every one, a classifier its records alone."""
        return FORMATS if self.predictor.encoding.kind == "token_classification" else ("jsonl",)

    def tokens(self, documents: Sequence[Document | SpanDocument]) -> int:
        """Sub-words of `documents` with their special tokens: what they weigh against the batch's token budget."""
        texts = [d.text if getattr(d, "text_pair", None) is None else f"{d.text} {d.text_pair}" for d in documents]
        with self._counting:  # the event loop counts small requests, worker threads large ones
            encoded = self.counter.encode_batch(texts, add_special_tokens=True)
        return sum(len(encoding.ids) for encoding in encoded)

    def _warm_up(self) -> float:
        """Run the first batches (allocators, kernels chosen per shape) before any client waits for them; the
        median milliseconds of one document alone."""
        lengths = [WARM_UP_TEXT[: max(8, len(WARM_UP_TEXT) * n // 8)] for n in range(1, 9)]
        self.predictor(lengths * max(1, self.settings.batch_size // len(lengths)))
        times = []
        for _ in range(7):
            began = time.perf_counter()
            self.predictor([WARM_UP_TEXT])
            times.append(1000 * (time.perf_counter() - began))
        return statistics.median(times)

    def facts(self) -> dict[str, Any]:
        """`GET /v1/model`: what is served, from the model's card, its run's records and the running predictor."""
        predictor, variant = self.predictor, self.predictor.variant
        encoding = predictor.encoding
        batching, limits = self.settings.batching, self.settings.limits
        return {
            "model": str(variant.path), "runtime": variant.runtime, "precision": variant.precision,
            "description": predictor.description,
            "task": {"kind": encoding.kind, "name": _task_name(variant.folder), "max_length": encoding.max_length,
                     "labels": list(encoding.labels)},
            "card": card_header(variant.folder), "provenance": provenance_facts(variant.folder),
            "batch1_ms": round(self.batch1_ms, 2),
            "batching": {"max_batch_tokens": batching.max_batch_tokens, "max_wait_ms": batching.max_wait_ms,
                         "max_queue": batching.max_queue, "batch_size": self.settings.batch_size},
            "limits": {"max_body_bytes": limits.max_body_bytes, "max_documents": limits.max_documents,
                       "max_chars": limits.max_chars, "request_timeout_s": limits.request_timeout},
            "formats": list(self.formats()),
        }


def _task_name(folder: Path) -> str | None:
    from biodistil.export.deployed import recorded_task

    task = recorded_task(folder)
    return str(task["name"]) if task and task.get("name") else None


def card_header(folder: Path) -> dict[str, Any] | None:
    """The YAML header of the model card (README.md) beside the model: base model, tags, datasets, scores."""
    import yaml

    card = folder / "README.md"
    if not card.is_file():
        return None
    try:
        text = card.read_text(encoding="utf-8")
        if not text.startswith("---"):
            return None
        header = yaml.safe_load(text.split("---", 2)[1])
    except (OSError, UnicodeDecodeError, yaml.YAMLError, IndexError):
        return None
    return header if isinstance(header, dict) else None


def provenance_facts(folder: Path) -> dict[str, Any] | None:
    """Where the model comes from: an export's source model, and the provenance.json of the run that made it (code
    version and commit, the models it started from, the seed)."""
    from biodistil.export.runtime import is_export_folder, read_description
    from biodistil.io import read_record

    facts: dict[str, Any] = {}
    model = folder
    if is_export_folder(folder):
        source = read_description(folder).get("source")
        facts["export_of"] = source
        model = Path(source) if source else folder
    record = read_record(model.parent / "provenance.json", None) if model.name == "model" else None
    if isinstance(record, dict):
        facts.update(run=str(model.parent), biodistil=record.get("biodistil"), models=record.get("models"),
                     seed=record.get("seed"))
    return facts or None
