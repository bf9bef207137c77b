"""Every recipe in recipes/ runs 10 steps from the CLI on the tiny teacher and exports a clean student."""

from pathlib import Path

import pytest
import torch
import yaml
from recipe_fixtures import DISTILL, RECIPES, TINY_ARCH, check_export, data_overrides, fill, teacher_override
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

from biodistil.cli.main import main
from biodistil.config import DistillRecipe, PretrainRecipe, load_recipe
from biodistil.pipeline import PipelineRecipe

PRETRAIN = {"biodistilbert": "{teacher}", "biotinybert": "{teacher}", "biomobilebert": "{mobilebert}",
            "continual-pretrain": "{teacher}"}
PIPELINES = {"adapt-and-distill"}
SKIPPED = {"pretrain-scratch"}  # covered by tests/test_methods_task_agnostic.py


def recipe_kind(path: Path) -> str | None:
    """distill / pretrain / pipeline for the task-agnostic recipes; None for other commands' recipes."""
    raw = yaml.safe_load(path.read_text())
    if "stages" in raw:
        return "pipeline"
    if "objective" in raw and ("teacher" in raw or "teachers" in raw):
        return "distill"
    return "pretrain" if "model" in raw and "data" in raw else None


def test_every_task_agnostic_recipe_is_covered_and_valid_as_written():
    kinds = {path.stem: recipe_kind(path) for path in RECIPES.glob("*.yaml")}
    assert {n for n, k in kinds.items() if k == "distill"} == set(DISTILL)
    assert {n for n, k in kinds.items() if k == "pretrain"} == set(PRETRAIN) | SKIPPED
    assert {n for n, k in kinds.items() if k == "pipeline"} == PIPELINES
    classes = {"distill": DistillRecipe, "pretrain": PretrainRecipe, "pipeline": PipelineRecipe}
    for name, kind in kinds.items():
        if kind is not None:
            load_recipe(classes[kind], RECIPES / f"{name}.yaml")
            assert (RECIPES / f"{name}.yaml").read_text().startswith("#"), f"{name} names its source in a header"


@pytest.fixture(scope="module")
def paths(tmp_path_factory, teacher_dir, tokenizer):
    root = tmp_path_factory.mktemp("recipes")
    small = root / "small-student"
    torch.manual_seed(0)
    from biodistil.config import ArchitectureConfig
    from biodistil.models.student import model_from_architecture

    model_from_architecture(ArchitectureConfig(num_layers=2, hidden_size=16, num_heads=2, intermediate_size=32,
                                               max_position_embeddings=64), tokenizer).save_pretrained(small)
    tokenizer.save_pretrained(small)
    mobile = root / "mobilebert"
    config = AutoConfig.for_model("mobilebert", vocab_size=len(tokenizer), hidden_size=32, embedding_size=16,
                                  true_hidden_size=16, intra_bottleneck_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32, num_feedforward_networks=1,
                                  max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id)
    AutoModelForMaskedLM.from_config(config).save_pretrained(mobile)
    tokenizer.save_pretrained(mobile)
    return {"root": root, "teacher": str(teacher_dir), "small_student": str(small), "mobilebert": str(mobile)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DISTILL))
def test_distill_recipe_runs_from_the_cli(name, paths, corpus_file, tmp_path):
    out = tmp_path / name
    extra = [fill(item, paths) for item in DISTILL[name]]
    argv = ["distill", str(RECIPES / f"{name}.yaml"), teacher_override(RECIPES / f"{name}.yaml", paths["teacher"]),
            *data_overrides(corpus_file, paths), *extra, f"--out={out}"]
    assert main(argv) == 0
    student = check_export(out)
    if "teachers" in yaml.safe_load((RECIPES / f"{name}.yaml").read_text()):
        assert "Teachers (pre-flight)" in (out / "report.md").read_text()
    if name == "vekd":  # the exported student and tokenizer carry the expanded vocabulary
        assert student.config.vocab_size == len(AutoTokenizer.from_pretrained(out / "model")) > 200
    if name in ("tinybiobert-4l-312", "biolm-distill-align"):
        trained = load_file(str(next((out / "checkpoints").iterdir()) / "trainable.safetensors"))
        assert any("projections" in key for key in trained), "projections are trained and checkpointed"


@pytest.mark.parametrize("name", sorted(PRETRAIN))
def test_continual_pretraining_recipe_runs_from_the_cli(name, paths, corpus_file, tmp_path):
    out = tmp_path / name
    argv = ["pretrain", str(RECIPES / f"{name}.yaml"), f"model.name_or_path={fill(PRETRAIN[name], paths)}",
            *data_overrides(corpus_file, paths), f"--out={out}"]
    assert main(argv) == 0
    model = check_export(out)
    assert model.config.model_type == ("mobilebert" if name == "biomobilebert" else "bert")


def test_adapt_and_distill_pipeline_runs_from_the_cli(paths, corpus_file, tmp_path, capsys):
    out = tmp_path / "a-and-d"
    argv = ["pipeline", str(RECIPES / "adapt-and-distill.yaml"), f"vars.teacher={paths['teacher']}",
            f"vars.general_corpus={corpus_file}", f"vars.domain_corpus={corpus_file}",
            *[f"shared.{item}" for item in data_overrides(corpus_file, paths)],
            f"shared.{TINY_ARCH}", "shared.objective.terms=[{loss: minilm_relations, num_relation_heads: 2}]",
            f"--out={out}"]
    assert main(argv) == 0
    stages = ["teacher-adapted", "student-general", "student-adapted", "student-final"]
    for stage in stages:
        check_export(out / stage)
    final = yaml.safe_load((out / "student-final" / "config.yaml").read_text())
    assert final["teacher"]["name_or_path"] == str(out / "teacher-adapted" / "model")
    assert final["student"]["name_or_path"] == str(out / "student-adapted" / "model")
    adapted = yaml.safe_load((out / "student-adapted" / "config.yaml").read_text())
    assert adapted["model"]["name_or_path"] == str(out / "student-general" / "model")
    assert AutoModelForMaskedLM.from_pretrained(out / "student-final" / "model").config.hidden_size == 16
    capsys.readouterr()
    assert main(argv) == 0, "a finished pipeline re-runs by skipping its stages"
    assert capsys.readouterr().out.count("skipping") == 4
