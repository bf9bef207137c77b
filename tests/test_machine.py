"""The machine record (issue 32): made once per process, the one source of the machine facts that provenance,
studies, reports and the benches write down."""

import os

import torch

from biodistil.config import PretrainRecipe, validate_recipe
from biodistil.training.machine import SPEED_FLAGS, cpu_bf16_fast, cpu_line, describe_machine, this_machine
from biodistil.training.provenance import provenance


def test_the_machine_record_is_made_once_and_is_what_provenance_and_benches_write(tmp_path, corpus_file,
                                                                                 teacher_dir):
    record = this_machine()
    assert this_machine() is record, "computed once per process"
    assert set(record.flags or ()) <= set(SPEED_FLAGS) and record.usable_cores >= 1
    assert (record.bf16_native, record.bf16_why) == cpu_bf16_fast()
    described = describe_machine()
    assert {key: described[key] for key in ("cpu", "usable_cores", "bf16_native", "cpp_compiler", "torch")} == {
        "cpu": record.cpu, "usable_cores": record.usable_cores, "bf16_native": record.bf16_native,
        "cpp_compiler": record.cpp_compiler, "torch": record.torch}
    assert described["torch_threads"] == torch.get_num_threads(), "the threads in use when it is written"
    assert cpu_line().startswith(record.cpu) and all(flag in cpu_line() for flag in record.flags or ())
    recipe = validate_recipe(PretrainRecipe, {
        "run": {"output_dir": str(tmp_path / "run")},
        "model": {"init": "scratch", "tokenizer_name_or_path": str(teacher_dir),
                  "architecture": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32}},
        "data": {"train": [str(corpus_file)]}})
    assert provenance(recipe)["machine"] == described


def test_loader_workers_are_none_on_a_cpu_and_some_pinned_and_prefetched_on_cuda_by_default():
    from biodistil.config import TrainConfig
    from biodistil.training.machine import CUDA_LOADER_WORKERS, PREFETCHED_BATCHES, loader_plan

    assert TrainConfig().num_workers == "auto", "the default decides by device"
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    plan = loader_plan("auto", cpu, cores=16)
    assert (plan.workers, plan.pin, plan.prefetch) == (0, False, None), "a CPU keeps collation in its process"
    assert plan.note == "auto: in the training process on a CPU"
    plan = loader_plan("auto", cuda, cores=16)
    assert (plan.workers, plan.pin, plan.prefetch) == (CUDA_LOADER_WORKERS, True, PREFETCHED_BATCHES) == (4, True, 4)
    assert "pinned" in plan.note and "4 batches prefetched each" in plan.note
    assert loader_plan("auto", cuda, cores=3).workers == 2, "one core is the training's own"
    assert loader_plan("auto", cuda, processes=8, cores=16).workers == 1, "the cores shared by the processes"
    plan = loader_plan("auto", cuda, cores=1)
    assert (plan.workers, plan.pin, plan.prefetch) == (0, True, None), "no spare core: pinned, in the process"
    plan = loader_plan(2, cpu, cores=16)
    assert (plan.workers, plan.pin, plan.prefetch) == (2, False, 4) and plan.note.startswith("2 (as asked)")
    assert loader_plan(0, cuda, cores=16).workers == 0, "a number is taken as asked on CUDA too"


def test_onednn_caches_are_bounded_before_a_command_or_a_stage_and_a_users_setting_is_kept(monkeypatch):
    """oneDNN reads its cache capacity once, at its first primitive: the CLI sets it before the command runs, the
    engine before a stage run from Python (issue 52: the caches grew a bf16 run's memory every step on AMX)."""
    from biodistil.cli.main import main
    from biodistil.training.engine import make_accelerator
    from biodistil.training.onednn import CACHE_CAPACITY, CACHE_SETTINGS, bound_caches

    assert CACHE_SETTINGS == ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY") and CACHE_CAPACITY == 16
    for name in CACHE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert main(["models", "list"]) == 0
    assert {name: os.environ.get(name) for name in CACHE_SETTINGS} == dict.fromkeys(CACHE_SETTINGS, "16")
    assert describe_machine()["onednn_caches"] == dict.fromkeys(CACHE_SETTINGS, "16"), "what a run records"

    for name in CACHE_SETTINGS:
        monkeypatch.delenv(name)
    make_accelerator("no", device="cpu")
    assert {name: os.environ.get(name) for name in CACHE_SETTINGS} == dict.fromkeys(CACHE_SETTINGS, "16")

    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")
    assert bound_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256", "LRU_CACHE_CAPACITY": "16"}, "the user's"
