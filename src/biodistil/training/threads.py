"""torch's CPU threads during training, decided per stage and re-checked while it trains (`ThreadGovernor`).

A stage starts with the idle cores measured over a sample long enough to mean something (1 s, the process asleep so
that it does not count itself); every `every_seconds` of training the governor measures again over the whole window
since the last check, counting only *other* work (the machine's busy CPU time less this process's own), so a run that
started beside a brief job speeds up when it ends, and one that started alone yields when a long job arrives. Each
change is printed once and the stage's report summarises them. `OMP_NUM_THREADS`, when set, always wins; several
processes of a launch or loader worker processes (whose CPU time would count as other work) keep the stage's first
decision.
"""

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

Counters = Callable[[], tuple[str, int, int] | None]
_PROCESS_MARK: list = []  # the process's last CPU-counter snapshot: the next stage measures other work since then


def choose_threads(sample_seconds: float = 0.3) -> str:
    """Set torch's CPU thread count deliberately and return a line saying what was used and why.

    OMP_NUM_THREADS, when set, is kept. Otherwise: the cores this process may use (CPU affinity and the cgroup
    quota of a container) minus the cores other processes keep busy *now*, measured over `sample_seconds` (not a
    load average, which still counts a job that ended a minute ago), at least 1. On a shared machine, threads
    beyond the idle cores wait on each other: a 2-core machine with one busy core ran 4-5x slower with 2 threads
    than with 1.
    """
    import torch

    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return f"CPU threads: {torch.get_num_threads()} (OMP_NUM_THREADS)"
    usable = usable_cores()
    busy = busy_cores(sample_seconds)
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")) or 1))
    idle = usable if busy is None else usable - busy
    threads = max(1, min(usable, round(idle)) // processes)
    torch.set_num_threads(threads)
    per = f" per process ({processes} processes)" if processes > 1 else ""
    state = "busy unknown" if busy is None else f"{busy:.1f} busy now"
    return f"CPU threads: {threads}{per} ({usable} usable cores, {state}; set OMP_NUM_THREADS to choose)"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a container's cgroup CPU quota."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            usable = max(1, min(usable, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return usable


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
class ThreadGovernor:
    """Decides torch's intra-op thread count for one training stage and re-checks it every `every_seconds`."""

    every_seconds: float = 60.0
    sample_seconds: float = 1.0
    counters: Counters = cpu_counters
    own_cpu: Callable[[], float] = time.process_time
    clock: Callable[[], float] = time.monotonic
    usable: Callable[[], int] = usable_cores
    sleep: Callable[[float], None] = time.sleep
    changes: list[tuple[int, int, float]] = field(default_factory=list)  # (step, threads, other cores busy)
    fixed: str | None = None  # why the count never changes in this stage, if it does not
    _mark: tuple[tuple[str, int, int] | None, float, float] | None = None

    def start(self, step: int = 0, processes: int = 1, workers: int = 0) -> str:
        """Decide the stage's first thread count from the other work measured since this process's last snapshot
        (the previous stage's end, or `sample_seconds` of sleep when that window is shorter); returns the line that
        says it (the caller prints it)."""
        if os.environ.get("OMP_NUM_THREADS", "").strip():
            self.fixed = "OMP_NUM_THREADS"
            return f"CPU threads: {torch.get_num_threads()} (OMP_NUM_THREADS)"
        self._mark = _PROCESS_MARK[0] if _PROCESS_MARK else None
        if self._mark is None:
            self._snapshot()
        waited = self.clock() - self._mark[2]
        if waited < self.sample_seconds:
            self.sleep(self.sample_seconds - waited)
        others = self._others_since_mark()
        window = self.clock() - self._mark[2]
        threads = self._threads(others, processes)
        torch.set_num_threads(threads)
        self.changes = [(step, threads, others if others is not None else float("nan"))]
        if processes > 1 or workers > 0:
            self.fixed = "several processes" if processes > 1 else "loader workers"
        self._snapshot()
        busy = "busy unknown" if others is None else f"{others:.1f} busy over {window:.1f} s"
        per = f" per process ({processes} processes)" if processes > 1 else ""
        again = f"not re-checked: {self.fixed}" if self.fixed else f"re-checked every {self.every_seconds:g} s"
        return (f"CPU threads: {threads}{per} ({self.usable()} usable cores, other work {busy}; {again}; set "
                "OMP_NUM_THREADS to choose)")

    def after_step(self, step: int) -> str | None:
        """Every `every_seconds`: measure the other work over the window since the last check and follow it; returns
        the line announcing a change (None without one)."""
        if self.fixed or self._mark is None or self.clock() - self._mark[2] < self.every_seconds:
            return None
        others = self._others_since_mark()
        self._snapshot()
        threads = self._threads(others, 1)
        current = torch.get_num_threads()
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

    def _threads(self, others: float | None, processes: int) -> int:
        usable = self.usable()
        idle = usable if others is None else usable - others
        return max(1, min(usable, round(idle)) // max(1, processes))

    def _snapshot(self) -> None:
        self._mark = (self.counters(), self.own_cpu(), self.clock())
        _PROCESS_MARK[:] = [self._mark]

    def _others_since_mark(self) -> float | None:
        """Cores kept busy by other work since the last snapshot: the machine's (or container's) busy CPU time less
        this process's own, over the wall time."""
        if self._mark is None:
            return None
        (before, own_before, wall_before), now = self._mark, self.counters()
        if before is None or now is None or before[0] != now[0]:
            return None
        wall = max(self.clock() - wall_before, 1e-6)
        own = (self.own_cpu() - own_before) / wall
        return max(0.0, cores_busy_between(before, now) - own)


def announce(line: str | None) -> None:
    """Print a thread decision once, from the main process of a launch."""
    if line and os.environ.get("LOCAL_RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)
