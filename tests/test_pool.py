"""`training.pool`: independent runs side by side in spawned worker processes (`study --processes`)."""

import _thread
import os
import signal
import threading
import time
from functools import partial

import pytest
import torch

from biodistil.errors import BiodistilError
from biodistil.training.pool import WorkerPlan, plan_workers, run_in_workers


def _report(path: str) -> None:
    """A run: what it sees of its threads, said on Python's stdout, on the C level's stderr and in a file."""
    print(f"python says threads={torch.get_num_threads()}")
    os.write(2, b"C level says hello\n")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"{os.environ['OMP_NUM_THREADS']} {torch.get_num_threads()} {os.getpid()}")


def _sleep(path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(str(os.getpid()))
    time.sleep(120)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _fail() -> None:
    raise ValueError("the tenth line of corpus.txt is not JSON")


def test_auto_plans_one_process_per_idle_core_within_memory_and_never_on_a_gpu(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def plan(requested, runs=6, cores=8, busy=0.0, memory=64.0, cuda=False):
        return plan_workers(requested, runs, usable=lambda: cores, busy=lambda: busy, free_gib=lambda: memory,
                            cuda=lambda: cuda)

    assert (plan("auto", cores=2).processes, plan("auto", cores=2).threads) == (2, 1)
    assert (plan("auto", cores=8).processes, plan("auto", cores=8).threads) == (6, 1)  # at most one per run
    assert plan("auto", cores=8, busy=5.2).processes == 3  # 2.8 idle cores → 3
    assert plan("auto", cores=2, busy=1.0).processes == 1  # one idle core: one after another
    assert plan("auto", cores=8, memory=7.0).processes == 2  # 3 GiB a worker
    assert plan("auto", cuda=True).processes == 1 and "GPU" in plan("auto", cuda=True).why
    assert (plan(2, cores=8).processes, plan(2, cores=8).threads) == (2, 4)  # asked: the cores shared out
    assert plan(4, runs=2).processes == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert plan("auto").processes == 1 and "OMP_NUM_THREADS" in plan("auto").why


@pytest.mark.slow
def test_runs_go_to_worker_processes_with_their_threads_and_their_output_in_their_logs(tmp_path, capsys):
    seen = [tmp_path / f"seen-{i}.txt" for i in range(3)]
    logs = [tmp_path / "logs" / f"run-{i}.log" for i in range(3)]
    run_in_workers([partial(_report, str(path)) for path in seen], ["a", "b", "c"], logs, WorkerPlan(2, 1, "test"))
    reports = [path.read_text().split() for path in seen]
    assert all(omp == "1" and threads == "1" for omp, threads, _ in reports)
    workers = {pid for _, _, pid in reports}
    assert str(os.getpid()) not in workers and 1 <= len(workers) <= 2
    for log in logs:
        text = log.read_text()
        assert "python says threads=1" in text and "C level says hello" in text
    printed = capsys.readouterr().err
    assert "3 runs, 2 at a time in worker processes (1 CPU thread each; test)" in printed
    assert all(f"{name}: finished in" in printed for name in "abc")


@pytest.mark.slow
def test_a_failed_run_is_named_with_its_log_and_stops_the_pool(tmp_path):
    logs = [tmp_path / f"run-{i}.log" for i in range(2)]
    with pytest.raises(BiodistilError, match=r"bad run failed: ValueError: the tenth line .* \(its output: .*run-1"):
        run_in_workers([partial(_report, str(tmp_path / "seen.txt")), _fail], ["good run", "bad run"], logs,
                       WorkerPlan(1, 1, "test"))
    assert "Traceback" in logs[1].read_text() and "ValueError" in logs[1].read_text()
    assert (tmp_path / "seen.txt").is_file()  # the run before it finished


@pytest.mark.parametrize("command", ["study", "evaluate"])
@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_processes_must_be_a_whole_number_or_auto(command, value, capsys):
    from biodistil.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main([command, "recipes/transfer-study.yaml", "--processes", value])
    assert exited.value.code == 2
    assert f"expected a whole number of processes (1 or more) or auto, got {value!r}" in capsys.readouterr().err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_worker_killed_during_a_run_is_named_and_nothing_waits_forever(tmp_path):
    with pytest.raises(BiodistilError, match=r"dying run: its worker process ended with exit code -9 \(killed"):
        run_in_workers([_die], ["dying run"], [tmp_path / "run.log"], WorkerPlan(1, 1, "test"))


@pytest.fixture()
def ctrl_c_raises():
    """Python's own Ctrl-C handler: a process started in the background by a shell without job control inherits
    SIGINT ignored, and then `_thread.interrupt_main` does nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.slow
def test_an_interrupt_stops_every_worker(tmp_path, ctrl_c_raises):
    pid_file = tmp_path / "pid"
    timer = threading.Timer(0.5, lambda: (_wait_for(pid_file), _thread.interrupt_main()))
    timer.start()
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_in_workers([partial(_sleep, str(pid_file)), partial(_sleep, str(tmp_path / "other"))], ["a", "b"],
                       [tmp_path / "a.log", tmp_path / "b.log"], WorkerPlan(2, 1, "test"))
    timer.join()
    assert time.monotonic() - began < 60
    assert not _alive(int(pid_file.read_text()))


def _wait_for(path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
