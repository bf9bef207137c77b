"""Issue 31, item 1: torch's CPU threads decided per training stage from a sample that means something, and re-checked
while the stage trains, following other work as it comes and goes; OMP_NUM_THREADS always wins. The machine is
simulated: a clock, the container's CPU-time counter and this process's own CPU time, advanced by the test."""

import pytest
import torch

from biodistil.training import threads
from biodistil.training.threads import ThreadGovernor


class Machine:
    """Two usable cores; `run(seconds, others, ours)` advances the clock with `others` cores kept busy by other
    processes and `ours` by this one."""

    def __init__(self) -> None:
        self.clock, self.busy_usec, self.own = 1000.0, 0, 0.0
        self.others = 0.0

    def run(self, seconds: float, others: float, ours: float = 0.0) -> None:
        self.others = others
        self.clock += seconds
        self.busy_usec += int((others + ours) * seconds * 1e6)
        self.own += ours * seconds

    def governor(self, every: float = 60.0) -> ThreadGovernor:
        return ThreadGovernor(every_seconds=every, sample_seconds=1.0,
                              counters=lambda: ("cgroup", self.busy_usec, int(self.clock * 1e6)),
                              own_cpu=lambda: self.own, clock=lambda: self.clock, usable=lambda: 2,
                              sleep=lambda seconds: self.run(seconds, self.others))


@pytest.fixture()
def machine(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_PROCESS_MARK", [])
    before = torch.get_num_threads()
    yield Machine()
    torch.set_num_threads(before)


def test_a_stage_that_starts_beside_a_brief_job_speeds_up_when_it_ends_and_yields_to_a_long_one(machine, capsys):
    machine.others = 1.0  # a brief job holds one core when the stage starts
    governor = machine.governor()
    line = governor.start()
    assert torch.get_num_threads() == 1 and "other work 1.0 busy over 1.0 s" in line and "re-checked every 60 s" in line
    machine.run(30, others=1.0, ours=1.0)
    assert governor.after_step(5) is None, "not before a whole window has passed"
    machine.run(31, others=1.0, ours=1.0)
    assert governor.after_step(10) is None and torch.get_num_threads() == 1, "the other job still runs"
    machine.run(61, others=0.0, ours=1.0)
    said = governor.after_step(30)
    assert said == "CPU threads: 1 -> 2 at step 30 (other work kept 0.0 of 2 cores busy over the last 60 s)"
    assert torch.get_num_threads() == 2
    machine.run(61, others=1.0, ours=2.0)  # a long job arrives: this process's own 2 cores are not counted
    assert governor.after_step(40).startswith("CPU threads: 2 -> 1 at step 40 (other work kept 1.0 of 2")
    machine.run(61, others=1.0, ours=1.0)
    assert governor.after_step(50) is None, "a change is said once"
    assert governor.summary() == "1, 2 from step 30, 1 from step 40"


def test_the_next_stage_measures_other_work_since_the_last_without_sleeping_again(machine):
    first = machine.governor()
    first.start()
    machine.run(5, others=1.0, ours=1.0)  # the rest of the first stage, beside another job
    slept = []
    second = machine.governor()
    second.sleep = slept.append
    line = second.start()
    assert not slept and "other work 1.0 busy over 5.0 s" in line and torch.get_num_threads() == 1


def test_omp_num_threads_wins_and_several_processes_keep_their_first_decision(machine, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    governor = machine.governor()
    assert governor.start() == "CPU threads: 2 (OMP_NUM_THREADS)"
    machine.run(120, others=2.0)
    assert governor.after_step(100) is None and torch.get_num_threads() == 2
    assert governor.summary() == "2 (OMP_NUM_THREADS)"
    monkeypatch.delenv("OMP_NUM_THREADS")
    machine.others = 0.0
    governor = machine.governor()
    assert "1 per process (2 processes)" in governor.start(processes=2) and torch.get_num_threads() == 1
    machine.run(120, others=0.0, ours=1.0)
    assert governor.after_step(100) is None, "sibling processes would count as other work"
    assert governor.summary() == "1 throughout (several processes: not re-checked)"


def test_a_training_stage_decides_and_reports_its_threads(tmp_path, teacher_dir, corpus_file, monkeypatch, capsys):
    from biodistil.config import DistillRecipe, validate_recipe
    from biodistil.methods.task_agnostic import run_distill

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        recipe = validate_recipe(DistillRecipe, {
            "run": {"output_dir": str(tmp_path / "run")}, "teacher": {"name_or_path": str(teacher_dir)},
            "student": {"init": "teacher_layers"}, "objective": {"terms": [{"loss": "mlm"}]},
            "data": {"train": [str(corpus_file)], "block_size": 32, "eval_fraction": 0, "cache_dir": str(tmp_path)},
            "train": {"max_steps": 2, "batch_size": 4, "eval_every": 0, "save_every": 0, "progress_bar": False,
                      "tensorboard": False, "compile": False}})
        run_distill(recipe)
    finally:
        torch.set_num_threads(before)
    assert "re-checked every 60 s" in capsys.readouterr().err
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| CPU threads | " in report and " throughout |" in report
