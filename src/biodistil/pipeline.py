"""`biodistil pipeline RECIPE.yaml`: existing commands (pretrain, distill, evaluate, study, deploy) run one after
another.

A pipeline recipe names its stages; each stage is a command, a recipe file (relative to the pipeline file) and/or
inline `settings`, and dotted overrides. `${name}` in an override or a settings string stands for a pipeline
variable (`vars`) or, for a stage name, that stage's exported model folder. `shared` is a partial recipe merged into
every pretrain and distill stage whose command has that section (e.g. `shared.train.max_steps=10` shortens them
all). Stage k writes <output_dir>/<name> and runs as every stage of a multi-stage job does
(`biodistil.training.run.run_stage`): a finished stage (its summary.json, written last) is skipped, an interrupted one
continues from its checkpoint, so a re-run continues where the last one stopped (with or without --resume). An
`evaluate` stage (usually the last: fine-tune the models the earlier stages made on tasks × seeds) keeps its
finished cells and runs the others; so does a `study` stage (`biodistil study`: a teacher, finetune and kd arms over
seeds) with its finished runs, and a `deploy` stage (`evaluation.deploy`: ONNX int8 exports, test scores and speed of
chosen models side by side) with its exports. `${name}` of those three is the stage's folder.
At the end `<output_dir>/pipeline.json` gathers every stage's summary (steps,
wall time, losses; the evaluation's results), the machine and the resolved pipeline recipe: the record of a study
built as a pipeline.
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
    load_recipe,
    validate_recipe,
)
from biodistil.errors import BiodistilError
from biodistil.evaluation.deploy import DeployRecipe
from biodistil.evaluation.recipe import EvaluateRecipe
from biodistil.io import atomic_write_json, jsonable, read_json, read_text
from biodistil.kd.recipe import StudyRecipe
from biodistil.paths import absolute
from biodistil.training.machine import describe_machine
from biodistil.training.run import run_stage

COMMANDS = {"pretrain": PretrainRecipe, "distill": DistillRecipe, "evaluate": EvaluateRecipe, "study": StudyRecipe,
            "deploy": DeployRecipe}
TRAINING = ("pretrain", "distill")  # the stages `shared` applies to (evaluate's train and data differ)
FOLDER_STAGES = {"evaluate": "results.json", "study": "summary.json", "deploy": "deploy.json"}  # always run; records
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")


class StageConfig(Section):
    """One step of a pipeline: an existing command with its recipe and overrides."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="folder name; ${name} = this stage's model")
    command: Literal["pretrain", "distill", "evaluate", "study", "deploy"]
    recipe: str | None = Field(None, description="recipe file, relative to the pipeline recipe")
    settings: dict[str, Any] = Field(default_factory=dict, description="partial recipe merged over the file's (or "
                                                                        "the whole recipe); strings may use ${...}")
    overrides: list[str] = Field(default_factory=list, description="key.sub=value, may use ${var} / ${stage}")

    @model_validator(mode="after")
    def _has_a_recipe(self) -> "StageConfig":
        if self.recipe is None and not self.settings:
            raise ValueError(f"stage '{self.name}': give a recipe file, inline settings, or both")
        return self


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
        known = {key for command in TRAINING for key in COMMANDS[command].model_fields}
        unknown = sorted(set(self.shared) - known)
        if unknown:
            raise ValueError(f"shared sections {unknown} belong to no command; valid: {sorted(known)}")
        return self


def load_pipeline(path: str | Path, overrides: list[str] = ()) -> PipelineRecipe:
    """Read a pipeline recipe; its stages' recipe files, relative to the pipeline file, become absolute."""
    recipe = load_recipe(PipelineRecipe, path, overrides)
    base = Path(absolute(path)).parent
    for stage in recipe.stages:
        if stage.recipe is not None:
            stage.recipe = absolute(base / stage.recipe)
    return recipe


def run_pipeline(recipe: PipelineRecipe, base_dir: str | Path = ".", processes: int | Literal["auto"] = 1) -> Path:
    """Run every stage in order (finished ones skipped, an interrupted one resumed); write `pipeline.json`; return
    the last stage's folder (its exported model for pretrain and distill). `processes` other than 1: a study or
    evaluate stage runs its fine-tuning runs side by side in worker processes (as `study --processes`)."""
    root = Path(recipe.run.output_dir)
    values = {key: str(value) for key, value in recipe.vars.items()}
    output = root
    for stage in recipe.stages:
        stage_dir = root / stage.name

        def run(resume: bool, stage: StageConfig = stage, stage_dir: Path = stage_dir) -> None:
            stage_recipe = stage_recipe_for(recipe, stage, Path(base_dir), values, stage_dir)
            _run_stage(stage.command, stage_recipe, resume, processes)

        if stage.command in FOLDER_STAGES:  # always run: each skips its finished work (a task or seed added runs)
            output = stage_dir
            run(True)
        else:
            output = stage_dir / "model"
            if not run_stage(stage_dir, run):
                print(f"pipeline: stage '{stage.name}' already exported {output}; skipping")
        values[stage.name] = str(output)
    atomic_write_json(root / "pipeline.json", pipeline_record(recipe, root))
    return output


def pipeline_record(recipe: PipelineRecipe, root: Path) -> dict[str, Any]:
    """The pipeline's record: its recipe, the machine, and per stage its summary (pretrain, distill, study), results
    (evaluate) or record (deploy)."""
    stages = []
    for stage in recipe.stages:
        folder = root / stage.name
        name = FOLDER_STAGES.get(stage.command, "summary.json")
        record = read_json(folder / name) if (folder / name).is_file() else None
        key = {"evaluate": "results", "deploy": "deploy"}.get(stage.command, "summary")
        stages.append({"name": stage.name, "command": stage.command, "folder": stage.name,
                       "config": _config(folder), key: record})
    return jsonable({"recipe": recipe.model_dump(mode="json"), "machine": describe_machine(), "stages": stages})


def _config(folder: Path) -> Any:
    """A stage's recorded recipe, or None when it has none or it cannot be read (the record says so)."""
    import yaml

    path = folder / "config.yaml"
    try:
        return yaml.safe_load(read_text(path, "stage's recipe record")) if path.is_file() else None
    except (BiodistilError, yaml.YAMLError) as err:
        print(f"{path}: damaged ({str(err).splitlines()[0]}); pipeline.json records no recipe for the stage",
              flush=True)
        return None


def stage_recipe_for(
    recipe: PipelineRecipe, stage: StageConfig, base_dir: Path, values: dict[str, str], stage_dir: Path
) -> Section:
    """The stage's validated recipe: its file, then `shared`, then its overrides, then its run folder."""
    recipe_cls = COMMANDS[stage.command]
    shared = {key: value for key, value in recipe.shared.items()
              if key in recipe_cls.model_fields and stage.command in TRAINING}
    raw = _read_yaml(base_dir / stage.recipe) if stage.recipe else {}
    raw = deep_merge(deep_merge(raw, _substitute_all(stage.settings, values, stage.name)), shared)
    for item in stage.overrides:
        _apply_override(raw, _substitute(item, values, stage.name))
    _apply_override(raw, f"run.output_dir={stage_dir}")
    source = f"pipeline stage '{stage.name}'" + (f" ({stage.recipe})" if stage.recipe else "")
    return validate_recipe(recipe_cls, raw, source=source)


def _run_stage(command: str, recipe: Section, resume: bool, processes: int | Literal["auto"] = 1) -> Path:
    from biodistil.evaluation.deploy import run_deploy
    from biodistil.evaluation.runner import run_evaluate
    from biodistil.kd.study import run_study
    from biodistil.methods.task_agnostic import run_distill, run_pretrain

    if command in ("study", "evaluate"):
        return {"study": run_study, "evaluate": run_evaluate}[command](recipe, resume=resume, processes=processes)
    return {"pretrain": run_pretrain, "distill": run_distill, "deploy": run_deploy}[command](recipe, resume=resume)


def _substitute_all(value: Any, values: dict[str, str], stage: str) -> Any:
    """`value` with ${...} replaced in every string it holds (settings are nested dicts and lists)."""
    if isinstance(value, str):
        return _substitute(value, values, stage)
    if isinstance(value, dict):
        return {key: _substitute_all(item, values, stage) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute_all(item, values, stage) for item in value]
    return value


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
