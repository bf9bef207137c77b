"""The task registry: built-in definitions, user YAML tasks, split loading (synthetic and real data)."""

import json
import os
from pathlib import Path

import pytest

from biodistil.data.formats import TextExample, TokenExample
from biodistil.data.paths import resolve_data_root
from biodistil.errors import BiodistilError
from biodistil.tasks import registry as tasks_module
from biodistil.tasks.metrics import METRICS
from biodistil.tasks.registry import TaskSpec, get_task, list_tasks


def _data_root() -> Path:
    try:
        return resolve_data_root(os.environ.get("BIODISTIL_DATA"))
    except BiodistilError:
        return Path("/nonexistent")


SHARED_DATA = _data_root()  # $BIODISTIL_DATA, else ../shared/data beside the repository
needs_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="shared data folder not present")

EXPECTED_TASKS = {
    "ncbi_disease", "bc5cdr_chem", "bc5cdr_disease", "bc2gm", "jnlpba", "linnaeus", "species800",
    "gad", "gad_cv", "euadr_cv", "chemprot", "ddi", "hoc", "pubmedqa", "bioasq", "pico",
    "bc5cdr_pubtator", "dimb_brat",
}


# ------------------------------------------------------------------------------------------ built-ins


def test_every_builtin_task_validates():
    assert set(list_tasks()) == EXPECTED_TASKS
    for name in list_tasks():
        task = get_task(name)
        assert task.name == name
        assert task.metric in METRICS and task.headline_key
        assert set(task.files) <= {"train", "dev", "test"} and "test" in task.files
        assert len(task.label_to_id) == task.num_labels


def test_builtin_details():
    ner = get_task("ncbi_disease")
    assert ner.label_to_id == {"O": 0, "B": 1, "I": 2}
    assert ner.b_to_i == {1: 2}
    assert ner.truncation == "split" and ner.label_policy == "first"
    assert get_task("gad").metric_options == {"positive": "1"}
    assert get_task("chemprot").metric_options == {"negative_labels": ["False"]}
    assert get_task("gad_cv").folds == list(range(1, 11))
    assert get_task("hoc").num_labels == 10 and get_task("hoc").headline_key == "example_f1"
    assert get_task("pubmedqa").labels == ["yes", "no", "maybe"]  # strings, not YAML booleans


def test_get_task_returns_independent_copies():
    task = get_task("gad")
    task.labels.append("2")
    assert get_task("gad").labels == ["0", "1"]


def test_unknown_task_lists_known_ones():
    with pytest.raises(BiodistilError, match=r"Unknown task 'ncbi'.*ncbi_disease"):
        get_task("ncbi")
    with pytest.raises(BiodistilError, match="not found"):
        get_task("/nonexistent/task.yaml")


# ------------------------------------------------------------------------------------- user YAML tasks


def write_ner_files(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.tsv").write_text("Renal\tB\nfailure\tI\n.\tO\n\nNo\tO\n.\tO\n\n")
    (folder / "test.tsv").write_text("Liver\tB\ninjury\tI\n")


def test_user_yaml_full_definition(tmp_path):
    write_ner_files(tmp_path / "data" / "ner" / "mine")
    spec = tmp_path / "mine.yaml"
    spec.write_text(
        "kind: token_classification\nformat: biobert_ner_tsv\n"
        "files: {train: ner/mine/train.tsv, devel: ner/mine/test.tsv, test: ner/mine/test.tsv}\n"
        "labels: [O, B, I]\nmetric: entity_f1\nhyperparameters: {epochs: 2}\n"
    )
    task = get_task(str(spec))
    assert task.name == "mine" and task.hyperparameters.epochs == 2
    assert set(task.files) == {"train", "dev", "test"}  # "devel" is accepted for dev
    assert task.is_available(tmp_path / "data")
    train = task.load_split("train", tmp_path / "data")
    assert train == [TokenExample("0", ["Renal", "failure", "."], ["B", "I", "O"]),
                     TokenExample("1", ["No", "."], ["O", "O"])]
    gold = task.example_targets(task.load_split("dev", tmp_path / "data"))
    assert task.compute_metrics(gold, gold)[task.headline_key] == 1.0


def test_user_yaml_extends_builtin_with_absolute_paths(tmp_path):
    write_ner_files(tmp_path / "elsewhere")
    spec = tmp_path / "my_disease.yaml"
    spec.write_text(
        f"extends: ncbi_disease\nname: my_disease\nhyperparameters: {{learning_rate: 1.0e-4}}\n"
        f"files: {{train: {tmp_path}/elsewhere/train.tsv, test: {tmp_path}/elsewhere/test.tsv}}\n"
    )
    task = get_task(spec)
    assert task.name == "my_disease" and task.metric == "entity_f1"
    assert task.hyperparameters.learning_rate == 1e-4 and task.hyperparameters.epochs == 20  # merged
    assert task.is_available(tmp_path / "unused-root")
    assert len(task.load_split("test", tmp_path / "unused-root")) == 1


@pytest.mark.parametrize(("body", "expected"), [
    ("kind: token_classification\nformat: blurb_jsonl\nfiles: {test: a}\nlabels: [O]\nmetric: entity_f1\n",
     "does not suit"),
    ("kind: sequence_classification\nformat: blurb_jsonl\nfiles: {test: a}\nlabels: [yes, no]\n"
     "metric: binary_prf\n",
     "quote"),
    ("kind: sequence_classification\nformat: blurb_jsonl\nfiles: {test: a}\nlabels: ['0']\nmetric: bleu\n",
     "metric 'bleu' is unknown"),
    ("kind: sequence_classification\nformat: biobert_re_tsv\nfiles: {test: 'x/{fold}/t.tsv'}\nlabels: ['0']\n"
     "metric: binary_prf\n", "set cv_folds"),
    ("extends: gad\nmetric_options: {negative_labels: ['0']}\n", "metric_options"),
    ("extends: gad\ncolour: red\n", "colour"),
    ("extends: gad\nmetric: entity_f1\n", "scores tag sequences, not a sequence_classification"),
    ("extends: gad\nfiles: [oops\n", r"bad.yaml:\d+: invalid YAML"),
])
def test_invalid_user_yaml_names_the_file_and_problem(tmp_path, body, expected):
    spec = tmp_path / "bad.yaml"
    spec.write_text(body)
    with pytest.raises(BiodistilError, match=expected) as info:
        get_task(spec)
    assert str(spec) in str(info.value)


# ------------------------------------------------------------------------------------- loading details


def test_cross_validation_folds(tmp_path):
    for fold in (1, 2):
        folder = tmp_path / "re" / "cv" / str(fold)
        folder.mkdir(parents=True)
        (folder / "train.tsv").write_text(f"fold {fold} a\t1\nfold {fold} b\t0\n")
        (folder / "test.tsv").write_text(f"index\tsentence\tlabel\n0\tfold {fold} c\t1\n")
    task = TaskSpec(name="cv", kind="sequence_classification", format="biobert_re_tsv",
                    files={"train": "re/cv/{fold}/train.tsv", "test": "re/cv/{fold}/test.tsv"}, cv_folds=2,
                    labels=["0", "1"], metric="binary_prf", metric_options={"positive": "1"})
    assert task.is_available(tmp_path)
    assert task.load_split("test", tmp_path, fold=2) == [TextExample("0", "fold 2 c", None, "1")]
    with pytest.raises(BiodistilError, match=r"needs a fold in 1\.\.2"):
        task.load_split("train", tmp_path)
    with pytest.raises(BiodistilError, match="no split 'dev'"):
        task.load_split("dev", tmp_path, fold=1)
    (tmp_path / "re" / "cv" / "2" / "test.tsv").unlink()
    assert not task.is_available(tmp_path)
    assert task.missing_files(tmp_path) == [str(tmp_path / "re/cv/2/test.tsv")]


def test_unknown_label_in_file_is_reported(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps({"id": "s9", "sentence": "x", "label": "2"}) + "\n")
    task = get_task("gad").model_copy(update={"files": {"train": str(tmp_path / "train.json")}})
    with pytest.raises(BiodistilError, match=r"train.json: example 0 \(id s9\): unknown label '2'"):
        task.load_split("train")


def test_missing_file_without_hub_names_the_file(tmp_path):
    with pytest.raises(BiodistilError, match=r"re/gad/train\.json"):
        get_task("gad").load_split("train", tmp_path)


def test_hub_fallback_offline_gives_clear_error(tmp_path, monkeypatch):
    def offline(*_args, **_kwargs):
        raise ConnectionError("Couldn't reach 'bigbio/blurb' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(tasks_module, "_load_hub_rows", offline)
    with pytest.raises(BiodistilError, match="no split 'train2'"):
        get_task("ncbi_disease").load_split("train2", tmp_path)  # a bad split never goes to the hub
    with pytest.raises(BiodistilError) as info:
        get_task("ncbi_disease").load_split("train", tmp_path)
    message = str(info.value)
    assert "ner/ncbi_disease/train.tsv" in message
    assert "hub cannot be reached" in message and "local path" in message


def test_hub_rows_become_examples(tmp_path, monkeypatch):
    rows = [{"id": "0", "tokens": ["Renal", "failure"], "ner_tags": [1, 2]}]
    monkeypatch.setattr(tasks_module, "_load_hub_rows", lambda dataset, config, split: rows)
    assert get_task("ncbi_disease").load_split("dev", tmp_path) == [
        TokenExample("0", ["Renal", "failure"], ["B", "I"])]


# ------------------------------------------------------------------------------------ real shared data


@needs_shared_data
def test_real_ncbi_disease_train():
    task = get_task("ncbi_disease")
    assert task.is_available(SHARED_DATA)
    train = task.load_split("train", SHARED_DATA)
    assert len(train) == 5424
    assert train[0].tokens[:3] == ["Identification", "of", "APC2"]


@needs_shared_data
def test_real_gad_blurb_and_cv_fold_1():
    assert len(get_task("gad").load_split("train", SHARED_DATA)) == 4261
    cv = get_task("gad_cv")
    assert cv.is_available(SHARED_DATA)
    assert len(cv.load_split("train", SHARED_DATA, fold=1)) == 4796
    assert len(cv.load_split("test", SHARED_DATA, fold=1)) == 534


@needs_shared_data
def test_absent_builtin_tasks_are_reported_unavailable():
    euadr = get_task("euadr_cv")
    if not (SHARED_DATA / "re" / "euadr_cv").exists():
        assert not euadr.is_available(SHARED_DATA)
        assert str(SHARED_DATA / "re/euadr_cv/1/train.tsv") in euadr.missing_files(SHARED_DATA)
