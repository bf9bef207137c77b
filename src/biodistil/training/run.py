"""Run folders: the resolved recipe, metrics, checkpoints, the exported model and a short report; and the one way
a multi-stage job (demo, study, pipeline, evaluate) runs each of its stages in a folder of its own."""

import errno
import operator
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from accelerate import Accelerator
from accelerate.utils import set_seed

from biodistil.config import Section, dump_recipe
from biodistil.errors import BiodistilError
from biodistil.io import (
    atomic_write_json,
    atomic_write_text,
    clear_folder,
    jsonable,
    lock_folder,
    read_record,
    read_text,
)
from biodistil.training.checkpoint import latest_checkpoint
from biodistil.training.engine import TrainResult, accelerate_state_kept, make_accelerator
from biodistil.training.provenance import provenance

# training settings that a resumed run may change: they only say how often to report and keep, never what is learned
# bookkeeping, and how batches are loaded (the workers make the same batches and masks: seeded per micro-step; a run
# begun before `train.num_workers: auto` recorded 0); and a study's `reference_arm`, what its summary compares
SAFE_TO_CHANGE_ON_RESUME = ("train.progress_bar", "train.log_every", "train.save_every", "train.keep_checkpoints",
                            "train.tensorboard", "train.eval_batches", "train.num_workers", "reference_arm")


SUMMARY = "summary.json"  # written last by every job (`JobFolder.finish`): the one "finished" marker (`finished`)


class JobFolder:
    """One job's output folder (a training run, a study, an evaluation, a deployment): taken before anything is read
    (created and locked, so a second process writing here is refused, naming this one), its recipe (`config.yaml`)
    and provenance recorded (`record`), and finished by `finish`, which writes `summary.json` last."""

    def __init__(self, path: str | Path, recipe: Section | None, is_main: bool = True,
                 setting: str = "run.output_dir", what: str = "run folder"):
        """`setting`: what names the folder (in the message when it cannot be written); `what`: the folder's kind
        (in the message that refuses a second writer); `recipe` None: a job of command-line options alone."""
        self.path = Path(path)
        self.recipe = recipe
        if is_main:
            make_folder(self.path, setting)
            lock_folder(self.path, what)

    def record(self) -> None:
        """Write the job's recipe (`config.yaml`) and provenance (`provenance.json`)."""
        if self.recipe is None:
            return
        dump_recipe(self.recipe, self.path / "config.yaml")
        atomic_write_json(self.path / "provenance.json", provenance(self.recipe))

    def write_summary(self, summary: dict) -> None:
        atomic_write_json(self.path / SUMMARY, summary)

    def finish(self, summary: dict, report: "Report", metrics: dict | None = None) -> None:
        """`metrics.json` (when given), `report.md`, and `summary.json` last: a kill at any point leaves a job that
        counts as unfinished (`finished`) until everything is written."""
        if metrics is not None:
            atomic_write_json(self.path / "metrics.json", metrics)
        self.write_report(report)
        self.write_summary(summary)

    def write_report(self, report: "Report") -> None:
        """report.md: the command, the rows, what the machine decided for the training (`report.trained`: threads,
        the GPU's peak memory, precision, compile, dropout, loader workers) and the notes."""
        import torch

        trained = report.trained
        rows = {**report.rows, "CPU threads": (trained and trained.threads) or torch.get_num_threads()}
        if trained is not None and trained.peak_gpu_memory_mb is not None:
            rows["GPU"] = (f"{torch.cuda.get_device_name()}, peak memory {trained.peak_gpu_memory_mb:,.0f} MiB "
                           "(torch.cuda.max_memory_allocated)")
        if trained is not None:
            decided = {"training precision": trained.precision, "train.compile": trained.compiled,
                       "train.dropout": trained.dropout, "train.num_workers": trained.loader or None}
            rows.update({key: value for key, value in decided.items() if value is not None})
        lines = [f"# {report.title}", "", f"Command: `{' '.join(sys.argv)}`", "", "| | |", "|---|---|",
                 *(f"| {key} | {value} |" for key, value in rows.items())]
        atomic_write_text(self.path / "report.md", "\n".join([*lines, *(["", *report.notes] if report.notes else [])])
                          + "\n")


class RunFolder(JobFolder):
    """One run's output folder, whatever an earlier run left there:

    * nothing (or no `config.yaml`): a new run;
    * a run that stopped before its first checkpoint (a bad input, a crash, kill -9): emptied and started again,
      by the same command or with `resume`;
    * a run with a checkpoint: continued with `resume` (`self.resume` tells the engine), refused without it;
    * a finished run: refused, unless `resume` (which finds nothing left to train and writes the outputs again).

    Resuming refuses a recipe that differs from the run's `config.yaml`, listing the differences, except for
    the bookkeeping settings of `SAFE_TO_CHANGE_ON_RESUME`. `stages=True` marks a multi-stage job (a study):
    its stages keep their own checkpoints, so an unfinished job that began a stage is always continued, never
    emptied; one refused before its first stage (a setting its first run cannot use) starts again.
    """

    def __init__(self, path: str | Path, recipe: Section, resume: bool = False, is_main: bool = True,
                 stages: bool = False):
        super().__init__(path, recipe, is_main)
        checkpoint = latest_checkpoint(self.path)
        earlier = (self.path / "config.yaml").exists()
        if is_main and checkpoint is not None and not earlier:
            raise BiodistilError(
                f"Run folder {self.path} holds checkpoints ({checkpoint.name}) but no config.yaml, the record of the "
                "recipe they were trained with, so they can be neither continued nor trusted; move the folder away "
                "(or choose another run.output_dir, --out) to start again")
        done = earlier and finished(self.path) is not None
        started = checkpoint is not None or (stages and _stage_started(self.path))
        self.resume = started and earlier and (resume or (stages and not done))
        if earlier and is_main:
            if done and not resume:
                raise BiodistilError(
                    f"Run folder {self.path} already holds a finished run (see {self.path / 'report.md'}); choose "
                    "another run.output_dir (--out), or remove the folder to run it again")
            if checkpoint is not None and not resume and not stages:
                raise BiodistilError(
                    f"Run folder {self.path} holds a run interrupted at step {_step(checkpoint)}; continue it with "
                    "--resume, or choose another run.output_dir (--out)")
            if self.resume:
                _check_same_recipe(self.path / "config.yaml", recipe)
            else:  # stopped (or refused) before its first checkpoint or stage: nothing to keep
                first = "stage" if stages else "checkpoint"
                print(f"{self.path} holds a run that stopped before its first {first}; starting it again",
                      file=sys.stderr)
                clear_folder(self.path)
        if is_main:
            self.record()
        set_seed(recipe.run.seed)  # type: ignore[attr-defined]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def finish(self, summary: dict, report: "Report", metrics: dict | None = None,  # type: ignore[override]
               save_model: Callable[[Path], None] | None = None) -> Path:
        """Finish the run, always in this order, so that a kill at any point leaves a run that counts as unfinished
        until everything is written: the model (`save_model(model_dir)`), its card (from `metrics`, else the
        summary), then `JobFolder.finish`: `metrics.json`, `report.md`, and `summary.json` last — the only
        "finished" marker (`finished`). Returns the model folder."""
        from biodistil.training.card import write_model_card

        if save_model is not None:
            save_model(self.model_dir)
        if (self.model_dir / "config.json").is_file():
            write_model_card(self.path, metrics=jsonable(metrics if metrics is not None else summary))
        super().finish(summary, report, metrics)
        return self.model_dir

def single_process(command: str) -> None:
    """Refuse at once to run `command` under several processes (accelerate launch / torchrun)."""
    processes = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if processes > 1:
        raise BiodistilError(
            f"{command} runs in one process, but was started as {processes} (accelerate launch / torchrun): each "
            f"process would repeat every job and write the same files. Run `biodistil {command} ...` directly; "
            "pretrain, distill, cache-teacher, kd and finetune train across processes, and evaluate and study share "
            "their runs out over them")


def make_folder(path: Path, setting: str) -> None:
    """Create `path` (and its parents), or say which setting names an unusable folder and why."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".biodistil-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise BiodistilError(f"Cannot write to {setting} {path}: {output_problem(err)}") from None


def output_problem(err: OSError) -> str:
    """What an OSError raised while writing outputs means, and what to do about it."""
    reasons = {
        errno.EACCES: "permission denied; choose a folder you can write to",
        errno.EPERM: "operation not permitted; choose a folder you can write to",
        errno.EROFS: "the file system is read-only; choose a folder on a writable disk",
        errno.ENOSPC: "the disk is full; free space or choose a folder on another disk",
        errno.EDQUOT: "the disk quota is exhausted; free space or choose a folder on another disk",
        errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
        errno.EEXIST: "a file of that name is in the way; choose another path",
        errno.EISDIR: "a folder is where a file should go; choose another path",
        errno.ENOENT: "no such file or folder, and it cannot be created there; choose another path",
    }
    where = f" ({err.filename})" if err.filename else ""
    return f"{reasons.get(err.errno, err.strerror or str(err))}{where}"


@dataclass(frozen=True)
class Report:
    """What a run's report.md says: a title, rows, notes, and what the machine decided for its training."""

    title: str
    rows: dict[str, object]
    notes: Sequence[str] = ()
    trained: TrainResult | None = None


def open_run(recipe: Section, resume: bool, models: Sequence[tuple[str, str, bool]] = ()) -> tuple[RunFolder,
                                                                                                   Accelerator]:
    """Open a training run, always in this order: check the models it names (`(name_or_path, setting,
    trust_remote_code)`: a missing one is an error before anything starts), the accelerator (device, precision,
    process group), the run folder (lock, recorded recipe and provenance, seed)."""
    from biodistil.models.loading import check_model

    for name_or_path, setting, trust_remote_code in models:
        check_model(name_or_path, setting, trust_remote_code)
    train = recipe.train  # type: ignore[attr-defined]
    accelerator = make_accelerator(train.precision, Path(recipe.run.output_dir), train.tensorboard,  # type: ignore
                                   train.device)
    return RunFolder(recipe.run.output_dir, recipe, resume, accelerator.is_main_process), accelerator  # type: ignore


def finished(path: Path, marker: str = SUMMARY, needs: Sequence[str] = (), quiet: bool = False) -> dict | None:
    """The record that marks the job in `path` finished, or None when it is unfinished: every reader of "finished"
    (run folders, pipeline and demo stages, study arms, evaluation cells) asks here. The marker (`summary.json`,
    written last by `JobFolder.finish`; an evaluation cell's `metrics.json`) must be there, readable and not marked
    unfinished (a run stopped early with --stop-after); each of `needs` (records written before the marker that the
    caller reads) must be there and readable too. A damaged or missing record is named (unless `quiet`: it was named
    when the caller counted what would run): its job runs again."""
    record = read_record(Path(path) / marker, note=None if quiet else "the run counts as unfinished and runs again")
    if not isinstance(record, dict) or record.get("finished", True) is False:
        return None
    for name in needs:
        if not isinstance(read_record(Path(path) / name, note=None if quiet else "the finished run runs again to "
                                      "write it"), dict):
            if not quiet and not (Path(path) / name).is_file():
                print(f"{Path(path) / name}: missing; the finished run runs again to write it", flush=True)
            return None
    return record


def _stage_started(path: Path) -> bool:
    """Whether a multi-stage job (a study) began any stage: a folder below it holds a run's recorded recipe. A job
    refused before that (a bad setting found by its first stage) keeps nothing worth continuing."""
    return any(found.parent != path for found in path.rglob("config.yaml"))


def _step(checkpoint: Path) -> int:
    return int(checkpoint.name.rsplit("-", 1)[-1])


def recipe_differences(before: dict[str, Any], after: dict[str, Any], prefix: str = "",
                       same: Callable[[Any, Any], bool] = operator.eq) -> list[str]:
    """`key: old -> new` for every leaf setting that differs between two recipe dictionaries (`same` says whether two
    leaves are equal)."""
    lines = []
    for key in sorted(set(before) | set(after), key=str):
        name = f"{prefix}{key}"
        old, new = before.get(key), after.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            lines += recipe_differences(old, new, f"{name}.", same)
        elif not same(old, new):
            lines.append(f"{name}: {old!r} -> {new!r}")
    return lines


def moved_paths(old_folder: str, new_folder: str) -> Callable[[Any, Any], bool]:
    """Equality of two recorded settings for a job folder that was moved or copied from `old_folder` to `new_folder`:
    a path under the folder that moved (what precedes the two folders' common tail of names: `/a/runs` for
    `/a/runs/demo/study` → `/b/demo/study`) equals the same path under its new place; lists compare item by item.
    The job's own records (its stages' models, caches, sets) then match from wherever the job is."""
    old_parts, new_parts = Path(old_folder).parts, Path(new_folder).parts
    tail = 0
    while tail < min(len(old_parts), len(new_parts)) - 1 and old_parts[-1 - tail] == new_parts[-1 - tail]:
        tail += 1
    old_base, new_base = Path(*old_parts[:len(old_parts) - tail]), Path(*new_parts[:len(new_parts) - tail])

    def same(old: Any, new: Any) -> bool:
        if old == new:
            return True
        if isinstance(old, list) and isinstance(new, list):
            return len(old) == len(new) and all(same(a, b) for a, b in zip(old, new, strict=True))
        if isinstance(old, dict) and isinstance(new, dict):
            return not recipe_differences(old, new, same=same)
        if isinstance(old, str) and isinstance(new, str) and old.startswith("/") and old_base != new_base:
            try:
                return str(new_base / Path(old).relative_to(old_base)) == new
            except ValueError:
                return False
        return False

    return same


def _with_new_defaults(before: dict[str, Any], recipe: Section) -> dict[str, Any]:
    """The saved recipe as this version of biodistil reads it: validated like `recipe`, so a setting added since the
    run started (absent from its config.yaml) has its default rather than counting as a change. A record that no
    longer validates (damaged, or naming paths that are gone) is compared as written."""
    try:
        return yaml.safe_load(yaml.safe_dump(type(recipe).model_validate(before).model_dump(mode="json"),
                                             sort_keys=False))
    except (ValueError, BiodistilError):  # pydantic's ValidationError is a ValueError
        return before


def _check_same_recipe(saved: Path, recipe: Section) -> None:
    """Refuse to continue the run of `saved` (its config.yaml) with another recipe, naming each difference; a job
    folder moved or copied elsewhere compares its own paths by their new place (`moved_paths`)."""
    advice = ("restore it from a copy, or start the run again in another output folder (run.output_dir, --out): "
              "without the record of their recipe its checkpoints cannot be continued")
    text = read_text(saved, "record of the run's recipe", advice)
    try:
        before = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise BiodistilError(f"{saved}: the record of the run's recipe is damaged (not YAML: "
                             f"{str(err).splitlines()[0]}); {advice}") from None
    after = yaml.safe_load(yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))
    if not isinstance(before, dict):
        raise BiodistilError(f"{saved}: the record of the run's recipe is damaged (not a recipe); {advice}")
    old_folder = (before.get("run") or {}).get("output_dir") if isinstance(before.get("run"), dict) else None
    same = moved_paths(old_folder, after["run"]["output_dir"]) if isinstance(old_folder, str) else operator.eq
    before = recipe.continued_from(_with_new_defaults(before, recipe))
    changed = [line for line in recipe_differences(before, after, same=same)
               if not line.startswith(SAFE_TO_CHANGE_ON_RESUME) and not line.startswith("run.output_dir:")]
    if not changed:
        return
    lost = [key for key in after if key not in before]
    if lost:
        raise BiodistilError(f"{saved}: the record of the run's recipe lacks its sections {', '.join(lost)}: it is cut "
                             f"short or damaged, so this recipe cannot be checked against it; {advice}")
    raise BiodistilError(
        f"The recipe differs from the one the run in {saved.parent} started with:\n  " + "\n  ".join(changed)
        + "\nA continued run would mix the two. Continue it with the run's settings (they are in " + str(saved)
        + "), or start a new run in another output folder (run.output_dir, --out). Only "
        + ", ".join(SAFE_TO_CHANGE_ON_RESUME) + " may change when a run is continued.")


def run_stage(folder: Path, run: Callable[[bool], object], resumable: bool = True, marker: str = SUMMARY,
              needs: Sequence[str] = (), check: Callable[[dict], object] | None = None, quiet: bool = False) -> bool:
    """Run one stage of a multi-stage job in `folder`: skip it when `finished(folder, marker, needs)` (after
    `check(record)`, which may refuse a finished stage run with other settings); resume it (`run(True)`) when it was
    interrupted after a checkpoint and `resumable`; otherwise start it (`run(False)`) in an emptied folder. Returns
    whether it ran. A stage that cannot resume (`resumable=False`) always restarts from scratch. `quiet`: see
    `finished`. Accelerate's process-wide state is put back after the stage (`engine.accelerate_state_kept`)."""
    record = finished(folder, marker, needs, quiet)
    if record is not None:
        if check is not None:
            check(record)
        return False
    resume = resumable and latest_checkpoint(folder) is not None
    if folder.exists() and not resume:
        shutil.rmtree(folder)
    with accelerate_state_kept():
        run(resume)
    return True
