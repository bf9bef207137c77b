"""Dynamic batching: the documents of concurrent requests run through the model together, one call at a time.

Requests wait in one queue, oldest first. While the model runs, requests gather; when it is free, the batcher takes
queued requests while their sub-words fit the token budget (the first always goes, however large) and hands their
documents to `run` — one call, in one worker thread, so that concurrent calls never fight over the cores — and each
request gets back its own records, in its own order. An idle model waits up to `max_wait_ms` after a request arrives
for others to join it. A full queue refuses the next request (`Overloaded`, answered 429 with a Retry-After worked out
from the recent throughput). A batch that fails is run again request by request, so that only the request that makes
the model fail is answered with the error. No web framework here: `app.py` puts HTTP around it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from biodistil.serving.settings import BatchSettings

Run = Callable[[Sequence[Any]], list[Any]]  # one result per document (a record, a predicted document), in order
OnBatch = Callable[[int, int, float], None]


class Overloaded(Exception):
    """The queue is full: try again after `retry_after` seconds."""

    def __init__(self, retry_after: int, depth: int):
        super().__init__(f"the queue holds {depth} requests (--max-queue); retry after {retry_after} s")
        self.retry_after, self.depth = retry_after, depth


@dataclass
class Answer:
    """A request's records (one result per document) and how it went: seconds queued and in the model call, and the
    batch it ran in."""

    records: list[Any]
    queue_seconds: float
    inference_seconds: float
    batch_documents: int
    batch_tokens: int


@dataclass
class _Job:
    documents: Sequence[Any]
    tokens: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


class Batcher:
    """Runs `run(documents) -> records` (one record per document, in order) on the documents of queued requests."""

    def __init__(self, run: Run, settings: BatchSettings, on_batch: OnBatch | None = None):
        """`on_batch(documents, tokens, seconds)` hears of every model call (the metrics)."""
        self._run, self.settings, self._on_batch = run, settings, on_batch
        self._queue: deque[_Job] = deque()
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="biodistil-model")
        self._task: asyncio.Task | None = None
        self._tokens_per_second = 0.0  # recent throughput, for Retry-After
        self.queued_tokens = 0

    @property
    def depth(self) -> int:
        """Requests waiting (not yet in a model call)."""
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="biodistil-batcher")

    async def call(self, function: Callable[[], Any]) -> Any:
        """Run `function` in the model's thread, after the batch in flight (loading, warming up)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)

    async def submit(self, documents: Sequence[Any], tokens: int) -> Answer:
        """The records of `documents` (`tokens`: their sub-words, for the budget). Raises `Overloaded` when the queue
        is full; cancelled (a timeout), the request leaves the queue, or its records are dropped when they come."""
        if len(self._queue) >= self.settings.max_queue:
            raise Overloaded(self.retry_after(), len(self._queue))
        job = _Job(documents, tokens, asyncio.get_running_loop().create_future())
        self._queue.append(job)
        self.queued_tokens += tokens
        self._arrived.set()
        try:
            return await job.future
        finally:
            if job in self._queue:  # cancelled while waiting: it never reaches the model
                self._queue.remove(job)
                self.queued_tokens -= job.tokens

    def retry_after(self) -> int:
        """Seconds until the queue has likely room again: its sub-words over the recent throughput (at least 1)."""
        if self._tokens_per_second <= 0:
            return 1
        return max(1, math.ceil(self.queued_tokens / self._tokens_per_second))

    async def stop(self) -> None:
        """Answer what is queued, then stop (the server has stopped accepting requests)."""
        while self._queue:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        while True:
            if not self._queue:  # nothing between this check and the wait can run: no arrival is missed
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self._gather()
            jobs = self._take()
            if jobs:
                await self._answer(jobs)

    async def _gather(self) -> None:
        """Wait up to `max_wait_ms` after the oldest request for more, unless the budget is already full."""
        deadline = self._queue[0].arrived + self.settings.max_wait_ms / 1000
        while self.queued_tokens < self.settings.max_batch_tokens and (left := deadline - time.perf_counter()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return

    def _take(self) -> list[_Job]:
        jobs: list[_Job] = []
        tokens = 0
        while self._queue and (not jobs or tokens + self._queue[0].tokens <= self.settings.max_batch_tokens):
            job = self._queue.popleft()
            self.queued_tokens -= job.tokens
            if not job.future.done():  # a request cancelled in the meantime is skipped
                jobs.append(job)
                tokens += job.tokens
        return jobs

    async def _answer(self, jobs: list[_Job]) -> None:
        started = time.perf_counter()
        documents = [document for job in jobs for document in job.documents]
        try:
            records = await self.call(lambda: self._run(documents))
        except Exception as error:  # answered to the requests, never raised into the loop
            await self._alone(jobs, error)
            return
        seconds = time.perf_counter() - started
        tokens = sum(job.tokens for job in jobs)
        self._tokens_per_second = tokens / max(seconds, 1e-6)
        if self._on_batch is not None:
            self._on_batch(len(documents), tokens, seconds)
        start = 0
        for job in jobs:
            mine = records[start:start + len(job.documents)]
            start += len(job.documents)
            if not job.future.done():
                job.future.set_result(Answer(mine, started - job.arrived, seconds, len(documents), tokens))

    async def _alone(self, jobs: list[_Job], error: Exception) -> None:
        """A failed batch: each request again on its own, so that one bad request does not fail the others."""
        if len(jobs) == 1:
            if not jobs[0].future.done():
                jobs[0].future.set_exception(error)
            return
        for job in jobs:
            await self._answer([job])
