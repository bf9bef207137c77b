"""`biodistil pipeline RECIPE.yaml`: a list of existing commands (pretrain, distill) run one after another.

A pipeline recipe names its stages; each stage is a command, a recipe file (relative to the pipeline file)
and dotted overrides. `${name}` in an override stands for a pipeline variable (`vars`) or, for a stage name,
that stage's exported model folder. `shared` is a partial recipe merged into every stage whose command has
that section (e.g. `shared.train.max_steps=10` shortens every stage). Stage k writes <output_dir>/<name> and runs
as every stage of a multi-stage job does (`biodistil.training.run.run_stage`): a stage whose model is already
exported is skipped and an interrupted one continues from its checkpoint, so a re-run continues where the last
one stopped (with or without --resume).
"""

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from biodistil.config import (
    DistillRecipe,
    PretrainRecipe,
    RunConfig,
    Section,
    _apply_override,
    _read_yaml,
    deep_merge,
    validate_recipe,
)
from biodistil.errors import BiodistilError
from biodistil.training.run import run_stage

COMMANDS = {"pretrain": PretrainRecipe, "distill": DistillRecipe}
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")


class StageConfig(Section):
    """One step of a pipeline: an existing command with its recipe and overrides."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="folder name; ${name} = this stage's model")
    command: Literal["pretrain", "distill"]
    recipe: str = Field(description="recipe file, relative to the pipeline recipe")
    overrides: list[str] = Field(default_factory=list, description="key.sub=value, may use ${var} / ${stage}")


class PipelineRecipe(Section):
    """`biodistil pipeline`: stages run in order, each reading the models earlier stages exported."""

    run: RunConfig = Field(default_factory=RunConfig)
    vars: dict[str, Any] = Field(default_factory=dict, description="values for ${name} placeholders")
    shared: dict[str, Any] = Field(default_factory=dict, description="partial recipe merged into every stage")
    stages: list[StageConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _names_are_unique(self) -> "PipelineRecipe":
        names = [stage.name for stage in self.stages]
        clashes = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(self.vars)))
        if clashes:
            raise ValueError(f"stage names must be unique and differ from vars: {clashes}")
        known = {key for cls in COMMANDS.values() for key in cls.model_fields}
        unknown = sorted(set(self.shared) - known)
        if unknown:
            raise ValueError(f"shared sections {unknown} belong to no command; valid: {sorted(known)}")
        return self


def run_pipeline(recipe: PipelineRecipe, base_dir: str | Path) -> Path:
    """Run every stage in order (finished ones skipped, an interrupted one resumed); return the last model folder."""
    root = Path(recipe.run.output_dir)
    values = {key: str(value) for key, value in recipe.vars.items()}
    model_dir = root
    for stage in recipe.stages:
        stage_dir = root / stage.name
        model_dir = stage_dir / "model"

        def run(resume: bool, stage: StageConfig = stage, stage_dir: Path = stage_dir) -> None:
            stage_recipe = stage_recipe_for(recipe, stage, Path(base_dir), values, stage_dir)
            _run_stage(stage.command, stage_recipe, resume)

        exported = model_dir / "config.json"
        if not run_stage(stage_dir, exported.is_file, run):
            print(f"pipeline: stage '{stage.name}' already exported {model_dir}; skipping")
        values[stage.name] = str(model_dir)
    return model_dir


def stage_recipe_for(
    recipe: PipelineRecipe, stage: StageConfig, base_dir: Path, values: dict[str, str], stage_dir: Path
) -> Section:
    """The stage's validated recipe: its file, then `shared`, then its overrides, then its run folder."""
    recipe_cls = COMMANDS[stage.command]
    shared = {key: value for key, value in recipe.shared.items() if key in recipe_cls.model_fields}
    raw = deep_merge(_read_yaml(base_dir / stage.recipe), shared)
    for item in stage.overrides:
        _apply_override(raw, _substitute(item, values, stage.name))
    _apply_override(raw, f"run.output_dir={stage_dir}")
    return validate_recipe(recipe_cls, raw, source=f"pipeline stage '{stage.name}' ({stage.recipe})")


def _run_stage(command: str, recipe: Section, resume: bool) -> Path:
    from biodistil.methods.task_agnostic import run_distill, run_pretrain

    runner = run_pretrain if command == "pretrain" else run_distill
    return runner(recipe, resume=resume)


def _substitute(text: str, values: dict[str, str], stage: str) -> str:
    def replace(match: re.Match) -> str:
        key = match.group(1)
        if key not in values:
            raise BiodistilError(
                f"pipeline stage '{stage}': ${{{key}}} is neither a variable nor an earlier stage; "
                f"known: {sorted(values)}"
            )
        return values[key]

    return _PLACEHOLDER.sub(replace, text)
