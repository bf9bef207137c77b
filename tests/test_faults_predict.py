"""Issue 54: `biodistil predict` and `Predictor` faults as a user meets them: an output that is one of the inputs,
option values out of range, a cut-short int8 graph, damaged weights, an export folder without export.json, a non-text
input. Each is a clear error naming the file or option and what to do, before anything is read or written."""

import shutil

import pytest
from kd_fixtures import save_teacher, write_token_task

from biodistil import Predictor
from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.tasks.registry import get_task

pytestmark = pytest.mark.slow  # whole commands: their checks are of files and messages


@pytest.fixture(scope="module")
def exported(tmp_path_factory, teacher_dir):
    """A token classifier (a random head on the tiny teacher) and its ONNX export with an int8 graph."""
    root = tmp_path_factory.mktemp("faults-predict")
    task = get_task(str(write_token_task(root / "task", sizes={"train": 8, "test": 8})))
    model = save_teacher(teacher_dir, task, root / "ner-model", seed=3)
    assert main(["export", str(model), "--out", str(root / "onnx"), "--int8"]) == 0
    return model, root / "onnx"


@pytest.fixture()
def project(exported, tmp_path, monkeypatch):
    """A working folder with the model, its export and notes.txt, as a user has them."""
    model, onnx = exported
    shutil.copytree(model, tmp_path / "model")
    shutil.copytree(onnx, tmp_path / "onnx")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes.txt").write_text("protein kinase binding\nreceptor gene\n", encoding="utf-8")
    (tmp_path / "notes" / "a.txt").write_text("cell tumour\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("out", ["notes.txt", "./notes.txt", "notes/../notes.txt", "notes/a.txt", "notes/new.txt"])
def test_an_output_that_is_an_input_is_refused_before_anything_is_read(project, capsys, out):
    inputs = ["notes.txt"] if "notes/" not in out or ".." in out else ["notes"]
    before = {path: path.read_bytes() for path in project.rglob("*.txt")}
    assert main(["predict", "model", *inputs, "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}" in err and "predictions.jsonl" in err and "Traceback" not in err
    assert {path: path.read_bytes() for path in project.rglob("*.txt")} == before, "no input replaced or added"


@pytest.mark.parametrize("option", ["--batch-size", "--max-length", "--threads"])
def test_option_values_out_of_range_are_refused_at_parse_time(project, capsys, option):
    with pytest.raises(SystemExit) as stopped:
        main(["predict", "model", "notes.txt", "--out", "p.jsonl", option, "0"])
    assert stopped.value.code == 2
    assert f"argument {option}: expected a whole number of 1 or more, got '0'" in capsys.readouterr().err
    with pytest.raises(BiodistilError, match="expected whole numbers of 1 or more"):
        Predictor("model", batch_size=0)
    with pytest.raises(BiodistilError, match="expected whole numbers of 1 or more"):
        Predictor("model", max_length=0)


@pytest.mark.parametrize("command", ["predict", "serve"])
def test_a_padding_share_outside_0_to_1_is_refused(project, capsys, command):
    paths = ["model", "notes.txt", "--out", "p.jsonl"] if command == "predict" else ["model"]
    with pytest.raises(SystemExit) as stopped:
        main([command, *paths, "--max-padding", "1.5"])
    assert stopped.value.code == 2
    assert "argument --max-padding: expected a number from 0 to 1, got '1.5'" in capsys.readouterr().err
    with pytest.raises(BiodistilError, match=r"max_padding 1\.5: expected a share from 0 to 1"):
        Predictor("model", max_padding=1.5)


def test_a_cut_short_int8_graph_is_named_with_what_to_do(project, capsys):
    graph = project / "onnx" / "model.int8.onnx"
    graph.write_bytes(graph.read_bytes()[:graph.stat().st_size // 2])
    assert main(["predict", "onnx", "notes.txt", "--out", "p.jsonl", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "onnx/model.int8.onnx: ONNX Runtime cannot load this graph" in err and "export the model again" in err
    assert "Traceback" not in err and not (project / "p.jsonl").exists()


def test_damaged_weights_are_named_by_their_path(project, capsys):
    weights = project / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["predict", "model", "notes.txt", "--out", "p.jsonl", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "model/model.safetensors: the weights file is corrupt or truncated" in err and "export or download" in err
    assert main(["export", "model", "--out", "onnx2"]) == 2
    assert "model/model.safetensors: the weights file is corrupt or truncated" in capsys.readouterr().err


def test_an_export_folder_without_its_export_json_is_named_as_one(project, capsys):
    (project / "onnx" / "export.json").unlink()
    assert main(["predict", "onnx", "notes.txt", "--out", "p.jsonl", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "onnx holds ONNX graphs (model.int8.onnx, model.onnx) but no export.json" in err
    assert "biodistil export MODEL --out onnx" in err and "without weights" not in err


def test_a_non_text_input_to_predictor_is_named_by_its_position(project):
    predictor = Predictor("model")
    with pytest.raises(TypeError, match=r"input 1: expected a text \(str\), a pair of texts .* got int 42"):
        predictor(["breast cancer", 42])
