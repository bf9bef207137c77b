"""ModernBERT from the command line: every task-agnostic recipe runs 10 steps with a tiny ModernBERT teacher, and a
tiny ModernBERT teacher distils into a half-depth ModernBERT student and into a BERT student, which both fine-tune
and score on a slice of NCBI-disease (skipped without the data folder)."""

import json

import pytest
import torch
from modernbert_fixtures import save_modernbert, train_bpe
from recipe_fixtures import (
    DISTILL,
    QUIET,
    RECIPES,
    TINY_ARCH,
    TRAIN,
    check_export,
    data_overrides,
    data_root,
    fill,
    needs_data,
    teacher_override,
)
from transformers import AutoConfig

from biodistil.cli.main import main
from biodistil.config import ArchitectureConfig
from biodistil.models.student import model_from_architecture

GLOBAL, LOCAL = "full_attention", "sliding_attention"

ARCHITECTURE_STUDENTS = {"tinybiobert-4l-312", "mobilebert-layer", "minilmv2", "biolm-distill-align",
                         "cross-tokenizer-distil"}


@pytest.fixture(scope="module")
def paths(tmp_path_factory, corpus_file):
    """A 4-layer ModernBERT teacher (global, local, local, global; window ±2) with a BPE tokenizer, and a small BERT
    with the same tokenizer (for the recipe whose student is an existing model)."""
    root = tmp_path_factory.mktemp("modernbert-recipes")
    bpe = train_bpe(corpus_file.read_text().splitlines(), 400, root / "bpe")
    teacher = save_modernbert(bpe, root / "teacher", dropout=0.1)
    small = root / "small-student"
    torch.manual_seed(0)
    model_from_architecture(ArchitectureConfig(num_layers=2, hidden_size=16, num_heads=2, intermediate_size=32,
                                               max_position_embeddings=64), bpe).save_pretrained(small)
    bpe.save_pretrained(small)
    return {"root": root, "teacher": str(teacher), "small_student": str(small)}


def distill(name: str, paths: dict, corpus_file, out, extra: list[str] = ()) -> int:
    argv = ["distill", str(RECIPES / f"{name}.yaml"), teacher_override(RECIPES / f"{name}.yaml", paths["teacher"]),
            *data_overrides(corpus_file, paths), *[fill(item, paths) for item in DISTILL[name]], *extra,
            f"--out={out}"]
    return main(argv)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(DISTILL) - {"vekd"}))
def test_distill_recipe_runs_with_a_modernbert_teacher(name, paths, corpus_file, tmp_path):
    assert distill(name, paths, corpus_file, tmp_path / name) == 0
    student = check_export(tmp_path / name)
    expected = "bert" if name in ARCHITECTURE_STUDENTS else "modernbert"
    assert student.config.model_type == expected
    if name in ("distilbiobert", "compactbiobert", "bioclinical-modernbert-distil"):  # layers 0, 2: global, local
        assert student.config.layer_types == [GLOBAL, LOCAL] and student.config.global_attn_every_n_layers == 2
    if name == "tinybiobert-6l-768":  # layers 1, 3: local, global — no period
        assert AutoConfig.from_pretrained(tmp_path / name / "model").layer_types == [LOCAL, GLOBAL]


def test_vocabulary_expansion_refuses_a_bpe_teacher(paths, corpus_file, tmp_path, capsys):
    assert distill("vekd", paths, corpus_file, tmp_path / "vekd") == 2
    assert "WordPiece" in capsys.readouterr().err


@pytest.mark.slow
def test_continual_pretraining_and_adapt_and_distill_with_modernbert(paths, corpus_file, tmp_path):
    out = tmp_path / "continual"
    assert main(["pretrain", str(RECIPES / "continual-pretrain.yaml"), f"model.name_or_path={paths['teacher']}",
                 *data_overrides(corpus_file, paths), f"--out={out}"]) == 0
    assert check_export(out).config.model_type == "modernbert"
    out = tmp_path / "a-and-d"
    argv = ["pipeline", str(RECIPES / "adapt-and-distill.yaml"), f"vars.teacher={paths['teacher']}",
            f"vars.general_corpus={corpus_file}", f"vars.domain_corpus={corpus_file}",
            *[f"shared.{item}" for item in data_overrides(corpus_file, paths)], f"shared.{TINY_ARCH}",
            "shared.objective.terms=[{loss: minilm_relations, num_relation_heads: 2}]", f"--out={out}"]
    assert main(argv) == 0
    assert check_export(out / "student-final").config.model_type == "bert"


@pytest.fixture(scope="module")
def ncbi_teacher(tmp_path_factory):
    """A tiny ModernBERT teacher with a BPE vocabulary of the data folder's biomedical corpus (so that NCBI
    sentences stay short), and a slice of that corpus."""
    root = tmp_path_factory.mktemp("modernbert-ncbi")
    with (data_root() / "corpus" / "biomed.txt").open(encoding="utf-8") as handle:
        lines = [next(handle) for _ in range(1500)]
    corpus = root / "biomed-slice.txt"
    corpus.write_text("".join(lines), encoding="utf-8")
    bpe = train_bpe(lines, 1500, root / "bpe")
    return save_modernbert(bpe, root / "teacher", dropout=0.1), corpus


STUDENTS = {
    "modernbert": [],  # the recipe's half-depth student: teacher layers 0, 2
    "bert": ["student.init=architecture", "student.architecture={model_type: bert, num_layers: 2, hidden_size: 16, "
             "num_heads: 2, intermediate_size: 32, max_position_embeddings: 128}"],
}


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("kind", sorted(STUDENTS))
def test_modernbert_teacher_distils_and_the_student_finetunes_on_ncbi_disease(kind, ncbi_teacher, tmp_path):
    teacher, corpus = ncbi_teacher
    out = tmp_path / "distil"
    assert main(["distill", str(RECIPES / "bioclinical-modernbert-distil.yaml"), f"teacher.name_or_path={teacher}",
                 f"data.train=[{corpus}]", "data.block_size=64", f"data.cache_dir={tmp_path / 'cache'}",
                 "data.eval_fraction=0", *TRAIN, *STUDENTS[kind], f"--out={out}"]) == 0
    student = check_export(out)
    assert student.config.model_type == kind and student.config.num_hidden_layers == 2
    tuned = tmp_path / "ncbi"
    assert main(["finetune", str(RECIPES / "finetune-gad.yaml"), f"model.name_or_path={out / 'model'}",
                 "task.name=ncbi_disease", "task.max_examples=16", "task.max_length=128", "finetune.epochs=1",
                 *QUIET, "--out", str(tuned)]) == 0
    metrics = json.loads((tuned / "metrics.json").read_text())
    assert {"precision", "recall", "f1"} <= set(metrics["test"]), metrics["test"]
    rows = [json.loads(line) for line in (tuned / "test_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(len(row["predicted"]) == len(row["gold"]) for row in rows)


@pytest.mark.slow
@needs_data
def test_evaluate_scores_a_modernbert_and_its_half_depth_copy_on_ncbi_disease(ncbi_teacher, tmp_path):
    from biodistil.config import validate_recipe
    from biodistil.evaluation.recipe import EvaluateRecipe
    from biodistil.evaluation.runner import run_evaluate

    teacher, _ = ncbi_teacher
    out = tmp_path / "eval"
    recipe = validate_recipe(EvaluateRecipe, {
        "run": {"output_dir": str(out), "seed": 7},
        "models": [{"name": "teacher", "path": str(teacher)}, {"name": "half", "path": str(teacher), "layers": [0, 2]}],
        "tasks": [{"name": "ncbi_disease", "label_policy": "all"}], "num_seeds": 1,
        "train": {"learning_rate": 1e-3, "batch_size": 8, "epochs": 1, "progress_bar": False},
        "data": {"root": str(data_root()), "max_examples": 16},
    })
    run_evaluate(recipe)
    for model in ("teacher", "half"):
        cell = json.loads((out / f"cells/{model}/ncbi_disease/seed-7/metrics.json").read_text())
        assert cell["headline"] == "f1" and 0 <= cell["score"] <= 1
        rows = [json.loads(line) for line in (out / f"cells/{model}/ncbi_disease/seed-7/predictions.jsonl").open()]
        assert all(len(row["prediction"]) == len(row["tokens"]) == len(row["gold"]) for row in rows)
    half = AutoConfig.from_pretrained(out / "init_models" / "half" / "init_model")
    assert half.layer_types == [GLOBAL, LOCAL] and half.global_attn_every_n_layers == 2
