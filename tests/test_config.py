"""Recipes: validation, overrides, and errors that name the problem."""

import re

import pytest
import yaml

from biodistil.config import DistillRecipe, PretrainRecipe, load_recipe
from biodistil.errors import BiodistilError


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
    assert recipe.train.tensorboard is False and recipe.run.output_dir == "x"


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


@pytest.mark.parametrize("name", ["distilbiobert", "biolm-distill-align"])
def test_shipped_distill_recipes_validate(name):
    from pathlib import Path

    recipe = load_recipe(DistillRecipe, Path(__file__).parents[1] / "recipes" / f"{name}.yaml")
    assert recipe.objective.terms


@pytest.mark.parametrize("name", ["pretrain-scratch", "continual-pretrain"])
def test_shipped_pretrain_recipes_validate(name):
    from pathlib import Path

    assert load_recipe(PretrainRecipe, Path(__file__).parents[1] / "recipes" / f"{name}.yaml")
