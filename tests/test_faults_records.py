"""Issue 38: damaged and moved records, as a user meets them: a finished run's damaged summary.json, binary bytes in
config.yaml or metrics.jsonl, a config.yaml cut short, a relative model folder that does not exist, a run folder moved
to a new place (paths compared by their new place), and a config.yaml written before a setting existed. The copied
study (case 1) is in tests/test_cli_paths.py; many damaged cache shards in tests/test_teachers_masked_lm_cache.py."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.io import read_json, read_text
from biodistil.training.run import moved_paths, recipe_differences

BINARY = bytes(range(256)) * 2  # what `head -c 300 /bin/ls` leaves: bytes that are not UTF-8 text

DISTILL = """
run: {output_dir: runs/x, seed: 1}
teacher: {name_or_path: models/teacher, dtype: float32}
student: {init: teacher_layers, layers: [0, 2]}
data: {train: [data/corpus.txt], block_size: 32, eval_fraction: 0, cache_dir: cache}
objective: {terms: [{loss: mlm}, {loss: logit_kl, positions: masked}, {loss: hidden_cosine}]}
train: {max_steps: 4, batch_size: 8, warmup_steps: 0, eval_every: 0, save_every: 2, log_every: 1,
        progress_bar: false, tensorboard: false, compile: false}
"""


@pytest.fixture()
def project(tmp_path, teacher_dir, corpus_file, monkeypatch) -> Path:
    """A user's project folder (models/, data/, distill.yaml) as the working folder."""
    shutil.copytree(teacher_dir, tmp_path / "models" / "teacher")
    (tmp_path / "data").mkdir()
    shutil.copy(corpus_file, tmp_path / "data" / "corpus.txt")
    (tmp_path / "distill.yaml").write_text(DISTILL, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def distill(*extra: str) -> int:
    return main(["distill", "distill.yaml", *extra])


def test_resume_of_a_finished_run_with_a_damaged_summary_finishes_it_again(project, capsys):
    """Case 2: the card used to read the damaged summary.json (JSONDecodeError, every time). The card is now built
    from the run's record in hand, the damaged summary counts as unfinished, and the new one is written last."""
    assert distill() == 0
    (project / "runs/x/summary.json").write_text('{"result": {"steps": 4', encoding="utf-8")
    assert distill("--resume") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "summary.json: damaged record" in out and "the run counts as unfinished" in out
    summary = json.loads((project / "runs/x/summary.json").read_text())
    assert summary["finished"] and summary["result"]["steps"] == 4
    card = (project / "runs/x/model/README.md").read_text()
    assert card.startswith("---\n") and "distill" in card


def test_binary_bytes_in_config_yaml_are_an_error_naming_the_file_and_what_to_do(project, capsys):
    """Case 3a: `head -c 300 /bin/ls > runs/x/config.yaml`, then --resume: a message, not a UnicodeDecodeError."""
    assert distill("--stop-after", "2") == 0
    (project / "runs/x/config.yaml").write_bytes(BINARY)
    assert distill("--resume") == 2
    err = capsys.readouterr().err
    assert "runs/x/config.yaml: the record of the run's recipe is damaged: byte 128 is not UTF-8 text" in err
    assert "restore it from a copy, or start the run again in another output folder" in err
    assert "Traceback" not in err


def test_binary_bytes_in_metrics_jsonl_are_an_error_naming_file_and_line(project, capsys):
    """Case 3b: a damaged metrics.jsonl names its file and line and what to do; a half-written binary last line (a
    kill during an append) is dropped as any half-written line is."""
    assert distill("--stop-after", "2") == 0
    metrics = project / "runs/x/metrics.jsonl"
    good = metrics.read_bytes()
    metrics.write_bytes(good + BINARY[128:160])  # a torn last append
    assert distill("--resume", "--stop-after", "3") == 0
    assert "metrics.jsonl:3: dropped a half-written last record" in capsys.readouterr().out
    metrics.write_bytes(BINARY + b"\n" + good)
    assert distill("--resume") == 2
    err = capsys.readouterr().err
    assert "runs/x/metrics.jsonl:1: not a JSON record; the metrics file is damaged (move it away" in err


def test_a_config_yaml_cut_short_is_named_damaged(project, capsys):
    """Case 5a: config.yaml cut to five lines: the message says the record is cut short and what to do (it used to
    list every missing setting as a change of recipe)."""
    assert distill("--stop-after", "2") == 0
    config = project / "runs/x/config.yaml"
    config.write_text("".join(config.read_text().splitlines(keepends=True)[:5]), encoding="utf-8")
    assert distill("--resume") == 2
    err = capsys.readouterr().err
    assert "runs/x/config.yaml: the record of the run's recipe lacks its sections" in err
    assert "cut short or damaged" in err and "start the run again in another output folder" in err


def test_a_relative_model_folder_that_does_not_exist_is_named_with_the_folder_it_was_read_from(project, capsys):
    """Case 5b: `teacher.name_or_path=models/teacher-mlm` (no such folder): the message names the absolute folder
    looked for and the working folder it was resolved against, then the Hub."""
    assert distill("teacher.name_or_path=trained/teacher-mlm") == 2  # no folder trained/ either: a Hub id?
    err = capsys.readouterr().err
    assert f"there is no folder {project / 'trained/teacher-mlm'}" in err
    assert f"a relative path is read from the working folder {project}" in err
    assert "If you meant a local folder, correct the path" in err
    assert distill("teacher.name_or_path=models/teacher-mlm") == 2  # beside a folder that exists: surely a path
    assert f"Model folder {project / 'models/teacher-mlm'} does not exist" in capsys.readouterr().err


def test_a_run_started_before_a_setting_existed_resumes(project, capsys):
    """A config.yaml without a setting added since (here train.device): its default, not a change of recipe."""
    assert distill("--stop-after", "2") == 0
    config = project / "runs/x/config.yaml"
    recorded = yaml.safe_load(config.read_text())
    del recorded["train"]["device"]
    config.write_text(yaml.safe_dump(recorded), encoding="utf-8")
    assert distill("--resume") == 0, capsys.readouterr().err


def test_a_run_folder_moved_elsewhere_continues_there(project, capsys):
    """A distill run with its corpus cache inside its own folder, moved (`mv runs/x ../moved/x`) and continued with
    --resume from its new place: its own paths compare by their new place; a path outside it still must match."""
    text = DISTILL.replace("cache_dir: cache", "cache_dir: runs/x/corpus-cache")
    (project / "distill.yaml").write_text(text, encoding="utf-8")
    assert distill("--stop-after", "2") == 0
    shutil.move(project / "runs/x", project / "moved")
    assert distill("data.cache_dir=moved/corpus-cache", "--out", "moved", "--resume") == 0, capsys.readouterr().err
    assert json.loads((project / "moved/summary.json").read_text())["finished"]
    assert distill("data.cache_dir=moved/other-cache", "--out", "moved", "--resume") == 2
    assert "data.cache_dir" in capsys.readouterr().err, "a path the move does not explain is a difference"


def test_moved_paths_maps_only_what_lies_under_the_folder_that_moved():
    same = moved_paths("/a/runs/demo/study", "/b/copy/demo/study")  # `cp -r /a/runs/demo /b/copy/demo`
    assert same("/a/runs/demo/cache", "/b/copy/demo/cache") and same("/a/runs/demo/study", "/b/copy/demo/study")
    assert same(["/a/runs/x/m", 3], ["/b/copy/x/m", 3]) and same("/models/t", "/models/t")
    assert not same("/a/runs/demo/cache", "/b/copy/demo/other") and not same("/models/t", "/b/copy/models/t")
    assert not same(1, 2) and not same("relative/a", "relative/b")
    renamed = moved_paths("/a/runs/demo/study", "/b/demo2/study")  # copied under another name
    assert renamed("/a/runs/demo/init_model", "/b/demo2/init_model")
    before = {"student": "/a/runs/demo/init_model", "kd": {"cache_dir": "/a/runs/demo/out", "lr": 1}}
    after = {"student": "/b/demo2/init_model", "kd": {"cache_dir": "/b/demo2/out", "lr": 2}}
    assert recipe_differences(before, after, same=renamed) == ["kd.lr: 1 -> 2"]


def test_the_guarded_readers_name_the_file_and_what_to_do(tmp_path):
    path = tmp_path / "record.json"
    path.write_bytes(BINARY)
    with pytest.raises(BiodistilError, match=r"record\.json: the summary is damaged: byte 128 is not UTF-8 text; "
                                             "run it again"):
        read_text(path, "summary", "run it again")
    path.write_text('{"a": ', encoding="utf-8")
    with pytest.raises(BiodistilError, match=r"record\.json: the summary is damaged \(not JSON"):
        read_json(path, "summary")
    with pytest.raises(BiodistilError, match=r"absent\.json: the summary cannot be read"):
        read_json(tmp_path / "absent.json", "summary")
