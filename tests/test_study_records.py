"""A study carried between machines (`kd.study_records`): packed without weights, continued from its records in a new
folder, its teacher fine-tuned again and used only when its weights are the recorded ones."""

import gzip
import json
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from biodistil.cli.main import main
from biodistil.config import validate_recipe
from biodistil.errors import BiodistilError
from biodistil.kd import study as study_module
from biodistil.kd import study_records
from biodistil.kd.command import run_kd
from biodistil.kd.recipe import StudyRecipe
from biodistil.kd.study import run_study
from biodistil.kd.study_records import pack_study, unpack_study
from biodistil.models.loading import LEFT_OUT_WEIGHTS, TOKENIZER_FILES, WeightsLeftOut, load_encoder
from biodistil.teachers.store import teacher_fingerprint
from biodistil.training.machine import cpu_line


def tiny_study(task_file: str, teacher_init, student, out) -> StudyRecipe:
    """A fine-tuned arm and a kd arm on the tiny yes/no task, two teacher seeds (the second one's scores only)."""
    quiet = {"batch_size": 8, "progress_bar": False, "tensorboard": False, "eval_every": 0, "save_every": 0}
    return validate_recipe(StudyRecipe, {
        "run": {"output_dir": str(out)}, "seeds": [1], "resamples": 200, "student": str(student),
        "teacher_init": str(teacher_init),
        "tasks": [{"name": task_file, "teacher_seeds": [1, 2]}],
        "defaults": {"finetune": {"finetune": {"epochs": 1}, "train": quiet},
                     "kd": {"kd": {"epochs": 1}, "train": quiet}},
        "arms": [{"name": "fine-tuned", "command": "finetune"}, {"name": "kd"}]})


@dataclass(frozen=True)
class Carried:
    """A tiny study run in one go, the same study stopped while its kd run trained (no summary ever made), and the
    records packed from the stopped one."""

    recipe: Callable[[Path], StudyRecipe]
    before: dict
    parted: Path
    records: Path
    fingerprint: str


@pytest.fixture(scope="module")
def carried(kd_models, pair_task, teacher_dir, tmp_path_factory) -> Carried:
    root = tmp_path_factory.mktemp("carried")
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    recipe = partial(tiny_study, task_file, teacher_dir, kd_models[1])
    run_study(recipe(root / "whole"))

    def stopped(kd_recipe, resume):  # the machine is taken back while the kd run trains
        run_kd(kd_recipe, resume)
        (Path(kd_recipe.run.output_dir) / "summary.json").unlink()
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(study_module, "run_kd", stopped)
        run_study(recipe(root / "parted"))
    assert not (root / "parted" / "summary.json").exists()
    records = root / "records" / "study.tar.gz"
    packed = pack_study(root / "parted", records)
    assert {key: value for key, value in packed.items() if key != "bytes"} == {
        "runs": 3, "unfinished": 1, "tiny_qa/teacher": 1, "tiny_qa/teacher-seed-2": 1, "tiny_qa/fine-tuned": 1}
    return Carried(recipe, json.loads((root / "whole" / "summary.json").read_text()), root / "parted", records,
                   teacher_fingerprint(root / "parted" / "tiny_qa" / "teacher" / "model"))


def test_the_records_hold_what_the_study_reads_and_no_weights(carried):
    with tarfile.open(carried.records) as tar:
        names = tar.getnames()
        left_out = json.load(tar.extractfile(f"tiny_qa/teacher/model/{LEFT_OUT_WEIGHTS}"))
    assert "config.yaml" in names and "tiny_qa/fine-tuned/seed-1/test_predictions.jsonl" in names
    assert not any(name.endswith(".safetensors") or "/kd/" in name or "checkpoint" in name for name in names)
    assert left_out == {"fingerprint": carried.fingerprint, "left_out": ["model.safetensors"]}
    teacher = sorted(name.rsplit("/", 1)[1] for name in names if name.startswith("tiny_qa/teacher/model/"))
    assert teacher == sorted(["config.json", LEFT_OUT_WEIGHTS, *(
        path.name for path in (carried.parted / "tiny_qa" / "teacher" / "model").iterdir()
        if path.name in TOKENIZER_FILES)]), "a teacher's tokenizer, read beside its stored outputs"
    assert [name for name in names if name.startswith("tiny_qa/fine-tuned/seed-1/model/")] == [
        "tiny_qa/fine-tuned/seed-1/model/config.json", f"tiny_qa/fine-tuned/seed-1/model/{LEFT_OUT_WEIGHTS}"]
    tables = [name for name in names if name.startswith("cache/task-") and name.endswith(".arrow")]
    assert tables, "the teacher's outputs over the kd run's transfer set, stored"


def test_records_as_a_folder_hold_the_same_files_and_continue_a_study_alike(carried, tmp_path, monkeypatch):
    folder = tmp_path / "records"  # the form a git repository keeps best: unchanged files are not stored again
    monkeypatch.setattr(study_records, "GZIP_OVER", 4096)  # the tiny study's files are small
    packed = pack_study(carried.parted, folder)
    with tarfile.open(carried.records) as tar:
        archived = {member.name: tar.extractfile(member).read() for member in tar.getmembers()}
    files = [path for path in folder.rglob("*") if path.is_file()]
    assert packed["bytes"] == sum(path.stat().st_size for path in files)
    kept = {path.relative_to(folder).as_posix().removesuffix(".gz"): gzip.decompress(path.read_bytes())
            if path.suffix == ".gz" else path.read_bytes() for path in files}
    assert kept == archived
    zipped = {path.name for path in files if path.suffix == ".gz"}
    assert zipped and all(len(archived[name.removesuffix(".gz")]) > 4096 for name in
                          (path.relative_to(folder).as_posix() for path in files if path.suffix == ".gz"))
    before = {path: path.read_bytes() for path in files}
    assert pack_study(carried.parted, folder)["runs"] == 3, "written again in place"
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before, "byte for byte"
    unpack_study(folder, tmp_path / "study")
    assert {path.relative_to(tmp_path / "study").as_posix() for path in (tmp_path / "study").rglob("*")
            if path.is_file()} == set(kept)


def continued_summary(carried: Carried, folder: Path) -> dict:
    """The continued study's summary, checked against the one run in one go: the same rows and teacher scores."""
    after = json.loads((folder / "summary.json").read_text())
    before = carried.before
    assert sum(after["machines"].values()) == len(after["runs"]), "each run's CPU, from its provenance"
    assert after["teachers"]["tiny_qa"]["test"] == before["teachers"]["tiny_qa"]["test"]
    assert after["teachers"]["tiny_qa"]["teacher_seeds"]["2"]["test"] == \
        before["teachers"]["tiny_qa"]["teacher_seeds"]["2"]["test"], "the seed-2 teacher's scores from the store"
    rows = {row["arm"]: row for row in after["rows"]}
    for row in before["rows"]:  # the intervals too: every teacher seed's test and dev predictions were in the store
        for key in ("share", "share_dev"):
            carried_row = rows[row["arm"]][key]
            assert carried_row == row[key] if "why_none" in row[key] else carried_row.keys() == row[key].keys()
    kept = {(run["arm"], run["seed"]): run for run in after["runs"]}
    for run in before["runs"]:
        assert kept[run["arm"], run["seed"]]["test"] == pytest.approx(run["test"], abs=1e-9), run["arm"]
    parted = json.loads((carried.parted / "tiny_qa" / "fine-tuned" / "seed-1" / "metrics.json").read_text())
    assert kept["fine-tuned", 1]["wall_seconds"] == parted["wall_seconds"], "carried, not run again"
    return after


@pytest.mark.slow
def test_a_study_continues_elsewhere_from_its_records_and_its_stored_teacher_outputs(carried, tmp_path, capsys):
    moved = tmp_path / "elsewhere"  # another folder: the records hold no absolute path the study reads
    run_study(carried.recipe(moved), from_records=carried.records)
    assert "fine-tuned again" not in capsys.readouterr().out, "the kd run read the stored outputs"
    continued_summary(carried, moved)
    teacher = moved / "tiny_qa" / "teacher" / "model"
    assert not (teacher / "model.safetensors").exists()
    with pytest.raises(WeightsLeftOut, match="packed without its weights"):
        load_encoder(str(teacher))


@pytest.mark.slow
def test_a_teacher_whose_outputs_are_missing_is_fine_tuned_again_to_the_bit(carried, tmp_path, capsys):
    moved = tmp_path / "moved"
    unpack_study(carried.records, moved)
    for entry in (moved / "cache").glob("task-*"):  # records of a study whose kd runs had not built them yet
        shutil.rmtree(entry)
    provenance = moved / "tiny_qa" / "fine-tuned" / "seed-1" / "provenance.json"
    record = json.loads(provenance.read_text())
    record["machine"].update(cpu="Other CPU", flags=["avx2", "amx_bf16"])  # the carried run ran on another machine
    provenance.write_text(json.dumps(record))
    run_study(carried.recipe(moved), resume=True)
    summary = json.loads((moved / "summary.json").read_text())
    assert summary["machines"] == {cpu_line(): 1, "Other CPU; flags: avx2 amx_bf16": 1}, "the kd run ran here"
    assert "Its runs ran on several machines: 1 on " in (moved / "report.md").read_text()
    out = capsys.readouterr().out
    trained = json.loads((carried.parted / "tiny_qa" / "teacher" / "metrics.json").read_text())["train"]["threads"]
    threads = int(trained.split()[0])  # "2 throughout", "1 (OMP_NUM_THREADS)": the count the teacher trained with
    assert f"({threads} CPU threads, as it was)" in out and "fine-tuned again, the same weights to the bit" in out
    assert teacher_fingerprint(moved / "tiny_qa" / "teacher" / "model") == carried.fingerprint
    assert (moved / "tiny_qa" / "teacher" / "model" / "model.safetensors").is_file()
    assert not (moved / "tiny_qa" / "teacher-again").exists()
    assert not (moved / "tiny_qa" / "teacher-seed-2" / "model" / "model.safetensors").exists(), "no run reads it"
    continued_summary(carried, moved)


@pytest.mark.slow
def test_a_teacher_fine_tuned_again_to_other_weights_is_refused_and_kept_apart(carried, tmp_path):
    moved = tmp_path / "moved"
    unpack_study(carried.records, moved)
    record = moved / "tiny_qa" / "teacher" / "model" / LEFT_OUT_WEIGHTS
    record.write_text(json.dumps({"fingerprint": "0" * 64, "left_out": ["model.safetensors"]}))  # another machine's
    with pytest.raises(BiodistilError, match="not the ones the study's finished runs learned from") as refused:
        run_study(carried.recipe(moved), resume=True)
    assert "recorded 000000000000" in str(refused.value)
    assert (moved / "tiny_qa" / "teacher-again" / "model" / "model.safetensors").is_file(), "kept to inspect"
    assert not (moved / "tiny_qa" / "kd" / "seed-1" / "metrics.json").exists(), "no run learned from it"


def test_records_unpack_only_into_a_new_folder_and_only_from_a_study(tmp_path, capsys, monkeypatch):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "config.yaml").write_text("seeds: [1]\n")
    building = tmp_path / "study" / "cache" / ".tmp-task-1-host-1-x"  # an entry being written as the study runs
    building.mkdir(parents=True)
    (building / "outputs.arrow").write_bytes(b"half")
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    assert main(["pack-study", "study", "--out", "study.tar.gz"]) == 0
    assert "study.tar.gz: the records of 0 finished run(s) (0 unfinished left out" in capsys.readouterr().out
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
    with pytest.raises(BiodistilError, match="this folder has none"):
        unpack_study(taken, tmp_path / "new")
    (tmp_path / "study" / "elsewhere").symlink_to(taken)
    pack_study(tmp_path / "study", tmp_path / "plain")
    (tmp_path / "plain" / "link").symlink_to("/etc/passwd")  # a folder of records someone edited
    with pytest.raises(BiodistilError, match="a link among a study's records"):
        unpack_study(tmp_path / "plain", tmp_path / "linked")
    unpack_study(tmp_path / "study.tar.gz", tmp_path / "new")
    assert (tmp_path / "new" / "config.yaml").read_text() == "seeds: [1]\n"
    assert [path.name for path in (tmp_path / "new").rglob("*")] == ["config.yaml"]
