"""Helpers (no tests) for the tests that run the recipes of recipes/ from the command line on tiny models: the
recipe folder, tiny overrides per recipe, the data folder when there is one, and the checks of an exported student."""

import json
import os
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM

from biodistil.data.paths import resolve_data_root
from biodistil.errors import BiodistilError

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
TINY_ARCH = ("student.architecture={model_type: bert, num_layers: 2, hidden_size: 16, num_heads: 2, "
             "intermediate_size: 32, max_position_embeddings: 64}")
TRAIN = ["train.max_steps=10", "train.batch_size=4", "train.grad_accumulation=1", "train.warmup_steps=0",
         "train.eval_every=0", "train.save_every=0", "train.log_every=5", "train.progress_bar=false",
         "train.tensorboard=false"]
DISTILL = {  # recipe -> tiny overrides (student shapes that fit the 4-layer, 32-wide, 2-head teacher)
    "bioclinical-modernbert-distil": [],  # its ModernBERT teacher: tests/test_modernbert_cli.py
    "distilbiobert": [],
    "biolm-distill-align": ["student.name_or_path={small_student}"],
    "tinybiobert-4l-312": [TINY_ARCH],
    "tinybiobert-6l-768": ["student.layers=[1,3]"],
    "compactbiobert": [],
    "mobilebert-layer": ["student.architecture={num_layers: 4, hidden_size: 32, num_heads: 2, intermediate_size: 16, "
                         "max_position_embeddings: 64}"],
    "minilmv2": [TINY_ARCH, "objective.terms=[{loss: minilm_relations, teacher_layer: -1, student_layer: -1, "
                            "num_relation_heads: 2, relations: [q, k, v]}]"],
    "distil-two-pubmedberts": [],  # two teachers: the tiny teacher twice (teachers=[...], not teacher.name_or_path)
    "vekd": ["student.layers=[0,2]", "student.vocab_expansion.vocab_size=260",
             "student.vocab_expansion.min_frequency=1"],
    # across tokenizers: a student vocabulary of its own, trained on the tiny corpus
    "cross-tokenizer-distil": [TINY_ARCH, "student.tokenizer={vocab_size: 150, min_frequency: 1}"],
    "cross-tokenizer-minilm": ["student.layers=[0,2]", "student.tokenizer={vocab_size: 150, min_frequency: 1}",
                               "objective.terms=[{loss: mlm}, {loss: hidden_cosine, layer_map: [1, 3]}, "
                               "{loss: minilm_relations}]"],
}
QUIET = ["train.progress_bar=false", "train.tensorboard=false", "train.batch_size=8"]


def teacher_override(recipe: Path, teacher: str) -> str:
    """The override that puts `teacher` in a recipe: `teacher.name_or_path`, or for a recipe of several teachers the
    same teacher twice (weights 1 and 3)."""
    if "teachers" in yaml.safe_load(recipe.read_text()):
        return f"teachers=[{{name_or_path: {teacher}}}, {{name_or_path: {teacher}, weight: 3}}]"
    return f"teacher.name_or_path={teacher}"


def data_root() -> Path | None:
    try:
        return resolve_data_root(os.environ.get("BIODISTIL_DATA"))
    except BiodistilError:
        return None


needs_data = pytest.mark.skipif(data_root() is None, reason="no biodistil data folder (../shared/data)")


def fill(text: str, paths: dict) -> str:
    """Replace {teacher}, {small_student}, {mobilebert} by the fixture's folders."""
    for key, value in paths.items():
        text = text.replace(f"{{{key}}}", str(value))
    return text


def data_overrides(corpus_file, paths) -> list[str]:
    return [f"data.train=[{corpus_file}]", "data.block_size=32", f"data.cache_dir={paths['root'] / 'cache'}",
            "data.eval_fraction=0", *TRAIN]


def check_export(out: Path) -> AutoModelForMaskedLM:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["result"]["steps"] == 10 and summary["finished"]
    weights = load_file(str(out / "model" / "model.safetensors"))
    assert not [key for key in weights if "projection" in key], "projections are never exported"
    return AutoModelForMaskedLM.from_pretrained(out / "model")
