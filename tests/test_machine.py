"""The machine record (issue 32): made once per process, the one source of the machine facts that provenance,
studies, reports and the benches write down."""

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
