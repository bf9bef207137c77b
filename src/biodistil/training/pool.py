"""Independent runs several at a time in worker processes of this machine (`study --processes`).

Small models use a CPU's cores poorly from one process: on 2 cores, two of the demo's student runs at 1 thread each
took 118 s together, against 83 s each one after the other at 2 threads (166 s). `plan_workers` decides how many runs
go at once and with how many torch threads each; `run_in_workers` runs them in that many spawned, non-daemonic
processes (so a run may start its own), each with `OMP_NUM_THREADS` set and each run's output in a log of its own; a
failure or interrupt stops the others (`run_in_workers` says how), and the runs not finished start or resume where a
later call finds them.
"""

import multiprocessing
import os
import queue
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from biodistil.errors import BiodistilError
from biodistil.training.machine import usable_cores
from biodistil.training.threads import busy_cores, decide_threads

GIB_PER_WORKER = 3.0  # what one worker may need (the demo's whole run peaked at 3.3 GB): caps `auto` by free memory
STOP_SECONDS = 120.0  # how long stopped workers get to write their checkpoints


def available_memory_gib() -> float | None:
    """MemAvailable from /proc/meminfo, in GiB (None where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class WorkerPlan:
    """`processes` runs at a time, `threads` torch threads each, and why."""

    processes: int
    threads: int
    why: str


def plan_workers(requested: int | Literal["auto"], runs: int, usable: Callable[[], int] = usable_cores,
                 busy: Callable[[], float | None] = lambda: busy_cores(1.0),
                 free_gib: Callable[[], float | None] = available_memory_gib,
                 cuda: Callable[[], bool] = torch.cuda.is_available) -> WorkerPlan:
    """How many of `runs` independent runs go at once. A number is taken as asked (at most one per run), the cores
    shared between them; `auto`: one process at 1 thread per idle core (idle over a 1 s sample), at most one per
    `GIB_PER_WORKER` of available memory — and one process (the runs one after another, as without workers) on a
    GPU machine, when OMP_NUM_THREADS is set, or when fewer than two cores are idle."""
    cores = usable()
    if requested != "auto":
        count = max(1, min(int(requested), runs))
        return WorkerPlan(count, max(1, cores // count), f"--processes {requested}")
    if cuda():
        return WorkerPlan(1, 0, "a GPU runs one run at a time")
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return WorkerPlan(1, 0, "OMP_NUM_THREADS is set")
    others = busy()
    idle = decide_threads(cores, None if others is None else 1 - others / cores)  # the cores a run could use now
    memory = free_gib()
    by_memory = runs if memory is None else max(1, int(memory // GIB_PER_WORKER))
    count = max(1, min(idle, runs, by_memory))
    why = f"auto: {idle} idle of {cores} usable cores" + ("" if memory is None else f", {memory:.0f} GiB available")
    return WorkerPlan(count, max(1, idle // count) if count > 1 else 0, why)


def side_by_side_plan(requested: int | Literal["auto"], runs: int) -> WorkerPlan | None:
    """The plan for running `runs` runs in worker processes, or None when they run one after another in this
    process (one asked for, one run, or a plan of one process)."""
    if requested == 1 or runs < 2:
        return None
    plan = plan_workers(requested, runs)
    return plan if plan.processes > 1 else None


def run_in_workers(runs: Sequence[Callable[[], object]], names: Sequence[str], logs: Sequence[Path],
                   plan: WorkerPlan) -> None:
    """Run every `runs[i]()` (picklable callables) in `plan.processes` spawned worker processes, its output written
    to `logs[i]`; return when all have finished, or raise naming the first that failed or whose process died.

    The workers run in process groups of their own, so a Ctrl-C reaches this process alone; on any interrupt or
    failure it sends each worker SIGTERM once (a training run stops after its step with a checkpoint, as at a
    Ctrl-C of its own), waits up to `STOP_SECONDS` for them and kills the rest."""
    print(f"{len(runs)} runs, {plan.processes} at a time in worker processes ({plan.threads} CPU thread"
          f"{'s' if plan.threads != 1 else ''} each; {plan.why}); each run's output in {Path(logs[0]).parent}",
          file=sys.stderr, flush=True)
    context = multiprocessing.get_context("spawn")
    tasks, results = context.Queue(), context.Queue()
    for index, (run, log) in enumerate(zip(runs, logs, strict=True)):
        tasks.put((index, run, str(log)))
    holding = context.Array("i", [-1] * plan.processes, lock=False)  # the run each worker runs now (-1: none)
    workers = [context.Process(target=_worker, args=(tasks, results, plan.threads, holding, k),
                               name=f"biodistil-worker-{k}") for k in range(plan.processes)]
    for worker in workers:
        tasks.put(None)  # one "no more runs" each
        worker.start()
    try:
        _collect(results, workers, holding, names, logs)
        for worker in workers:
            worker.join()
    finally:
        _stop(workers)


def _collect(results: Any, workers: list[Any], holding: Sequence[int], names: Sequence[str],
             logs: Sequence[Path]) -> None:
    """Read the workers' reports until every run has finished; raise at the first failure or dead worker."""
    finished = 0
    with tqdm(total=len(names), unit="run", dynamic_ncols=True, desc="runs") as bar:
        while finished < len(names):
            try:
                index, seconds, failure = results.get(timeout=1.0)
            except queue.Empty:
                _check_alive(workers, holding, names, logs)
                continue
            if failure is not None:
                raise BiodistilError(f"{names[index]} failed: {failure} (its output: {logs[index]})")
            bar.write(f"{names[index]}: finished in {seconds:.0f} s", file=sys.stderr)
            bar.update()
            finished += 1


def _check_alive(workers: list[Any], holding: Sequence[int], names: Sequence[str], logs: Sequence[Path]) -> None:
    """Raise when a worker died (killed, out of memory) during a run, naming the run, or when every worker has
    ended with runs left."""
    codes = [worker.exitcode for worker in workers]  # read once: a worker may end between two readings
    for code, index in zip(codes, holding, strict=True):
        if code not in (None, 0) and index >= 0:
            raise BiodistilError(f"{names[index]}: its worker process ended with exit code {code} (killed, or out of "
                                 f"memory?) (its output: {logs[index]})")
    if all(code is not None for code in codes):
        raise BiodistilError(f"the worker processes ended (exit codes {codes}) before every run had finished; the "
                             f"logs are in {Path(logs[0]).parent}")


def _stop(workers: list[Any]) -> None:
    """SIGTERM to every live worker, up to STOP_SECONDS for them to end, then SIGKILL."""
    alive = [worker for worker in workers if worker.is_alive()]
    for worker in alive:
        worker.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for worker in alive:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join()


def _worker(tasks: Any, results: Any, threads: int, holding: Any, worker: int) -> None:
    """A worker's life: its own process group, its thread count, then runs until told there are no more; the run it
    holds is written to `holding[worker]` at once (shared memory: a queue's message may not leave a killed process)."""
    os.setpgrp()  # a Ctrl-C in the terminal is the parent's to handle
    os.environ["OMP_NUM_THREADS"] = str(threads)  # before torch is imported here; also fixes each stage's count
    torch.set_num_threads(threads)
    while (job := tasks.get()) is not None:
        index, run, log = job
        holding[worker] = index
        seconds, failure = _run_logged(run, log)
        results.put((index, seconds, failure))
        holding[worker] = -1
        if failure is not None:
            return


def _run_logged(run: Callable[[], object], log: str) -> tuple[float, str | None]:
    """One run with this process's stdout and stderr (Python's and the C libraries') appended to its log file:
    (seconds, None) or, when it raised, (seconds, the error's last line)."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(log, "a", encoding="utf-8") as handle:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        try:
            run()
        except BaseException as error:  # reported to the parent, which stops the others
            traceback.print_exc()
            return time.monotonic() - began, f"{type(error).__name__}: {error}"
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    return time.monotonic() - began, None
