"""The settings of `biodistil serve`: where it listens, how it batches, what it refuses. Plain data: the web framework
is not imported here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from biodistil.errors import BiodistilError


@dataclass(frozen=True)
class BatchSettings:
    """How concurrent requests become model calls: a batch takes queued requests, oldest first, while their sub-words
    fit `max_batch_tokens` (a request larger than the budget runs alone); an idle model waits up to `max_wait_ms` after
    the first request for more; at most `max_queue` requests wait, the next is refused (429)."""

    max_batch_tokens: int = 4096
    max_wait_ms: float = 0.0  # docs/deployment.md: 2 ms cost a lone client 2-3 ms and bought nothing under load
    max_queue: int = 256

    def check(self) -> None:
        if self.max_batch_tokens < 1 or self.max_queue < 1 or self.max_wait_ms < 0:
            raise BiodistilError(f"--max-batch-tokens {self.max_batch_tokens}, --max-queue {self.max_queue}, "
                                 f"--max-wait-ms {self.max_wait_ms}: expected whole numbers of 1 or more and a wait "
                                 "of 0 ms or more")


@dataclass(frozen=True)
class Limits:
    """What one request may hold; over a limit a request is answered 413 naming it, without reaching the model.
    `request_timeout`: seconds a request may wait for its records before it is answered 504."""

    max_body_bytes: int = 1 << 20
    max_documents: int = 64
    max_chars: int = 20_000
    request_timeout: float = 30.0

    def check(self) -> None:
        if min(self.max_body_bytes, self.max_documents, self.max_chars) < 1 or self.request_timeout <= 0:
            raise BiodistilError(f"--max-body-bytes {self.max_body_bytes}, --max-documents {self.max_documents}, "
                                 f"--max-chars {self.max_chars}, --request-timeout {self.request_timeout}: expected "
                                 "numbers above 0")


@dataclass(frozen=True)
class ServeSettings:
    """Everything `biodistil serve` is told; `api_key`: the key every client must send (None: none asked)."""

    model: str
    runtime: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    threads: int | None = None
    batch_size: int = 16  # windows per model call inside a gathered batch (docs/deployment.md: measured)
    max_length: int | None = None
    threshold: float = 0.5
    device: str = "auto"
    batching: BatchSettings = BatchSettings()
    limits: Limits = Limits()
    api_key: str | None = None
    max_padding: float | None = 0.1  # a model call also ends before its padding would pass this share

    def check(self) -> None:
        self.batching.check()
        self.limits.check()
        if not 0 <= self.port <= 65535:
            raise BiodistilError(f"--port {self.port}: expected 0 (any free port) to 65535")


def read_api_key(path: str | Path) -> str:
    """The API key in `path` (its first line, stripped): a missing, unreadable or empty file is an error naming it."""
    from biodistil.io import read_text

    key = read_text(Path(path), "API key file", "write the key on the file's first line").strip().splitlines()
    if not key or not key[0].strip():
        raise BiodistilError(f"--api-key-file {path}: the file is empty; write the key on its first line")
    if len(key[0].strip()) < 16:
        raise BiodistilError(f"--api-key-file {path}: a key of {len(key[0].strip())} characters is too easy to "
                             "guess; use 16 or more (e.g. python -c 'import secrets; print(secrets.token_urlsafe())')")
    return key[0].strip()
