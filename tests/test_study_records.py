"""A study carried between machines (`kd.study_records`): packed without weights, continued from its records in a new
folder, its teacher fine-tuned again and used only when its weights are the recorded ones."""

import json
import tarfile
from pathlib import Path

import pytest

from biodistil.cli.main import main
from biodistil.config import validate_recipe
from biodistil.errors import BiodistilError
from biodistil.kd import study as study_module
from biodistil.kd.command import run_kd
from biodistil.kd.recipe import StudyRecipe
from biodistil.kd.study import run_study
from biodistil.kd.study_records import pack_study, unpack_study
from biodistil.models.loading import LEFT_OUT_WEIGHTS, load_encoder
from biodistil.teachers.store import teacher_fingerprint


def tiny_study(task_file: str, teacher_init, student, out) -> StudyRecipe:
    """A fine-tuned arm and a kd arm on the tiny yes/no task, two teacher seeds (the second one's scores only)."""
    quiet = {"batch_size": 8, "progress_bar": False, "tensorboard": False, "eval_every": 0, "save_every": 0}
    return validate_recipe(StudyRecipe, {
        "run": {"output_dir": str(out)}, "seeds": [1], "student": str(student), "teacher_init": str(teacher_init),
        "tasks": [{"name": task_file, "teacher_seeds": [1, 2]}],
        "defaults": {"finetune": {"finetune": {"epochs": 1}, "train": quiet},
                     "kd": {"kd": {"epochs": 1}, "train": quiet}},
        "arms": [{"name": "fine-tuned", "command": "finetune"}, {"name": "kd"}]})


@pytest.mark.slow
def test_a_study_continues_from_its_records_elsewhere_with_its_teacher_fine_tuned_again_to_the_bit(
        kd_models, pair_task, teacher_dir, tmp_path, capsys, monkeypatch):
    _, student = kd_models
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    run_study(tiny_study(task_file, teacher_dir, student, tmp_path / "whole"))  # the same study in one go
    before = json.loads((tmp_path / "whole" / "summary.json").read_text())

    def stopped(recipe, resume):  # the machine is taken back while the kd run trains: no summary was ever made
        run_kd(recipe, resume)
        (Path(recipe.run.output_dir) / "summary.json").unlink()
        raise KeyboardInterrupt

    parted = tmp_path / "parted"
    monkeypatch.setattr(study_module, "run_kd", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_study(tiny_study(task_file, teacher_dir, student, parted))
    monkeypatch.undo()
    assert not (parted / "summary.json").exists()
    recorded = teacher_fingerprint(parted / "tiny_qa" / "teacher" / "model")
    records = tmp_path / "records" / "study.tar.gz"
    assert main(["pack-study", str(parted), "--out", str(records)]) == 0
    assert "the records of 3 finished runs (1 unfinished left out" in capsys.readouterr().out
    with tarfile.open(records) as tar:
        names = tar.getnames()
        left_out = json.load(tar.extractfile(f"tiny_qa/teacher/model/{LEFT_OUT_WEIGHTS}"))
    assert "config.yaml" in names and "tiny_qa/fine-tuned/seed-1/test_predictions.jsonl" in names
    assert not any(name.endswith(".safetensors") or "/kd/" in name or "checkpoint" in name for name in names)
    assert left_out == {"fingerprint": recorded, "left_out": ["model.safetensors"]}
    assert sorted(name for name in names if name.startswith("tiny_qa/teacher/model/")) == [
        "tiny_qa/teacher/model/config.json", f"tiny_qa/teacher/model/{LEFT_OUT_WEIGHTS}"]

    moved = tmp_path / "elsewhere"  # another folder: the records hold no absolute path the study reads
    run_study(tiny_study(task_file, teacher_dir, student, moved), from_records=records)
    out = capsys.readouterr().out
    threads = json.loads((parted / "tiny_qa" / "teacher" / "provenance.json").read_text())["machine"]["torch_threads"]
    assert f"({threads} CPU threads, as it was)" in out and "fine-tuned again, the same weights to the bit" in out
    assert teacher_fingerprint(moved / "tiny_qa" / "teacher" / "model") == recorded
    assert (moved / "tiny_qa" / "teacher" / "model" / "model.safetensors").is_file()
    assert not (moved / "tiny_qa" / "teacher-again").exists()
    second = moved / "tiny_qa" / "teacher-seed-2" / "model"  # no remaining run learns from it: records only
    assert not (second / "model.safetensors").exists()
    with pytest.raises(BiodistilError, match="packed without its weights"):
        load_encoder(str(second))
    after = json.loads((moved / "summary.json").read_text())
    assert after["teachers"]["tiny_qa"]["test"] == before["teachers"]["tiny_qa"]["test"]
    assert after["teachers"]["tiny_qa"]["teacher_seeds"]["2"]["test"] == \
        before["teachers"]["tiny_qa"]["teacher_seeds"]["2"]["test"], "the seed-2 teacher's scores from the store"
    rows = {row["arm"]: row for row in after["rows"]}
    for row in before["rows"]:  # the intervals too: every teacher seed's test and dev predictions were in the store
        for key in ("share", "share_dev"):
            carried = rows[row["arm"]][key]
            assert carried == row[key] if "why_none" in row[key] else carried.keys() == row[key].keys(), carried
    kept = {(run["arm"], run["seed"]): run for run in after["runs"]}
    for run in before["runs"]:
        assert kept[run["arm"], run["seed"]]["test"] == pytest.approx(run["test"], abs=1e-9), run["arm"]
    parted_run = json.loads((parted / "tiny_qa" / "fine-tuned" / "seed-1" / "metrics.json").read_text())
    assert kept["fine-tuned", 1]["wall_seconds"] == parted_run["wall_seconds"], "carried, not run again"


@pytest.mark.slow
def test_a_teacher_fine_tuned_again_to_other_weights_is_refused_and_kept_apart(kd_models, pair_task, teacher_dir,
                                                                             tmp_path):
    _, student = kd_models
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    study = tmp_path / "study"
    run_study(tiny_study(task_file, teacher_dir, student, study))
    (study / "tiny_qa" / "kd" / "seed-1" / "summary.json").unlink()
    pack_study(study, tmp_path / "records.tar.gz")
    moved = tmp_path / "moved"
    unpack_study(tmp_path / "records.tar.gz", moved)
    record = moved / "tiny_qa" / "teacher" / "model" / LEFT_OUT_WEIGHTS
    record.write_text(json.dumps({"fingerprint": "0" * 64, "left_out": ["model.safetensors"]}))  # another machine's
    with pytest.raises(BiodistilError, match="not the ones the study's finished runs learned from") as refused:
        run_study(tiny_study(task_file, teacher_dir, student, moved), resume=True)
    assert "recorded 000000000000" in str(refused.value)
    assert (moved / "tiny_qa" / "teacher-again" / "model" / "model.safetensors").is_file(), "kept to inspect"
    assert not (moved / "tiny_qa" / "kd" / "seed-1" / "metrics.json").exists(), "no run learned from it"


def test_records_unpack_only_into_a_new_folder_and_only_from_a_study(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "config.yaml").write_text("seeds: [1]\n")
    packed = pack_study(tmp_path / "study", tmp_path / "study.tar.gz")
    assert packed["runs"] == 0 and packed["unfinished"] == 0
    with pytest.raises(BiodistilError, match="is not empty"):
        unpack_study(tmp_path / "study.tar.gz", taken)
    with tarfile.open(tmp_path / "other.tar.gz", "w:gz") as tar:
        tar.add(taken / "notes.txt", arcname="notes.txt")
    with pytest.raises(BiodistilError, match="expected the records of a study"):
        unpack_study(tmp_path / "other.tar.gz", tmp_path / "new")
    (tmp_path / "broken.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(BiodistilError, match="cannot read it as a study's records"):
        unpack_study(tmp_path / "broken.tar.gz", tmp_path / "new")
    with pytest.raises(BiodistilError, match="not a study folder"):
        pack_study(taken, tmp_path / "x.tar.gz")
    unpack_study(tmp_path / "study.tar.gz", tmp_path / "new")
    assert (tmp_path / "new" / "config.yaml").read_text() == "seeds: [1]\n"
