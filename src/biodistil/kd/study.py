"""`biodistil study`: a comparison of task-specific runs (finetune and kd arms over seeds) against one teacher.

A study is a pipeline of ordinary run folders: for each task, the teacher (fine-tuned by the study unless a
fine-tuned one is named), then every arm × seed as a `finetune` or `kd` run, then a summary table with the
mean test score over seeds and the gap closed (S − S_init)/(T − S_init), where S_init is the student's
initialisation scored with no training, T the teacher and S the trained student, all on the same test set.
An interrupted study continues with --resume: finished runs are reused, interrupted kd runs resume.

Under `accelerate launch` / `torchrun` with P processes the study's runs are shared out in two waves, each run on one
process's device without DDP: first the teachers (task k's teacher fine-tuned, if the study fine-tunes it, and scored
on the test set by process k mod P; the others wait), then the unfinished arm × seed runs (run i of the list the
main process makes to process i mod P). Each run's folder is written by its process alone; the main process then
writes summary.json, report.md and scores.png: the same as one process's, since every run depends on its seed alone.
"""

import os
import shutil
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from biodistil.config import deep_merge, validate_recipe
from biodistil.data.formats import Example
from biodistil.errors import BiodistilError
from biodistil.finetune.command import FinetuneRecipe, run_finetune
from biodistil.finetune.init_model import init_model_path
from biodistil.finetune.selection import DEV_PREDICTIONS, TEST_PREDICTIONS
from biodistil.io import atomic_write_json, atomic_write_text, jsonable, number, read_json
from biodistil.kd.command import gap_closed, prepare_teacher_outputs, run_kd
from biodistil.kd.recipe import KDRecipe, StudyRecipe, StudyTask
from biodistil.kd.study_records import unpack_study
from biodistil.methods.several_teachers import ensemble_test_scores
from biodistil.models.loading import WeightsLeftOut
from biodistil.paths import recorded
from biodistil.tasks.bootstrap import gap_interval, read_scored_run, share_interval
from biodistil.tasks.encoding import fit_length_to_model
from biodistil.tasks.recipe import TaskConfig, load_task_split, task_spec
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.scoring import positive_index
from biodistil.tasks.significance import compare_scores, holm
from biodistil.teachers.store import left_out_fingerprint, teacher_fingerprint
from biodistil.teachers.task_cache import teacher_test_predictions, teacher_test_scores
from biodistil.training.machine import cpu_text, describe_machine
from biodistil.training.pool import run_in_workers, side_by_side_plan
from biodistil.training.processes import Launch
from biodistil.training.run import SUMMARY, RunFolder, finished, run_stage

RECORDS = ("metrics.json",)  # what the summary reads of each run: a run without it (lost, damaged) runs again


def run_study(recipe: StudyRecipe, resume: bool = False, processes: int | Literal["auto"] = 1,
              from_records: Path | None = None) -> Path:
    """Run every task's teacher, arms and seeds; write `summary.json` (settings, machine, per-seed scores and
    wall times, the table) and `report.md` in the study folder. Launched as several processes, share the runs out
    over them (see the module docstring); in one process, `processes` other than 1 runs the arm × seed runs side by
    side in worker processes (`training.pool`; `auto` decides from the idle cores). `from_records`: a file of
    `pack_study` to continue the study from, in a new folder (`kd.study_records`)."""
    launch = Launch.current()
    with launch.main_first():  # the main process takes the folder and writes the student; the others read it
        if from_records is not None and launch.is_main:
            unpack_study(from_records, Path(recipe.run.output_dir))
        resume = resume or from_records is not None
        root = _study_folder(recipe, resume) if launch.is_main else Path(recipe.run.output_dir)
        student = init_model_path(recipe.student, recipe.student_layers, root)  # one copy for every arm
    settings = jsonable(recipe.model_dump(mode="json"))
    recipe = recipe.model_copy(update={"student": student, "student_layers": None})
    runs = _study_runs(recipe, root)
    unfinished = [run for run in runs if finished(run.folder, needs=RECORDS, quiet=True) is None]
    for position in launch.share([1.0] * len(recipe.tasks)):
        _teacher(recipe, recipe.tasks[position], root, _weights_needed(recipe.tasks[position], unfinished, root))
    launch.wait()
    pending = launch.from_main(lambda: [i for i, run in enumerate(runs) if finished(run.folder, needs=RECORDS) is None])
    side_by_side = _run_all([runs[pending[position]] for position in launch.share([1.0] * len(pending))],
                            processes if launch.count == 1 else 1, root)
    before = finished(root, quiet=True)
    if not pending and before is not None:  # nothing ran now: the summary stays as it was
        side_by_side = before.get("side_by_side")
    launch.wait()
    if not launch.is_main:
        return root / "report.md"
    return _write_summary(recipe, runs, settings, root, side_by_side, looks(recipe, runs, before))


def looks(recipe: StudyRecipe, runs: list["StudyRun"], before: dict[str, Any] | None) -> int:
    """How many times this study's scores were looked at before they were final, this summary included: once, plus
    the recipe's `earlier_looks`, plus one for each earlier summary of other runs (seeds added after it was read).
    Each comparison is tested at α/looks (`tasks.significance`)."""
    if before is None:
        return 1 + recipe.earlier_looks
    seen = {(run["task"], run["arm"], run.get("start"), run["seed"]) for run in before.get("runs", [])}
    grown = seen != {(run.task, run.arm, run.start, run.seed) for run in runs}
    return int(before.get("looks", 1 + recipe.earlier_looks)) + grown


def _run_all(runs: list["StudyRun"], processes: int | Literal["auto"], root: Path) -> dict[str, Any] | None:
    """The runs one after another, or side by side in worker processes when `processes` asks for several; then
    how they ran side by side (processes, threads each, why, elapsed seconds: the teacher outputs the kd runs will
    read built first, with every core), or None when one after another."""
    plan = side_by_side_plan(processes, len(runs))
    if plan is None:
        for run in runs:
            run.run()
        return None
    began = time.monotonic()
    for run in runs:
        if run.command == "kd":  # each cache entry built once, with every core, before the runs share them
            prepare_teacher_outputs(validate_recipe(KDRecipe, run.raw, source=f"study run {run.folder}"))
    run_in_workers([run.run for run in runs], [run.name for run in runs],
                   [root / "logs" / f"{run.task}-{run.arm}{run.start_part('-')}-seed-{run.seed}.log" for run in runs],
                   plan)
    return {"runs": len(runs), "processes": plan.processes, "threads": plan.threads, "why": plan.why,
            "elapsed_seconds": round(time.monotonic() - began, 1)}


def _study_folder(recipe: StudyRecipe, resume: bool) -> Path:
    """The study's run folder, taken (locked, its recipe checked and written) by this process."""
    return RunFolder(recipe.run.output_dir, recipe, resume, stages=True).path


@dataclass(frozen=True)
class StudyRun:
    """One arm × (start ×) seed of a task: a `finetune` or `kd` run in `folder`, from its raw recipe; `start`: which
    of the arm's `starts` it began from (None when the arm has one start)."""

    task: str
    arm: str
    command: str
    seed: int
    folder: Path
    raw: dict[str, Any]
    start: int | None = None

    @property
    def name(self) -> str:
        return f"{self.task} · {self.arm}{self.start_part(' · ')} · seed {self.seed}"

    def start_part(self, separator: str) -> str:
        return f"{separator}start-{self.start}" if self.start is not None else ""

    def run(self) -> None:
        _stage(self.command, self.raw, self.folder, quiet=True)  # a damaged record was named when it was counted


def _study_runs(recipe: StudyRecipe, root: Path) -> list[StudyRun]:
    """Every arm × (start ×) seed of every task, in the order of the summary."""
    runs = []
    for study_task in recipe.tasks:
        name = get_task(study_task.name).name  # a built-in name or a task file: its folders take the task's name
        teacher = _teacher_model(study_task, root)
        for arm in recipe.arms:
            overrides = _named_teachers(deep_merge(study_task.overrides.get(arm.command, {}), arm.overrides),
                                        _teachers(study_task, root))
            for start, start_overrides in _starts(arm.command, arm.starts, overrides):
                for seed in arm.seeds or recipe.seeds:
                    arm_dir = root / name / arm.name / (f"start-{start}" if start is not None else "")
                    folder = arm_dir / f"seed-{seed}"
                    raw = _arm_recipe(recipe, study_task.name, arm.command, start_overrides, teacher, folder, seed,
                                      root)
                    runs.append(StudyRun(name, arm.name, arm.command, seed, folder, raw, start))
    return runs


def _starts(command: str, starts: list[str] | None, overrides: dict[str, Any]
            ) -> list[tuple[int | None, dict[str, Any]]]:
    """The arm's overrides for each of its starts (numbered from 1), or once, unnumbered, without `starts`."""
    if not starts:
        return [(None, overrides)]
    section = "student" if command == "kd" else "model"
    return [(k, deep_merge(overrides, {section: {"name_or_path": start}})) for k, start in enumerate(starts, 1)]


def _teacher(recipe: StudyRecipe, study_task: StudyTask, root: Path, needed: set[Path]) -> None:
    """A task's teacher (fine-tuned by the study unless given) and its more teachers, each scored on the test set
    (T, kept in the store with the teacher seeds' test and dev predictions and any ensemble's outputs); one in
    `needed` whose records came without its weights is fine-tuned again."""
    task_dir = root / get_task(study_task.name).name
    if study_task.teacher is None:
        for seed, model in zip(_teacher_seeds(recipe, study_task), _teacher_models(study_task, recipe, root),
                               strict=True):
            _teacher_stage(recipe, study_task.name, study_task.teacher_init or recipe.teacher_init,
                           study_task.teacher_overrides, Path(model).parent, seed, needed)
    for name, more in study_task.more_teachers.items():
        _teacher_stage(recipe, study_task.name, more.teacher_init, more.teacher_overrides, task_dir / f"teacher-{name}",
                       recipe.seeds[0], needed)
    for teacher in [*_teachers(study_task, root).values(), *_teacher_models(study_task, recipe, root)[1:]]:
        _teacher_scores(recipe, study_task, teacher, root)
    models = _teacher_models(study_task, recipe, root)
    for split in ("test", "dev"):  # what the summary pairs with the arms' predictions, stored while teachers are here
        _teacher_predictions(*_split(recipe, study_task, models, split), models, recipe, root)
    _more_teachers(recipe, study_task, root)  # their ensemble's outputs likewise


def _teacher_seeds(recipe: StudyRecipe, study_task: StudyTask) -> list[int]:
    return study_task.teacher_seeds or [recipe.seeds[0]]


def _teacher_models(study_task: StudyTask, recipe: StudyRecipe, root: Path) -> list[str]:
    """The task's teacher of each teacher seed, the one the kd arms learn from first (a given teacher: itself)."""
    first = _teacher_model(study_task, root)
    if study_task.teacher is not None:
        return [first]
    task_dir = Path(first).parent.parent
    return [first, *(str(task_dir / f"teacher-seed-{seed}" / "model")
                     for seed in _teacher_seeds(recipe, study_task)[1:])]


def _teachers(study_task: StudyTask, root: Path) -> dict[str, str]:
    """Every teacher of the task by the name arms give it: "teacher" and each of `more_teachers`."""
    task_dir = root / get_task(study_task.name).name
    more = {name: str(task_dir / f"teacher-{name}" / "model") for name in study_task.more_teachers}
    return {"teacher": _teacher_model(study_task, root), **more}


def _named_teachers(value: Any, teachers: dict[str, str]) -> Any:
    """`value` with every "@<name>" string replaced by that teacher's model folder."""
    if isinstance(value, dict):
        return {key: _named_teachers(item, teachers) for key, item in value.items()}
    if isinstance(value, list):
        return [_named_teachers(item, teachers) for item in value]
    if isinstance(value, str) and value.startswith("@"):
        if value[1:] not in teachers:
            raise BiodistilError(f"Study arm names teacher {value}; the task's teachers are "
                                 f"{['@' + name for name in teachers]}")
        return teachers[value[1:]]
    return value


def _teacher_model(study_task: StudyTask, root: Path) -> str:
    """The task's teacher: the one given, or the model the study fine-tunes into `<task>/teacher/model`."""
    return study_task.teacher or str(root / get_task(study_task.name).name / "teacher" / "model")


def _write_summary(recipe: StudyRecipe, runs: list[StudyRun], settings: dict[str, Any], root: Path,
                   side_by_side: dict[str, Any] | None = None, looked: int = 1) -> Path:
    """summary.json, report.md and scores.png from the finished runs' records (`side_by_side`: how this call ran
    them in worker processes, if it did; `looked`: see `looks`)."""
    teachers: dict[str, dict[str, Any]] = {}
    for study_task in recipe.tasks:
        spec = get_task(study_task.name)
        teacher = _teacher_model(study_task, root)
        teachers[spec.name] = {"model": recorded(teacher, root), "headline": spec.headline_key,
                               "test": _teacher_scores(recipe, study_task, teacher, root),
                               **_teacher_record(study_task, teacher), **_more_teachers(recipe, study_task, root),
                               **_teacher_seed_records(recipe, study_task, root)}
    records = [_run_record(run, root) for run in runs]
    rows = summarise(records, teachers, recipe.metric)
    _add_share_intervals(recipe, runs, rows, root)
    summary = {"rows": rows, "teachers": teachers, "runs": records,
               "seeds": recipe.seeds, "settings": settings, "machine": describe_machine(),
               "wall_seconds": round(sum(r["wall_seconds"] or 0 for r in records) + teacher_seconds(teachers), 1),
               "side_by_side": side_by_side, "looks": looked, "reference_arm": recipe.reference_arm,
               "machines": machines(records)}
    plot_study(summary["rows"], root / "scores.png")
    atomic_write_text(root / "report.md", render_study(summary, root))
    atomic_write_json(root / SUMMARY, jsonable(summary))  # last: the study's "finished" marker
    return root / "report.md"


def _add_share_intervals(recipe: StudyRecipe, runs: list[StudyRun], rows: list[dict[str, Any]], root: Path) -> None:
    """Each row's share of the teacher with its 95% interval over seeds and test sentences (`tasks.bootstrap`: runs
    drawn per side — an arm's starts and its seeds, crossed; every teacher seed — sentences paired), from the
    runs' predictions and the teachers'; `share` on the test split, `share_dev` on the dev split (the final models'
    dev predictions). With a `reference_arm`, every other row's gap closed from it likewise (`gap`, `gap_dev`). A
    row whose predictions cannot be paired with the teachers' (another split, another metric, runs from before dev
    predictions were written) says why instead."""
    for study_task in recipe.tasks:
        models = _teacher_models(study_task, recipe, root)
        for split, suffix, file in (("test", "", TEST_PREDICTIONS), ("dev", "_dev", DEV_PREDICTIONS)):
            task, examples = _split(recipe, study_task, models, split)
            teachers = _teacher_predictions(task, examples, models, recipe, root)  # once per split, for every row
            mine = [row for row in rows if row["task"] == task.name]
            for row in mine:
                row["share" + suffix] = _interval_record(task, row["metric"], teachers, file, root,
                                                         recipe.resamples, _row_runs(runs, row))
            reference = next((row for row in mine if row["arm"] == recipe.reference_arm), None)
            for row in (row for row in mine if reference is not None and row is not reference):
                row["gap" + suffix] = _interval_record(task, row["metric"], teachers, file, root,
                                                       recipe.resamples, _row_runs(runs, row),
                                                       _row_runs(runs, reference))


def _row_runs(runs: list[StudyRun], row: dict[str, Any]) -> list[list[StudyRun]]:
    """A row's runs grouped by start, each start's in seed order (one group per run when the arm has one start: the
    one-level draw)."""
    mine = [run for run in runs if run.task == row["task"] and run.arm == row["arm"]]
    if all(run.start is None for run in mine):
        return [[run] for run in mine]
    return [sorted((run for run in mine if run.start == start), key=lambda run: run.seed)
            for start in dict.fromkeys(run.start for run in mine)]


def _teacher_predictions(task: TaskSpec, examples: list[Example], models: list[str], recipe: StudyRecipe,
                         root: Path) -> list[Path] | BiodistilError:
    """Each teacher's predictions on the split (from the store, scored once), or why there are none."""
    if not examples:
        return BiodistilError(f"task {task.name} has no such split")
    try:
        return [teacher_test_predictions(model, task, examples, _cache(recipe, root)) for model in models]
    except BiodistilError as err:
        return err


def _interval_record(task: TaskSpec, metric: str, teachers: list[Path] | BiodistilError, file: str, root: Path,
                     resamples: int, groups: list[list[StudyRun]], reference: list[list[StudyRun]] | None = None
                     ) -> dict[str, Any]:
    """The share of the teacher of the runs in `groups` — or, given a `reference` arm's runs, the gap they close from
    it — with its interval over `resamples` bootstrap resamples, as recorded; or why there is none."""
    positive_at = positive_index(task) if task.kind != "token_classification" else None
    scored = partial(read_scored_run, metric=task.metric, key=metric, positive_at=positive_at, **task.metric_options)

    def side(runs: list[list[StudyRun]]) -> list[Any]:
        sides: list[Any] = [[scored(run.folder / file) for run in group] for group in runs]
        return [group[0] for group in sides] if all(len(group) == 1 for group in sides) else sides  # one-level draw

    try:
        if isinstance(teachers, BiodistilError):
            raise teachers
        teacher_runs = [scored(path) for path in teachers]
        if reference is None:
            return share_interval(side(groups), teacher_runs, resamples).as_record()
        return gap_interval(side(groups), side(reference), teacher_runs, resamples).as_record()
    except (BiodistilError, OSError, KeyError, ValueError) as err:  # named relative to the study's folder
        return {"why_none": str(err).replace(str(root), ".")}


def side_by_side_line(record: dict[str, Any]) -> str:
    """How a study's runs ran in worker processes, for its reports."""
    return (f"{record['runs']} runs ran {record['processes']} at a time in worker processes ({record['threads']} "
            f"CPU thread(s) each; {record['why']}): {record['elapsed_seconds'] / 60:.1f} minutes elapsed (the runs' "
            "wall times count each run in full).")


def teacher_seconds(teachers: dict[str, dict[str, Any]]) -> float:
    """The wall time of the teachers a study fine-tuned, its more teachers' included."""
    extra = ("more_teachers", "teacher_seeds")
    return sum((record.get("wall_seconds") or 0) + sum(other.get("wall_seconds") or 0 for key in extra
                                                       for name, other in record.get(key, {}).items()
                                                       if other.get("model") != record.get("model"))
               for record in teachers.values())


def _run_record(run: StudyRun, root: Path) -> dict[str, Any]:
    """One arm × seed in the summary: its scores, its initialisation's, steps, wall time and any degenerate test
    predictions (one class for every example)."""
    metrics = read_json(run.folder / "metrics.json")
    start = {"start": run.start} if run.start is not None else {}
    return {"task": run.task, "arm": run.arm, "command": run.command, **start, "seed": run.seed,
            "folder": recorded(run.folder, root), "test": metrics.get("test", {}), "init": metrics.get("init", {}),
            **_steps(metrics), "wall_seconds": metrics.get("wall_seconds"),
            "degenerate": metrics.get("degenerate") or "", "cpu": _ran_on(run.folder)}


def _ran_on(folder: Path) -> str | None:
    """The CPU (model and speed flags, as `training.machine.cpu_line` writes them) a run's provenance records: a study
    run in parts (`kd.study_records`) may have run on several machines."""
    try:
        machine = read_json(folder / "provenance.json").get("machine") or {}
    except BiodistilError:
        return None
    return cpu_text(machine.get("cpu"), machine.get("flags"))


def machines(runs: list[dict[str, Any]]) -> dict[str, int]:
    """How many of a study's runs ran on each CPU."""
    return dict(Counter(run["cpu"] for run in runs if run.get("cpu")))


def _more_teachers(recipe: StudyRecipe, study_task: StudyTask, root: Path) -> dict[str, Any]:
    """With more teachers: each one's test scores and wall time, and their ensemble's (equal weights) scores."""
    if not study_task.more_teachers:
        return {}
    teachers = _teachers(study_task, root)
    more = {name: {"model": recorded(path, root), "test": _teacher_scores(recipe, study_task, path, root),
                   "wall_seconds": read_json(Path(path).parent / "metrics.json").get("wall_seconds")}
            for name, path in teachers.items() if name != "teacher"}
    task, test = _test_split(recipe, study_task, list(teachers.values()))
    ensemble = ensemble_test_scores(list(teachers.values()), [1.0] * len(teachers), task, test, _cache(recipe, root))
    return {"more_teachers": more, "ensemble": {"teachers": list(teachers), "test": ensemble}}


def _teacher_seed_records(recipe: StudyRecipe, study_task: StudyTask, root: Path) -> dict[str, Any]:
    """With several teacher seeds: each seed's test scores, steps and wall time, and `test` their mean (T)."""
    models = _teacher_models(study_task, recipe, root)
    if len(models) == 1:
        return {}
    seeds = {str(seed): {"model": recorded(model, root), "test": _teacher_scores(recipe, study_task, model, root),
                         **_teacher_record(study_task, model)}
             for seed, model in zip(_teacher_seeds(recipe, study_task), models, strict=True)}
    tests = [seed["test"] for seed in seeds.values()]
    mean = {key: statistics.fmean(number(test[key]) for test in tests) for key in tests[0]
            if all(isinstance(test.get(key), int | float) for test in tests)}
    return {"test": mean, "teacher_seeds": seeds, "first_seed_test": tests[0]}


def _teacher_record(study_task: StudyTask, teacher: str) -> dict[str, Any]:
    """Wall time and steps of a teacher the study fine-tuned (nothing for a given teacher)."""
    if study_task.teacher is not None:
        return {"wall_seconds": None}
    metrics = read_json(Path(teacher).parent / "metrics.json")
    return {"wall_seconds": metrics.get("wall_seconds"), **_steps(metrics),
            "degenerate": metrics.get("degenerate") or ""}


def _steps(metrics: dict[str, Any]) -> dict[str, Any]:
    """A fine-tuning run's steps, and the step and dev score of the checkpoint it kept (where it chose on dev): a
    best step before the last says the run's dev score had stopped rising."""
    train = metrics.get("train") or {}
    return {"steps": metrics.get("steps", train.get("steps")), "best_step": train.get("best_step"),
            "best_dev": train.get("best_score")}


def _data_dir(recipe: StudyRecipe) -> dict[str, Any]:
    return {"data_dir": recipe.data_dir} if recipe.data_dir else {}


def _teacher_stage(recipe: StudyRecipe, task: str, init: str | None, overrides: dict[str, Any],
                   folder: Path, seed: int, needed: set[Path]) -> None:
    raw = deep_merge(deep_merge(recipe.defaults.get("finetune", {}), overrides), {
        "model": {"name_or_path": init},
        "run": {"output_dir": str(folder), "seed": seed},
        "task": {"name": task, **_data_dir(recipe)}})
    raw.setdefault("export", {})["enabled"] = True
    _stage("finetune", raw, folder)
    recorded = left_out_fingerprint(folder / "model")
    if recorded is not None and folder / "model" in needed:
        _fine_tune_again(raw, folder, recorded)


def _weights_needed(study_task: StudyTask, unfinished: list[StudyRun], root: Path) -> set[Path]:
    """The task's teachers carried without their weights (`kd.study_records`) that an unfinished kd run still reads:
    it names them and their outputs over its transfer set are not all in the study's store."""
    packed = {Path(path) for path in _teachers(study_task, root).values() if left_out_fingerprint(Path(path))}
    needed: set[Path] = set()
    for run in (run for run in unfinished if run.command == "kd"):
        kd = validate_recipe(KDRecipe, run.raw, source=f"study run {run.folder}")
        named = packed & {Path(entry.name_or_path) for entry in kd.teacher_entries()}
        if named - needed and not _outputs_stored(kd):
            needed |= named
    return needed


def _outputs_stored(kd: KDRecipe) -> bool:
    """Whether every teacher output the kd run reads is in the store (entries of teachers with weights are built)."""
    try:
        return prepare_teacher_outputs(kd)
    except WeightsLeftOut:
        return False


def _trained_threads(folder: Path) -> int | None:
    """The CPU threads a finished run trained with (its metrics' "2 throughout", "1 (OMP_NUM_THREADS)"; the first
    count where it changed: the fingerprint then tells whether the run could be repeated)."""
    threads = str((read_json(folder / "metrics.json").get("train") or {}).get("threads") or "")
    first = threads.split(" ", 1)[0].rstrip(",")
    return int(first) if first.isdigit() else None


def _fine_tune_again(raw: dict[str, Any], folder: Path, recorded: str) -> None:
    """A teacher carried without its weights (`kd.study_records`), fine-tuned again beside its records: its new
    weights take the place of the missing ones only when the folder's fingerprint is the recorded one."""
    again = folder.with_name(f"{folder.name}-again")
    threads = _trained_threads(folder)
    print(f"{folder}: its records came without the model's weights and a remaining run learns from it: fine-tuning it "
          f"again in {again} ({threads or 'its'} CPU threads, as it was)", flush=True)
    same = {"run": {"output_dir": str(again)}, **({"train": {"threads": threads}} if threads else {})}
    _stage("finetune", deep_merge(raw, same), again)  # the thread count it had: another may sum in another order
    found = teacher_fingerprint(again / "model")
    if found != recorded:
        raise BiodistilError(
            f"{folder}: fine-tuned again on this machine, the teacher's weights are not the ones the study's finished "
            f"runs learned from (fingerprint {found[:12]} against the recorded {recorded[:12]}; the new one is kept in "
            f"{again}): the remaining runs cannot learn from the same teacher here. Continue the study on a machine of "
            f"the kind that began it (its CPU and threads: {folder / 'provenance.json'}), or start it again")
    shutil.rmtree(folder / "model")
    os.replace(again / "model", folder / "model")
    shutil.rmtree(again)
    print(f"{folder}: fine-tuned again, the same weights to the bit (fingerprint {found[:12]})", flush=True)


def _arm_recipe(recipe: StudyRecipe, task: str, command: str, overrides: dict[str, Any], teacher: str,
                folder: Path, seed: int, root: Path) -> dict[str, Any]:
    """The raw recipe of one arm × seed: defaults, the study's student, the arm's overrides, then the fixed parts."""
    base = recipe.defaults.get(command, {})
    if command == "kd":
        base = deep_merge(base, {"student": {"name_or_path": recipe.student}})
        base = deep_merge({"kd": {"cache_dir": str(root / "cache")}}, base)
        own = "teacher" in overrides or "teachers" in overrides  # an arm with its own teacher(s)
        fixed = {} if own else {"teacher": {"name_or_path": teacher}}
    else:
        base = deep_merge(base, {"model": {"name_or_path": recipe.student}})
        fixed = {}
    fixed.update(run={"output_dir": str(folder), "seed": seed}, task={"name": task, **_data_dir(recipe)})
    return deep_merge(deep_merge(base, overrides), fixed)


def _stage(command: str, raw: dict[str, Any], folder: Path, quiet: bool = False) -> None:
    """One run of the study (it writes metrics.json): skipped when finished, resumed when an interrupted kd run has
    a checkpoint (finetune runs start again); `quiet`: without naming a damaged or missing record again."""
    recipe_cls, runner = (KDRecipe, run_kd) if command == "kd" else (FinetuneRecipe, run_finetune)

    def run(resume: bool) -> None:
        runner(validate_recipe(recipe_cls, raw, source=f"study run {folder}"), resume=resume)

    run_stage(folder, run, resumable=command == "kd", needs=RECORDS, quiet=quiet)


def _teacher_scores(recipe: StudyRecipe, study_task: StudyTask, teacher: str, root: Path) -> dict[str, float]:
    """T: the teacher on the test set the arms are scored on (the kd defaults' task settings)."""
    task, test = _test_split(recipe, study_task, [teacher])
    return teacher_test_scores(teacher, task, test, _cache(recipe, root))


def _test_split(recipe: StudyRecipe, study_task: StudyTask, teachers: list[str]) -> tuple[TaskSpec, list[Example]]:
    """The task as the kd defaults set it (its length fit to every teacher) and its test split."""
    return _split(recipe, study_task, teachers, "test")


def _split(recipe: StudyRecipe, study_task: StudyTask, teachers: list[str],
           split: Literal["test", "dev"]) -> tuple[TaskSpec, list[Example]]:
    section = recipe.defaults.get("kd", recipe.defaults.get("finetune", {})).get("task", {})
    cfg = TaskConfig.model_validate({**section, "name": study_task.name, **_data_dir(recipe)})
    task = task_spec(cfg)
    for teacher in teachers:
        task = fit_length_to_model(task, teacher)
    return task, load_task_split(task, cfg, split)


def _cache(recipe: StudyRecipe, root: Path) -> str:
    return recipe.defaults.get("kd", {}).get("kd", {}).get("cache_dir") or str(root / "cache")


def summarise(runs: list[dict[str, Any]], teachers: dict[str, dict[str, Any]], metric: str | None,
              ) -> list[dict[str, Any]]:
    """One row per task × arm: mean ± sd of the metric over seeds, mean S_init, T and the gap closed."""
    rows = []
    for task, arm in dict.fromkeys((r["task"], r["arm"]) for r in runs):
        group = [r for r in runs if r["task"] == task and r["arm"] == arm]
        teacher = teachers[task]["test"]
        key = metric or teachers[task].get("headline") or _headline(task)
        if any(key not in r["test"] for r in group) or key not in teacher:
            raise BiodistilError(f"Study metric '{key}' is not among the scores of task {task} "
                                 f"({sorted(teacher)}); set the study's metric")
        scores = [number(r["test"][key]) for r in group]
        inits = [number(r["init"].get(key)) for r in group]
        mean, init = statistics.fmean(scores), statistics.fmean(inits)
        target = number(teacher[key])
        per_seed = [gap_closed({key: s}, {key: i}, {key: target})[key] for s, i in zip(scores, inits, strict=True)]
        starts = _start_scores(group, scores)
        rows.append({"task": task, "arm": arm, "command": group[0]["command"], "metric": key, "seeds": len(group),
                     **starts,
                     "mean": mean, "sd": statistics.stdev(scores) if len(scores) > 1 else 0.0, "scores": scores,
                     "init": init, "teacher": target,
                     "degenerate_seeds": [r["seed"] for r in group if r.get("degenerate")],
                     "gap_closed": gap_closed({key: mean}, {key: init}, {key: target})[key],
                     "gap_closed_per_seed": per_seed})
    return rows


def _start_scores(group: list[dict[str, Any]], scores: list[float]) -> dict[str, Any]:
    """With several starts: each start's mean score over its seeds, and the scores as a grid of starts × seeds (the
    same seeds, in seed order, for every start: what its t-test takes)."""
    if all("start" not in run for run in group):
        return {}
    starts = list(dict.fromkeys(run["start"] for run in group))
    grid = [[s for _, s in sorted((run["seed"], s) for run, s in zip(group, scores, strict=True)
                                  if run["start"] == start)] for start in starts]
    return {"starts": len(starts), "start_scores": [statistics.fmean(row) for row in grid], "start_seed_scores": grid}


def compared_scores(row: dict[str, Any]) -> list[float] | list[list[float]]:
    """What a row's t-test compares (`tasks.significance.compare_scores`): its grid of starts × seeds when it has
    several starts (a record from before the grid was kept: its starts' means), else its per-seed scores."""
    return row.get("start_seed_scores") or row.get("start_scores") or row["scores"]


def _headline(task: str) -> str:
    return get_task(task).headline_key


RANKING_METRICS = ("auroc",)  # threshold-free: meaningful even when every prediction is one class


def render_study(summary: dict[str, Any], root: Path) -> str:
    own = [f"{arm['name']} {arm['seeds']}" for arm in summary.get("settings", {}).get("arms", []) if arm.get("seeds")]
    seeds = f"seeds {summary['seeds']}" + (f" ({'; '.join(own)})" if own else "")
    lines = ["# Study", "", f"Folder `{root}`; {seeds}. Scores are test-set means over seeds; "
             "gap closed = (S − S_init)/(T − S_init) with S the trained student, S_init its initialisation scored "
             "with no training, T the teacher.", "",
             "| task | arm | command | metric | mean ± sd | S_init | teacher T | gap closed | share of T on test "
             "(95% CI over seeds and test sentences) | share of T on dev |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in summary["rows"]:
        flag = ""
        if row.get("degenerate_seeds"):
            flag = " (one class)" if row["metric"] in RANKING_METRICS else " (degenerate)"
        lines.append(f"| {row['task']} | {row['arm']} | {row['command']} | {row['metric']} | {row['mean']:.4f} ± "
                     f"{row['sd']:.4f}{flag} | {row['init']:.4f} | {row['teacher']:.4f} | {row['gap_closed']:.3f} | "
                     f"{_share_cell(row.get('share'))} | {_share_cell(row.get('share_dev'))} |")
    lines += _gap_lines(summary)
    lines += _units_notes(summary)
    lines += _differences(summary["rows"], summary.get("looks", 1))
    notes = [_one_class_note(row) for row in summary["rows"] if row.get("degenerate_seeds")]
    notes += [f"- teacher of {task}: degenerate test predictions ({teacher['degenerate']})."
              for task, teacher in summary["teachers"].items() if teacher.get("degenerate")]
    if notes:
        lines += ["", "Degenerate predictions:", "", *notes]
    minutes = summary.get("wall_seconds", 0) / 60
    machine = summary.get("machine", {})
    lines += ["", f"Wall time of the runs: {minutes:.1f} minutes on {machine.get('cpu', '?')} "
              f"({machine.get('torch_threads', '?')} torch threads)."]
    if summary.get("side_by_side"):
        lines[-1] += " " + side_by_side_line(summary["side_by_side"])
    if len(summary.get("machines") or {}) > 1:  # run in parts on several machines
        lines += ["", "Its runs ran on several machines: " + "; ".join(
            f"{count} on {cpu}" for cpu, count in summary["machines"].items()) + "."]
    return "\n".join(lines) + "\n"


def _units_notes(summary: dict[str, Any]) -> list[str]:
    """What the teacher T and the rows with several starts stand for."""
    notes = [f"- {task}: T is the mean of {len(record['teacher_seeds'])} teacher seeds ("
             + ", ".join(f"seed {seed} {number(seed_record['test'][record['headline']]):.4f}"
                         for seed, seed_record in record["teacher_seeds"].items())
             + "); the share's interval draws them."
             for task, record in summary["teachers"].items() if record.get("teacher_seeds")]
    notes += [f"- {row['task']} / {row['arm']}: {row['starts']} starts × the same seeds ({row['seeds']} runs); the "
              "interval draws starts and seeds, crossed; its t-test takes the crossed variance of the mean (starts' "
              f"means {', '.join(f'{score:.4f}' for score in row['start_scores'])})."
              for row in summary["rows"] if row.get("starts")]
    return ["", *notes] if notes else []


def _gap_lines(summary: dict[str, Any]) -> list[str]:
    """The gap each arm closes from the recipe's `reference_arm`, on test and dev, with its interval."""
    rows = [row for row in summary["rows"] if "gap" in row]
    if not rows:
        return []
    return ["", f"Gap closed from `{summary['reference_arm']}`: (S − R)/(T − R) of the mean scores, R the reference "
            "arm's, T the teachers' (95% CI over both arms' runs, the teacher seeds and the sentences, paired).", "",
            "| task | arm | gap closed, test | gap closed, dev |", "|---|---|---|---|",
            *(f"| {row['task']} | {row['arm']} | {_share_cell(row['gap'])} | {_share_cell(row.get('gap_dev'))} |"
              for row in rows)]


def _share_cell(share: dict[str, Any] | None) -> str:
    if not share or "estimate" not in share:
        return "–"
    return f"{100 * share['estimate']:.1f}% ({100 * share['low']:.1f}% to {100 * share['high']:.1f}%)"


def _differences(rows: list[dict[str, Any]], looked: int = 1) -> list[str]:
    """Each arm against the task's first arm: the difference of the means and its verdict (Welch's t-test on the
    per-seed scores, `tasks.significance`: the arms share seeds, not their training data), at α/looked when the
    scores were looked at before they were final; a task's comparisons are one family (Holm)."""
    lines = []
    for task in dict.fromkeys(row["task"] for row in rows):
        first, *others = [row for row in rows if row["task"] == task]
        results = holm([compare_scores(compared_scores(row), compared_scores(first), looks=looked) for row in others])
        for row, result in zip(others, results, strict=True):
            lines.append(f"| {task} | {row['arm']} − {first['arm']} | "
                         f"{result.describe(' ' + row['metric'], digits=4)} |")
    if not lines:
        return []
    return ["", "Differences (a finding only when a t-test on the per-seed scores says so after Holm's adjustment "
            "within the task):", "", "| task | arms | difference |", "|---|---|---|", *lines]


def _one_class_note(row: dict[str, Any]) -> str:
    """What seeds that predicted one class for every test example mean for the row's score."""
    meaning = (f"at the decision threshold; the threshold-free {row['metric']} still measures how they rank the "
               "examples" if row["metric"] in RANKING_METRICS else "(their scores say nothing about the method)")
    return f"- {row['task']} / {row['arm']}: seeds {row['degenerate_seeds']} predicted one class for every test " \
           f"example {meaning}."


def plot_study(rows: list[dict[str, Any]], path: Path) -> Path:
    """One panel per task: each arm's mean test score ± its seed sd and the seeds as dots, the teacher (dashed) and
    the students' mean initialisation (dotted); PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(row["task"] for row in rows))
    figure, panels = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 0.45 * max(
        sum(row["task"] == task for row in rows) for task in tasks) + 2.2), dpi=120, squeeze=False)
    for axes, task in zip(panels[0], tasks, strict=True):
        group = [row for row in rows if row["task"] == task]
        places = range(len(group))
        axes.errorbar([row["mean"] for row in group], list(places), xerr=[row["sd"] for row in group], fmt="D",
                      color="tab:blue", capsize=4, label="mean ± sd", zorder=2)
        for place, row in zip(places, group, strict=True):
            axes.scatter(row["scores"], [place] * len(row["scores"]), color="black", s=12, zorder=3)
        axes.axvline(group[0]["teacher"], color="tab:red", linestyle="--", linewidth=1, label="teacher")
        axes.axvline(statistics.fmean(row["init"] for row in group), color="gray", linestyle=":", linewidth=1,
                     label="student initialisation")
        axes.set_yticks(list(places), [row["arm"] for row in group])
        axes.invert_yaxis()
        axes.set_xlabel(f"test {group[0]['metric']} (dots: seeds)")
        axes.set_title(task)
        axes.grid(axis="x", alpha=0.3)
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8, frameon=False)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
