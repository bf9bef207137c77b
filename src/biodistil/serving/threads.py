"""How many CPU threads the next model call gets: all the cores while the load is light, one fewer once requests pile
up.

On a small machine the model shares its cores with the HTTP layer (the event loop reading, parsing and answering
requests) and often with the clients themselves. A light load is latency-bound: one request, or a few, wait on the
model, and every core shortens the call. A heavy load is throughput-bound: while the model runs, the event loop has
dozens of requests to read and answer, and a model call spread over every core waits for its slowest thread whenever
the event loop takes one of them (measured on 2 cores: the model at 2 threads met the open loop's latency target, at
1 thread the throughput target at 32 clients; docs/deployment.md). So the policy gives the model every core while
fewer than `busy_requests` requests are in the server — in the batch and the queue together, or in flight over HTTP
(read, parsed, queued or written back: a starved HTTP layer feeds the batcher small batches while many requests wait
on it) — and leaves one core to the HTTP layer from there on. `--threads N` fixes the count instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from biodistil.errors import BiodistilError
from biodistil.serving.batching import Load
from biodistil.serving.settings import BUSY_REQUESTS


@dataclass(frozen=True)
class ThreadPolicy:
    """`threads(load)`: the CPU threads of the next model call, `cores` or `cores - 1` (a fixed policy: `cores`)."""

    cores: int
    adaptive: bool = True
    busy_requests: int = BUSY_REQUESTS

    @classmethod
    def of(cls, threads: int | None, usable: int, busy_requests: int = BUSY_REQUESTS) -> ThreadPolicy:
        """`--threads N`: N threads for every call; unset: adaptive over the `usable` cores."""
        if threads is not None:
            return cls(threads, adaptive=False, busy_requests=busy_requests)
        return cls(usable, adaptive=usable > 1, busy_requests=busy_requests)

    def __post_init__(self) -> None:
        if self.cores < 1 or self.busy_requests < 1:
            raise BiodistilError(f"threads {self.cores}, --busy-requests {self.busy_requests}: expected whole numbers "
                                 "of 1 or more")

    @property
    def counts(self) -> tuple[int, ...]:
        """Every thread count the policy may choose, most first."""
        return (self.cores, self.cores - 1) if self.adaptive else (self.cores,)

    def threads(self, load: Load) -> int:
        """All the cores under a light load; one fewer from `busy_requests` requests in the batch and queue, or in
        flight over HTTP."""
        if self.adaptive and max(load.requests + load.waiting, load.in_flight) >= self.busy_requests:
            return self.cores - 1
        return self.cores

    def describe(self) -> str:
        if not self.adaptive:
            return f"{self.cores} thread{'s' * (self.cores != 1)}"
        return (f"{self.cores} threads, {self.cores - 1} from {self.busy_requests} requests in the batch and queue or "
                "in flight (one core left to the HTTP layer)")
