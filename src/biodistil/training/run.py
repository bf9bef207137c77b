"""Run folders: the resolved recipe, metrics, checkpoints, the exported model and a short report; and the one way
a multi-stage job (demo, study, pipeline, evaluate) runs each of its stages in a folder of its own."""

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from accelerate.utils import set_seed

from biodistil.config import Section, dump_recipe
from biodistil.errors import BiodistilError
from biodistil.io import atomic_write_json, atomic_write_text
from biodistil.training.checkpoint import latest_checkpoint


class RunFolder:
    """One run's output folder. A new run refuses a folder that already holds a run, unless resuming."""

    def __init__(self, path: str | Path, recipe: Section, resume: bool = False, is_main: bool = True):
        self.path = Path(path)
        self.recipe = recipe
        if not resume and (self.path / "config.yaml").exists():
            raise BiodistilError(
                f"Run folder {self.path} already holds a run; pass --resume to continue it or choose another "
                "run.output_dir"
            )
        if resume and not (self.path / "config.yaml").exists():
            raise BiodistilError(f"--resume: {self.path} holds no run to resume")
        if is_main:
            self.path.mkdir(parents=True, exist_ok=True)
            dump_recipe(recipe, self.path / "config.yaml")
        set_seed(recipe.run.seed)  # type: ignore[attr-defined]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def write_summary(self, summary: dict) -> None:
        atomic_write_json(self.path / "summary.json", summary)

    def write_report(self, title: str, rows: dict[str, object], notes: list[str] = ()) -> None:
        lines = [f"# {title}", "", f"Command: `{' '.join(sys.argv)}`", "", "| | |", "|---|---|"]
        lines += [f"| {key} | {value} |" for key, value in rows.items()]
        if notes:
            lines += ["", *notes]
        atomic_write_text(self.path / "report.md", "\n".join(lines) + "\n")


def run_stage(folder: Path, finished: Callable[[], bool], run: Callable[[bool], object],
              resumable: bool = True) -> bool:
    """Run one stage of a multi-stage job in `folder`: skip it when `finished()`; resume it (`run(True)`) when it
    was interrupted after a checkpoint and `resumable`; otherwise start it (`run(False)`) in an emptied folder.
    Returns whether it ran. A stage that cannot resume (`resumable=False`) always restarts from scratch."""
    if finished():
        return False
    resume = resumable and latest_checkpoint(folder) is not None
    if folder.exists() and not resume:
        shutil.rmtree(folder)
    run(resume)
    return True
