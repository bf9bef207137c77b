"""Recipes: validation, overrides, and errors that name the problem."""

import os
import re
from pathlib import Path

import pytest
import yaml

from biodistil.config import DistillRecipe, PretrainRecipe, load_recipe
from biodistil.errors import BiodistilError
from biodistil.kd.recipe import KDRecipe, StudyRecipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def write(tmp_path, data) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


BASE = {
    "teacher": {"name_or_path": "some/teacher"},
    "data": {"train": ["corpus.txt"]},
    "objective": {"terms": [{"loss": "mlm", "weight": 2.0}]},
}


def test_valid_recipe_fills_defaults(tmp_path):
    recipe = load_recipe(DistillRecipe, write(tmp_path, BASE))
    assert recipe.student.init == "teacher_layers" and recipe.masking.probability == 0.15
    assert recipe.objective.terms[0].weight == 2.0


def test_overrides_are_typed_and_nested(tmp_path):
    recipe = load_recipe(
        DistillRecipe, write(tmp_path, BASE),
        ["train.learning_rate=1e-4", "student.layers=[0,2,5]", "train.tensorboard=false", "run.output_dir=x"],
    )
    assert recipe.train.learning_rate == pytest.approx(1e-4)
    assert recipe.student.layers == [0, 2, 5]
    assert recipe.train.tensorboard is False and recipe.run.output_dir == os.path.abspath("x"), "made absolute"


def test_no_is_a_word_for_precision(tmp_path):
    recipe = load_recipe(DistillRecipe, write(tmp_path, {**BASE, "train": {"precision": False}}), [])
    assert recipe.train.precision == "no"
    assert load_recipe(DistillRecipe, write(tmp_path, BASE), ["train.precision=no"]).train.precision == "no"
    assert load_recipe(DistillRecipe, write(tmp_path, BASE), ["train.tensorboard=false"]).train.tensorboard is False


def test_unknown_key_names_it_and_lists_valid_keys(tmp_path):
    bad = {**BASE, "train": {"learnin_rate": 1e-4}}
    with pytest.raises(BiodistilError) as err:
        load_recipe(DistillRecipe, write(tmp_path, bad))
    message = str(err.value)
    assert "train.learnin_rate" in message and "learning_rate" in message and "max_steps" in message


def test_bad_value_names_the_field(tmp_path):
    with pytest.raises(BiodistilError, match=r"masking.probability"):
        load_recipe(DistillRecipe, write(tmp_path, BASE), ["masking.probability=1.5"])
    with pytest.raises(BiodistilError, match=r"objective.terms.0.loss"):
        load_recipe(DistillRecipe, write(tmp_path, {**BASE, "objective": {"terms": [{"loss": "nope"}]}}))


def test_missing_section_and_inconsistent_choices(tmp_path):
    with pytest.raises(BiodistilError, match="teacher"):
        load_recipe(DistillRecipe, write(tmp_path, {k: v for k, v in BASE.items() if k != "teacher"}))
    with pytest.raises(BiodistilError, match=re.escape("needs student.architecture")):
        load_recipe(DistillRecipe, write(tmp_path, BASE), ["student.init=architecture"])
    with pytest.raises(BiodistilError, match=re.escape("needs model.architecture")):
        load_recipe(PretrainRecipe, write(tmp_path, {"model": {"init": "scratch"}, "data": {"train": ["a"]}}))


def test_not_yaml_and_missing_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("teacher: [unclosed\n")
    with pytest.raises(BiodistilError, match="not valid YAML"):
        load_recipe(DistillRecipe, str(path))
    with pytest.raises(BiodistilError, match="not found"):
        load_recipe(DistillRecipe, str(tmp_path / "absent.yaml"))
    with pytest.raises(BiodistilError, match=re.escape("key.sub=value")):
        load_recipe(DistillRecipe, write(tmp_path, BASE), ["no-equals-sign"])


def _terms(recipe: DistillRecipe, loss: str) -> list:
    return [term for term in recipe.objective.terms if term.loss == loss]


def test_task_agnostic_recipes_carry_the_papers_settings():
    # (every recipe validating as written: tests/test_methods_recipes.py; the quotes are in the recipes)
    distil = load_recipe(DistillRecipe, RECIPES / "distilbiobert.yaml")
    assert distil.train.max_steps == 100_000, '"all of our distilled models for 100k steps"'
    for name in ("distilbiobert", "compactbiobert"):  # eq. 2: W_n = 1 for masked tokens only
        assert [t.positions for t in _terms(load_recipe(DistillRecipe, RECIPES / f"{name}.yaml"), "logit_kl")] == [
            "masked"], name
    biolm = load_recipe(DistillRecipe, RECIPES / "biolm-distill-align.yaml")
    assert biolm.train.max_steps == 50_000 and biolm.train.warmup_steps is None
    assert biolm.train.resolved_warmup() == 2_500, "warm-up over the first 5% of steps"
    for name in ("tinybiobert-4l-312", "tinybiobert-6l-768"):  # TinyBERT: MSE of the unnormalised scores
        attention = _terms(load_recipe(DistillRecipe, RECIPES / f"{name}.yaml"), "attention_mse")
        assert [t.attention_map for t in attention] == ["scores"], name
    (mse,) = _terms(load_recipe(DistillRecipe, RECIPES / "vekd.yaml"), "logit_mse")
    assert mse.vocab_reduction == "sum" and mse.epsilon == 0.5 and mse.positions == "known"


def test_transfer_recipes_carry_the_papers_settings():
    # "a learning rate of 8e-6", "a sigmoid temperature of 1", "approximately 1000 to 1200 steps with a batch
    # size of 12"
    for name in ("kd-bioasq-boolq", "kd-bioasq-random-boolq"):
        recipe = load_recipe(KDRecipe, RECIPES / f"{name}.yaml")
        assert (recipe.kd.soft_loss, recipe.kd.temperature, recipe.kd.epochs) == ("sigmoid", 1.0, None), name
        assert (recipe.train.learning_rate, recipe.train.batch_size, recipe.train.max_grad_norm) == (8e-6, 12, 1.0)
        assert 1000 <= recipe.train.max_steps <= 1200, name
    study = load_recipe(StudyRecipe, RECIPES / "transfer-study.yaml")
    kd = study.defaults["kd"]
    assert kd["kd"]["temperature"] == 1.0 and "epochs" not in kd["kd"]
    assert (kd["train"]["learning_rate"], kd["train"]["batch_size"]) == (8e-6, 12)
    assert 1000 <= kd["train"]["max_steps"] <= 1200 and study.seeds == [1, 2, 3]
