"""Issue 31, the seven frictions a new user met distilling a teacher of their own on their own NER corpus, each as the
user typed it: a task file beside the recipe (written as the registry is), relative paths, `finetune`, `kd`,
`export --int8 --task` and `evaluate --finetuned` from another folder."""

import io
import json
import logging
import shutil
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from kd_fixtures import OTHER, POSITIVE

from biodistil.cli.main import main
from biodistil.data.alignment import tokenize_words
from biodistil.data.synthetic import write_ner_task
from biodistil.errors import BiodistilError
from biodistil.models.loading import load_tokenizer
from biodistil.tasks.registry import get_task

TRAIN = "{batch_size: 8, learning_rate: 0.001, warmup_steps: 0, eval_every: 0, save_every: 0, log_every: 1, " \
        "progress_bar: false, tensorboard: false}"


@pytest.fixture(scope="module")
def project(tmp_path_factory, teacher_dir, kd_models) -> Path:
    """A user's project: the NER data in corpora/species/ (outside any default data folder), a task file written the
    way the built-in registry is (`tasks: {my_species: ...}`, files relative to the data folder), recipes beside it,
    and a fine-tuned teacher (`finetune`, capped at task.max_examples: 20)."""
    root = tmp_path_factory.mktemp("frictions")
    write_ner_task(root / "corpora" / "species", "my_species", POSITIVE, OTHER, {"train": 48, "dev": 12, "test": 16},
                   length=(5, 20), max_length=16)
    (root / "corpora" / "species" / "my_species.yaml").unlink()
    task = {"tasks": {"my_species": {"kind": "token_classification", "format": "biobert_ner_tsv",
                                     "files": {split: f"species/{split}.tsv" for split in ("train", "dev", "test")},
                                     "labels": ["O", "B", "I"], "metric": "entity_f1", "max_length": 16,
                                     "truncation": "split"}}}
    (root / "my_species.yaml").write_text(yaml.safe_dump(task), encoding="utf-8")
    shutil.copytree(teacher_dir, root / "models" / "teacher")
    shutil.copytree(kd_models[1], root / "models" / "student")
    common = f"task: {{name: my_species.yaml, data_dir: corpora, max_examples: 20}}\ntrain: {TRAIN}\n"
    (root / "finetune.yaml").write_text("model: {name_or_path: models/teacher}\nfinetune: {epochs: 2}\n" + common)
    (root / "kd.yaml").write_text("teacher: {name_or_path: runs/teacher/model}\nstudent: {name_or_path: "
                                  "models/student}\ntransfer: {source: {kind: in_domain}, keep_labels: true}\n"
                                  "kd: {epochs: 1, alpha: 0.5, beta: 0.5, cache_dir: cache}\n" + common)
    (root / "elsewhere").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert main(["finetune", "finetune.yaml", "--out", "runs/teacher"]) == 0
    return root


@dataclass(frozen=True)
class Scored:
    folder: Path
    printed: str


@pytest.fixture(scope="module")
def scored(project) -> Scored:
    """The fine-tuned teacher scored with one seed, as the user typed it from another folder: `evaluate --finetuned`
    with relative paths and no --data."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project / "elsewhere")
        printed = io.StringIO()
        with redirect_stdout(printed):
            assert main(["evaluate", "--finetuned", "../runs/teacher/model", "--task", "../my_species.yaml", "--out",
                         "../runs/scored"]) == 0
    return Scored(project / "runs" / "scored", printed.getvalue())


def test_a_registry_style_task_file_with_one_task_is_read_and_several_are_refused_in_three_lines(project):
    """Friction 2."""
    task = get_task(str(project / "my_species.yaml"))
    assert task.name == "my_species" and task.kind == "token_classification"
    several = project / "two.yaml"
    several.write_text("tasks:\n  a: {kind: token_classification}\n  b: {kind: token_classification}\n")
    with pytest.raises(BiodistilError) as caught:
        get_task(str(several))
    message = str(caught.value)
    assert len(message.splitlines()) == 3 and "holds 2 tasks (a, b)" in message and "name: my_task" in message


def test_the_in_domain_transfer_set_takes_the_tasks_cap_and_kd_says_its_size(project, capsys, monkeypatch):
    """Friction 1: the teacher trained on task.max_examples = 20 sentences; the kd run's in-domain transfer set is the
    same 20 (it took all 48 before), and the run prints and records its size and how many keep a label."""
    monkeypatch.chdir(project)
    assert main(["kd", "kd.yaml", "--out", "runs/student"]) == 0
    out = capsys.readouterr().out
    assert "Transfer set: 20 examples from in_domain [train], capped at task.max_examples=20; 20 keep a gold label" \
        in out
    metrics = json.loads((project / "runs/student/metrics.json").read_text())
    assert metrics["transfer"]["size"] == 20 and metrics["transfer"]["labelled"] == 20
    assert "| transfer set | in_domain [train] (20 examples, 20 with a gold label) |" in \
        (project / "runs/student/report.md").read_text()


def test_reports_print_counts_as_integers_and_name_what_was_compiled(project):
    """Frictions 4 and 5: `n_true 13`, not `n_true 13.0000`; a fine-tuning run compiled nothing (no KL term)."""
    report = (project / "runs/teacher/report.md").read_text()
    test_row = next(line for line in report.splitlines() if line.startswith("| test |"))
    assert " n_true " in test_row and ".0000" not in test_row.split("n_true")[1].split(",")[0]
    assert "| train.compile | auto: nothing (no KL term in this stage) |" in report


def test_cards_carry_the_right_pipeline_tag_their_own_scores_and_provenance(project, monkeypatch, capsys):
    """Frictions 3 and 6: `export --task` finds the data in the run folder's record and says so (from another
    folder, without --data); the token classifier's cards say token-classification; the export's metadata is its own
    table's score, with its split and cap; and its provenance names biodistil and the source weights' sha256."""
    card = ModelCard.load(project / "runs/teacher/model/README.md").data.to_dict()
    assert card["pipeline_tag"] == "token-classification"
    assert card["model-index"][0]["results"][0]["dataset"]["args"] == {"max_examples": 20}
    monkeypatch.chdir(project / "elsewhere")
    assert main(["export", "../runs/teacher/model", "--out", "../runs/teacher-onnx", "--int8", "--task",
                 "../my_species.yaml", "--split", "test", "--max-examples", "12"]) == 0, capsys.readouterr().err
    assert f"Data folder: {project / 'corpora'} (task.data_dir of {project / 'runs/teacher/config.yaml'})" in \
        capsys.readouterr().out
    export = ModelCard.load(project / "runs/teacher-onnx/README.md")
    header = export.data.to_dict()
    assert header["pipeline_tag"] == "token-classification" and header["library_name"] == "onnx"
    (result,) = header["model-index"][0]["results"]
    assert result["dataset"]["split"] == "test" and result["dataset"]["args"] == {"max_examples": 12}
    accuracy = json.loads((project / "runs/teacher-onnx/export.json").read_text())["accuracy"]
    shipped = "onnx_int8" if "onnx_int8" in accuracy else "onnx_fp32"
    f1 = next(m["value"] for m in result["metrics"] if m["type"] == "f1")
    assert f1 == round(accuracy[shipped]["f1"], 4), "the metadata is the card's own table's score"
    assert "12 examples, the first 12 (max_examples)" in export.text
    weights = json.loads((project / "runs/teacher/provenance.json").read_text())  # the run's own record of inputs
    assert weights["biodistil"]["version"] and "made by biodistil" in export.text
    assert "source weights `model.safetensors`: sha256 `" in export.text


def test_evaluate_finetuned_finds_the_data_in_the_run_folders_record(scored):
    """Friction 3, for `evaluate --finetuned` from another folder, without --data."""
    assert "(task.data_dir of" in scored.printed


def test_windowed_long_sentences_raise_no_length_warning_and_one_seed_prints_one_table(project, scored, caplog):
    """Friction 7: biodistil windows a long sentence itself, so transformers' "Token indices sequence length is
    longer than the specified maximum" is not printed for it (it still is for text biodistil does not window); an
    evaluation with one seed has one table of scores, not a second of "medians over seeds"."""
    tokenizer = load_tokenizer(str(project / "models/teacher"))
    tokenizer.model_max_length = 16
    words = ["protein"] * 40
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING):
            tokenize_words(tokenizer, words)
        assert "longer than the specified maximum" not in caplog.text
        with caplog.at_level(logging.WARNING):
            tokenizer(" ".join(words))
        assert "longer than the specified maximum" in caplog.text, "the warning itself still exists"
    finally:
        transformers_logger.removeHandler(caplog.handler)
    report = (scored.folder / "report.md").read_text()
    assert "Medians over seeds" not in report and report.count("| model |") <= 2
