"""torch's CPU threads (issue 31 item 1, issue 53 item 3): one function decides from the usable cores and a measured
idle share; `StageThreads` applies it per stage and puts the count back after it; re-checking while a stage trains is
opt-in (`train.threads: auto`); OMP_NUM_THREADS wins over a measured count; no module-level state; the process
settings a stage changes are put back. The machine is simulated: a clock, the container's CPU-time counter and this
process's own CPU time, advanced by the test."""

from types import SimpleNamespace

import pytest
import torch

from biodistil.training import threads
from biodistil.training.machine import stage_settings
from biodistil.training.pool import plan_workers
from biodistil.training.threads import CpuWindow, StageThreads, decide_threads


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

    def stage(self, setting="auto", processes: int = 1) -> StageThreads:
        window = CpuWindow(counters=lambda: ("cgroup", self.busy_usec, int(self.clock * 1e6)),
                           own_cpu=lambda: self.own, clock=lambda: self.clock)
        return StageThreads(setting, processes, every_seconds=60.0, sample_seconds=1.0, window=window,
                            usable=lambda: 2, sleep=lambda seconds: self.run(seconds, self.others))


@pytest.fixture()
def machine(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    yield Machine()
    torch.set_num_threads(before)


def test_one_function_decides_from_the_usable_cores_and_the_idle_share_and_the_worker_plan_reads_it(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [decide_threads(4, 0.5), decide_threads(4, None), decide_threads(2, 0.0), decide_threads(2, 0.26)] == [
        2, 4, 1, 1]
    assert decide_threads(8, 1.0, processes=3) == 2 and decide_threads(2, 1.7) == 2, "shared; at most the usable"
    plan = plan_workers("auto", 8, usable=lambda: 8, busy=lambda: 3.0, free_gib=lambda: None, cuda=lambda: False)
    assert plan.processes == decide_threads(8, 1 - 3.0 / 8) == 5


def test_the_threads_module_keeps_no_state_between_stages():
    state = [name for name, value in vars(threads).items()
             if not name.startswith("__") and isinstance(value, list | dict | set)]
    assert state == []


def test_with_auto_a_stage_beside_a_brief_job_speeds_up_when_it_ends_and_yields_to_a_long_one(machine):
    machine.others = 1.0  # a brief job holds one core when the stage starts
    with machine.stage("auto") as stage:
        assert torch.get_num_threads() == 1 and "other work 1.0 busy over 1 s" in stage.line
        assert "re-checked every 60 s" in stage.line
        machine.run(30, others=1.0, ours=1.0)
        assert stage.after_step(5) is None, "not before a whole window has passed"
        machine.run(31, others=1.0, ours=1.0)
        assert stage.after_step(10) is None and torch.get_num_threads() == 1, "the other job still runs"
        machine.run(61, others=0.0, ours=1.0)
        said = stage.after_step(30)
        assert said == "CPU threads: 1 -> 2 at step 30 (other work kept 0.0 of 2 cores busy over the last 60 s)"
        assert torch.get_num_threads() == 2
        machine.run(61, others=1.0, ours=2.0)  # a long job arrives: this process's own 2 cores are not counted
        assert stage.after_step(40).startswith("CPU threads: 2 -> 1 at step 40 (other work kept 1.0 of 2")
        machine.run(61, others=1.0, ours=1.0)
        assert stage.after_step(50) is None, "a change is said once"
        assert stage.summary() == "1, 2 from step 30, 1 from step 40"


def test_by_default_a_stage_keeps_its_first_count_and_every_stage_puts_the_count_back(machine):
    torch.set_num_threads(3)
    machine.others = 1.0
    with machine.stage("stage") as stage:
        assert torch.get_num_threads() == 1 and "kept for the stage; train.threads: auto re-checks" in stage.line
        machine.run(120, others=0.0, ours=1.0)
        assert stage.after_step(100) is None and torch.get_num_threads() == 1, "the other job ended: no re-check"
        assert stage.summary() == "1 throughout"
    assert torch.get_num_threads() == 3, "the count before the stage"
    with machine.stage(2) as stage:
        assert torch.get_num_threads() == 2 and stage.line == "CPU threads: 2 (as asked)"
    assert torch.get_num_threads() == 3


def test_omp_num_threads_wins_over_a_measured_count_and_several_processes_are_not_re_checked(machine, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    with machine.stage("auto") as stage:
        assert stage.line == "CPU threads: 2 (OMP_NUM_THREADS)"
        machine.run(120, others=2.0)
        assert stage.after_step(100) is None and torch.get_num_threads() == 2
        assert stage.summary() == "2 (OMP_NUM_THREADS)"
    with machine.stage(1):
        assert torch.get_num_threads() == 1, "a number in the recipe is used as given"
    monkeypatch.delenv("OMP_NUM_THREADS")
    machine.others = 0.0
    with machine.stage("auto", processes=2) as stage:
        assert "1 per process (2 processes)" in stage.line and torch.get_num_threads() == 1
        machine.run(120, others=0.0, ours=1.0)
        assert stage.after_step(100) is None, "sibling processes would count as other work"
        assert stage.summary() == "1 throughout (several processes: not re-checked)"


def test_a_command_decides_its_threads_and_puts_them_back(monkeypatch):
    from biodistil.cli.main import _run

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "this_machine", lambda: SimpleNamespace(usable_cores=1))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        args = SimpleNamespace(command="evaluate", run=lambda _: torch.get_num_threads())
        assert _run(args) == 1 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_a_stage_puts_back_tf32_and_dynamos_suppress_errors():
    import torch._dynamo

    matmul, tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    suppress = torch._dynamo.config.suppress_errors
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        with stage_settings(torch.device("cuda")):  # the settings only: no GPU is touched
            assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
            torch._dynamo.config.suppress_errors = not suppress  # as train.compile: true does
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        assert torch._dynamo.config.suppress_errors == suppress
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = tf32
        torch._dynamo.config.suppress_errors = suppress


def test_a_training_stage_decides_reports_and_puts_back_its_threads(tmp_path, teacher_dir, corpus_file, monkeypatch,
                                                                     capsys):
    from biodistil.config import DistillRecipe, validate_recipe
    from biodistil.methods.task_agnostic import run_distill

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(5)  # more than this stage decides on any machine with fewer than 5 idle cores
        recipe = validate_recipe(DistillRecipe, {
            "run": {"output_dir": str(tmp_path / "run")}, "teacher": {"name_or_path": str(teacher_dir)},
            "student": {"init": "teacher_layers"}, "objective": {"terms": [{"loss": "mlm"}]},
            "data": {"train": [str(corpus_file)], "block_size": 32, "eval_fraction": 0, "cache_dir": str(tmp_path)},
            "train": {"max_steps": 2, "batch_size": 4, "eval_every": 0, "save_every": 0, "progress_bar": False,
                      "tensorboard": False, "compile": False, "threads": 1}})
        run_distill(recipe)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert "CPU threads: 1 (as asked)" in capsys.readouterr().err and after == 5
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| CPU threads | 1 throughout |" in report
