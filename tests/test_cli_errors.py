"""Every failure a clear error: a table of bad inputs and bad environments, each run through the `biodistil`
command line, each answered with one message (what, where, what to do) and no traceback."""

import errno
import json
import shutil

import pytest
from kd_fixtures import write_pair_task
from recipe_fixtures import QUIET, RECIPES

from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.training.run import output_problem


def corrupt_copy(teacher_dir, folder):
    shutil.copytree(teacher_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def without_tokenizer(teacher_dir, folder):
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(teacher_dir / name, folder / name)
    return folder


def zeroed_copy(teacher_dir, folder):
    shutil.copytree(teacher_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(bytes(weights.stat().st_size))
    return folder


# (case, how the model argument is made from (teacher_dir, tmp_path), the message expected)
BAD_MODELS = [
    ("truncated weights", lambda t, d: corrupt_copy(t, d / "m"), "corrupt or truncated"),
    ("zeroed weights", lambda t, d: zeroed_copy(t, d / "m"), "corrupt or truncated"),
    ("no tokenizer", lambda t, d: without_tokenizer(t, d / "m"), "has no tokenizer"),
    ("missing folder", lambda t, d: d / "runs" / "distil" / "model", "does not exist (a Hub id has the form"),
    ("Hub id not available", lambda t, d: "biodistil-test/no-such-model", "hf download biodistil-test/no-such-model"),
    ("a file", lambda t, d: t / "config.json", "is a file; give the model folder"),
]


def finetune_command(model, task_file, out, *extra):
    return ["finetune", str(RECIPES / "finetune-bioasq.yaml"), f"model.name_or_path={model}",
            f"task.name={task_file}", "finetune.epochs=1", *QUIET, *extra, "--out", str(out)]


def run_cli(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(("case", "make", "expected"), BAD_MODELS, ids=[c[0] for c in BAD_MODELS])
def test_a_bad_model_is_one_clear_error_in_finetune_distill_and_bench(tmp_path, capsys, teacher_dir, corpus_file,
                                                                      case, make, expected):
    model = make(teacher_dir, tmp_path)
    task_file = write_pair_task(tmp_path / "task")
    assert expected in run_cli(capsys, finetune_command(model, task_file, tmp_path / "ft"))
    assert not (tmp_path / "ft").exists(), "checked before the run folder is made"
    recipe = tmp_path / "distill.yaml"
    recipe.write_text(f"teacher: {{name_or_path: {model}}}\ndata: {{train: [{corpus_file}]}}\n"
                      "objective: {terms: [{loss: mlm}]}\ntrain: {tensorboard: false}\n")
    assert expected in run_cli(capsys, ["distill", str(recipe), "--out", str(tmp_path / "d")])
    if case not in ("no tokenizer", "a file"):  # bench reads the weights only
        assert expected in run_cli(capsys, ["bench", str(model), "--out", str(tmp_path / "b.json")])


@pytest.mark.parametrize(("out", "expected"), [
    ("{file}", "a file of that name is in the way"),
    ("{file}/run", "a part of the path is a file, not a folder"),
    ("/proc/biodistil-run", "cannot be created there"),
])
def test_an_unusable_output_folder_is_named_with_the_reason(tmp_path, capsys, teacher_dir, out, expected):
    file = tmp_path / "file.txt"
    file.write_text("x")
    task_file = write_pair_task(tmp_path / "task")
    err = run_cli(capsys, finetune_command(teacher_dir, task_file, out.format(file=file)))
    assert "Cannot write to run.output_dir" in err and expected in err


@pytest.mark.parametrize(("code", "expected"), [
    (errno.EROFS, "the file system is read-only"), (errno.ENOSPC, "the disk is full"),
    (errno.EACCES, "permission denied"), (errno.EDQUOT, "quota"),
])
def test_os_errors_say_what_to_do(code, expected):
    assert expected in output_problem(OSError(code, "x", "/some/path"))
    assert "/some/path" in output_problem(OSError(code, "x", "/some/path"))


def test_a_full_disk_during_the_run_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, teacher_dir,
                                                                              monkeypatch):
    from safetensors import SafetensorError

    def full(*_args, **_kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("biodistil.models.saving.export_model", full)
    task_file = write_pair_task(tmp_path / "task")
    err = run_cli(capsys, finetune_command(teacher_dir, task_file, tmp_path / "ft"))
    assert "the disk is full; free space or choose a folder on another disk" in err
    with pytest.raises(SafetensorError):  # the run kept its checkpoint: --resume continues it
        main(["--debug", *finetune_command(teacher_dir, task_file, tmp_path / "ft"), "--resume"])
    monkeypatch.undo()
    assert main([*finetune_command(teacher_dir, task_file, tmp_path / "ft"), "--resume"]) == 0


@pytest.mark.parametrize("split", ["train", "test"])
def test_an_empty_train_or_test_file_is_named(tmp_path, capsys, teacher_dir, split):
    task_file = write_pair_task(tmp_path / "task")
    (tmp_path / "task" / f"{split}.json").write_text("")
    err = run_cli(capsys, finetune_command(teacher_dir, task_file, tmp_path / "ft"))
    assert f"{tmp_path / 'task' / split}.json: the {split} file of task 'tiny_qa' holds no examples" in err


def test_an_empty_dev_file_is_a_warning_and_degenerate_predictions_are_flagged(tmp_path, capsys, teacher_dir):
    task_file = write_pair_task(tmp_path / "task")
    (tmp_path / "task" / "dev.json").write_text("")
    assert main(finetune_command(teacher_dir, task_file, tmp_path / "ft", "train.learning_rate=1e-9")) == 0
    err = capsys.readouterr().err
    assert "dev.json: the dev file of task 'tiny_qa' holds no examples; no model selection" in err
    metrics = json.loads((tmp_path / "ft" / "metrics.json").read_text())
    if metrics["degenerate"]:  # an untrained head may predict one class everywhere: then it is said everywhere
        assert "Degenerate test predictions" in err
        assert "degenerate:" in (tmp_path / "ft" / "report.md").read_text()


def test_overridden_labels_without_their_negative_class_are_refused(tmp_path):
    from biodistil.tasks.registry import get_task

    spec = tmp_path / "re.yaml"
    spec.write_text(json.dumps({"name": "my_re", "kind": "sequence_classification", "format": "blurb_jsonl",
                                "files": {"train": "t.json", "test": "t.json"}, "labels": ["no_relation", "causes"],
                                "metric": "micro_f1_excluding"}))
    with pytest.raises(BiodistilError, match=r"negative class \['False'\], which is not among the labels"):
        get_task(str(spec))


@pytest.mark.parametrize("command", ["evaluate --finetuned", "bench"])
def test_commands_that_run_in_one_process_refuse_several_at_once(tmp_path, capsys, teacher_dir, monkeypatch,
                                                                 command):
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = (["evaluate", "--finetuned", str(teacher_dir), "--task", "gad", "--out", str(tmp_path / "ev")]
            if command == "evaluate --finetuned" else ["bench", str(teacher_dir), "--out", str(tmp_path / "b.json")])
    assert f"{command} runs in one process, but was started as 2" in run_cli(capsys, argv)
