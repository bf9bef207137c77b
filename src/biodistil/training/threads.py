"""torch's CPU threads: decided by one function (`decide_threads`: the usable cores of the machine record and the idle
share measured by `CpuWindow`), applied per stage by one owner (`StageThreads`: the CLI around each command, the
engine around each training stage, a bench around its timing), which puts the count back when the stage ends.
`pool.plan_workers` reads the same decision. `train.threads` (`stage`, `auto`, N) and `OMP_NUM_THREADS`: see
`StageThreads` and docs/methods.md.
"""

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from biodistil.training.machine import this_machine

Counters = Callable[[], tuple[str, int, int] | None]
ThreadSetting = Literal["stage", "auto"] | int


def decide_threads(usable: int, idle_share: float | None, processes: int = 1) -> int:
    """torch's intra-op threads per process: the idle cores (`usable`·`idle_share`, rounded; all of them when the share
    is unknown), shared between `processes`, at least 1. On a shared machine, threads beyond the idle cores wait on
    each other: a 2-core machine with one busy core ran 4-5x slower with 2 threads than with 1."""
    idle = usable if idle_share is None else usable * min(1.0, max(0.0, idle_share))
    return max(1, min(usable, round(idle)) // max(1, processes))


def busy_cores(sample_seconds: float = 0.3) -> float | None:
    """How many cores other work keeps busy now: CPU time used over a short sample, from the container's cgroup
    (`cpu.stat`) when there is one, else from /proc/stat for the CPUs this process may use; None where neither can
    be read. This process sleeps while sampling, so it does not count itself."""
    first = cpu_counters()
    if first is None:
        return None
    time.sleep(sample_seconds)
    second = cpu_counters()
    return None if second is None else max(0.0, cores_busy_between(first, second))


def cores_busy_between(first: tuple[str, int, int], second: tuple[str, int, int]) -> float:
    """Cores kept busy between two `cpu_counters` readings of the same source (this process included)."""
    (kind, busy0, total0), (_, busy1, total1) = first, second
    if kind == "cgroup":  # microseconds of CPU time over microseconds of wall time
        return (busy1 - busy0) / max(total1 - total0, 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores * (busy1 - busy0) / max(total1 - total0, 1)


def cpu_counters() -> tuple[str, int, int] | None:
    """(source, busy, total): the cgroup's CPU microseconds and the wall clock's, or /proc/stat's busy and total
    jiffies summed over the CPUs this process may use."""
    try:
        for line in Path("/sys/fs/cgroup/cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return "cgroup", int(line.split()[1]), time.monotonic_ns() // 1000
    except (OSError, ValueError):
        pass
    try:
        allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        busy = total = 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, *values = line.split()
            if not name.startswith("cpu") or name == "cpu" or (allowed and int(name[3:]) not in allowed):
                continue
            jiffies = [int(v) for v in values[:8]]
            total += sum(jiffies)
            busy += sum(jiffies) - jiffies[3] - jiffies[4]  # all but idle and iowait
        return ("proc", busy, total) if total else None
    except (OSError, ValueError):
        return None


@dataclass
class CpuWindow:
    """The other work on this machine since a mark: the machine's (or container's) busy CPU time less this process's
    own, over the wall time."""

    counters: Counters = cpu_counters
    own_cpu: Callable[[], float] = time.process_time
    clock: Callable[[], float] = time.monotonic
    _mark: tuple[tuple[str, int, int] | None, float, float] | None = None

    def mark(self) -> None:
        self._mark = (self.counters(), self.own_cpu(), self.clock())

    def seconds(self) -> float:
        return 0.0 if self._mark is None else self.clock() - self._mark[2]

    def busy_cores(self) -> float | None:
        """Cores kept busy by other work since the mark (None: unknown)."""
        if self._mark is None:
            return None
        (before, own_before, wall_before), now = self._mark, self.counters()
        if before is None or now is None or before[0] != now[0]:
            return None
        wall = max(self.clock() - wall_before, 1e-6)
        return max(0.0, cores_busy_between(before, now) - (self.own_cpu() - own_before) / wall)


@dataclass
class StageThreads:
    """torch's intra-op thread count for one stage (a context manager: the count before it is put back at its end).
    `stage`: decided by `decide_threads` when it starts, from the other work over `sample_seconds` (this process
    asleep), and kept to the end; `auto`: also re-checked every `every_seconds` over the whole window since the last
    check, counting only other work (never with several processes or loader workers); a number N: as given.
    `OMP_NUM_THREADS`, when set, wins."""

    setting: ThreadSetting = "stage"
    processes: int = 1
    workers: int = 0
    every_seconds: float = 60.0
    sample_seconds: float = 1.0
    window: CpuWindow = field(default_factory=CpuWindow)
    usable: Callable[[], int] = lambda: this_machine().usable_cores
    sleep: Callable[[float], None] = time.sleep
    changes: list[tuple[int, int, float]] = field(default_factory=list)  # (step, threads, other cores busy)
    fixed: str | None = None  # why the count never changes in this stage, if it does not
    line: str = ""  # what was decided and why (the caller prints it: `announce`)
    _before: int = 0

    def __enter__(self) -> "StageThreads":
        self._before = torch.get_num_threads()
        self.line = self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self._before)

    def _start(self) -> str:
        if isinstance(self.setting, int):
            torch.set_num_threads(self.setting)
            self.changes = [(0, self.setting, float("nan"))]
            return f"CPU threads: {self.setting} (as asked)"
        if os.environ.get("OMP_NUM_THREADS", "").strip():
            self.fixed = "OMP_NUM_THREADS"
            return f"CPU threads: {torch.get_num_threads()} (OMP_NUM_THREADS)"
        self.window.mark()
        self.sleep(self.sample_seconds)
        others = self.window.busy_cores()
        threads = self._decide(others, self.processes)
        torch.set_num_threads(threads)
        self.changes = [(0, threads, others if others is not None else float("nan"))]
        if self.setting == "auto" and (self.processes > 1 or self.workers > 0):
            self.fixed = "several processes" if self.processes > 1 else "loader workers"
        self.window.mark()
        busy = "busy unknown" if others is None else f"{others:.1f} busy over {self.sample_seconds:g} s"
        per = f" per process ({self.processes} processes)" if self.processes > 1 else ""
        again = (f"not re-checked: {self.fixed}" if self.fixed else f"re-checked every {self.every_seconds:g} s"
                 if self.setting == "auto" else "kept for the stage; train.threads: auto re-checks")
        return (f"CPU threads: {threads}{per} ({self.usable()} usable cores, other work {busy}; {again}; set "
                "OMP_NUM_THREADS to choose)")

    def after_step(self, step: int) -> str | None:
        """With `auto`, every `every_seconds`: measure the other work over the window since the last check and follow
        it; returns the line announcing a change (None without one)."""
        if self.setting != "auto" or self.fixed or self.window.seconds() < self.every_seconds:
            return None
        others = self.window.busy_cores()
        self.window.mark()
        threads, current = self._decide(others, 1), torch.get_num_threads()
        if others is None or threads == current:
            return None
        torch.set_num_threads(threads)
        self.changes.append((step, threads, others))
        return (f"CPU threads: {current} -> {threads} at step {step} (other work kept {others:.1f} of "
                f"{self.usable()} cores busy over the last {self.every_seconds:g} s)")

    def summary(self) -> str:
        """The stage's thread counts for its report (`TrainResult.threads`): the first, then each change with its
        step."""
        if self.fixed == "OMP_NUM_THREADS" or not self.changes:
            return f"{torch.get_num_threads()} (OMP_NUM_THREADS)" if self.fixed else str(torch.get_num_threads())
        first, *later = self.changes
        text = f"{first[1]}" + "".join(f", {threads} from step {step}" for step, threads, _ in later)
        return text + ("" if later else " throughout") + (f" ({self.fixed}: not re-checked)" if self.fixed else "")

    def _decide(self, others: float | None, processes: int) -> int:
        usable = self.usable()
        return decide_threads(usable, None if others is None else 1 - others / usable, processes)


def announce(line: str | None) -> None:
    """Print a thread decision once, from the main process of a launch."""
    if line and os.environ.get("LOCAL_RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)
