"""Provenance in every run folder: code, libraries, machine, seed, what each model is and a fingerprint of each data
file (issue 22)."""

import json

import torch

from biodistil.config import validate_recipe
from biodistil.io import file_sha256
from biodistil.kd.recipe import KDRecipe
from biodistil.training import provenance as module
from biodistil.training.run import RunFolder


def test_a_run_folder_records_what_the_run_was_made_from(tmp_path, kd_models, corpus_file):
    from kd_fixtures import write_pair_task

    teacher, _ = kd_models
    pair_task = write_pair_task(tmp_path / "task")
    recipe = validate_recipe(KDRecipe, {
        "run": {"output_dir": str(tmp_path / "run"), "seed": 7}, "teacher": {"name_or_path": str(teacher)},
        "student": {"name_or_path": "minilm-l6"}, "task": {"name": str(pair_task)},
        "transfer": {"source": {"kind": "text", "path": str(corpus_file)}}})
    RunFolder(recipe.run.output_dir, recipe)
    record = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert record["seed"] == 7 and record["libraries"]["torch"] == torch.__version__
    assert len(record["biodistil"]["git_commit"]) == 40, "run from a checkout: its commit"
    weights = teacher / "model.safetensors"
    assert record["models"]["teacher.name_or_path"]["weights"] == {"model.safetensors": file_sha256(weights)}
    assert record["models"]["student.name_or_path"]["embedded"] == "minilm-l6"
    assert record["models"]["student.name_or_path"]["sha256"].startswith("53aa5117")
    task_files = {entry["path"]: entry["sha256"] for entry in record["data"]["task.name"]}
    train = next(path for path in task_files if path.endswith("train.json"))
    assert task_files[train] == file_sha256(train) and len(task_files) == 3, "train, dev and test"
    assert record["data"]["transfer.source.path"][0]["sha256"] == file_sha256(corpus_file)
    assert record["machine"]["torch_threads"] == torch.get_num_threads()


def test_a_large_file_is_fingerprinted_by_its_size_and_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "FULL_HASH_BYTES", 1000)
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * (3 << 20))
    first = module.file_fingerprint(big)
    assert set(first) == {"path", "bytes", "sha256_first_last_mib"} and first["bytes"] == 3 << 20
    big.write_bytes(b"a" * (3 << 20) + b"b")
    assert module.file_fingerprint(big)["sha256_first_last_mib"] != first["sha256_first_last_mib"]


def test_a_model_folder_above_the_full_hash_size_is_named_by_its_full_sha256(tmp_path, teacher_dir, monkeypatch):
    """A BERT-base teacher's 440 MB of weights are above FULL_HASH_BYTES (a data file's cut-off): the model is still
    recorded by the full sha256 of its weights (this raised KeyError on the first GPU check)."""
    monkeypatch.setattr(module, "FULL_HASH_BYTES", 1000)
    weights = teacher_dir / "model.safetensors"
    assert weights.stat().st_size > 1000
    assert module.model_identity(str(teacher_dir))["weights"] == {"model.safetensors": file_sha256(weights)}
