"""Paths on the command line (issue 20): every command run with relative paths from the root of a workspace, again
from another folder (`../` paths), again with the absolute spelling of the same paths from a folder outside the
workspace (finished runs skipped, nothing refused, nothing trained again), and run folders moved elsewhere read back
(report, bench, evaluate --finetuned, a study's summary). Tiny models and a tiny pair task throughout."""

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from kd_fixtures import write_pair_task
from recipe_fixtures import data_root, needs_data

from biodistil.cli.main import main
from biodistil.paths import recalled

TRAIN = ("{max_steps: 4, batch_size: 8, warmup_steps: 0, eval_every: 0, save_every: 2, log_every: 1, "
         "progress_bar: false, tensorboard: false}")
TASK_TRAIN = ("{batch_size: 16, learning_rate: 0.001, warmup_steps: 0, eval_every: 0, save_every: 0, log_every: 1, "
              "progress_bar: false, tensorboard: false}")
TASK = "{name: {ws}tasks/tiny_qa.yaml, data_dir: {ws}data, max_length: 48}"

# Recipe files; `{ws}` is the workspace as the phase spells it: "" (working folder = workspace), "../" (working
# folder = workspace/elsewhere) or the absolute path with a final "/" (working folder outside the workspace). Paths
# inside a recipe are relative to the working folder; a pipeline stage's recipe file is relative to the pipeline file.
RECIPES = {
    "pretrain.yaml": f"""
run: {{output_dir: {{ws}}runs/pretrain, seed: 1}}
model:
  init: scratch
  tokenizer_name_or_path: {{ws}}models/teacher
  architecture: {{num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 32, max_position_embeddings: 64}}
data: {{train: [{{ws}}data/corpus.txt], block_size: 32, eval_fraction: 0, cache_dir: {{ws}}cache/corpus}}
train: {TRAIN}
""",
    "distill.yaml": f"""
run: {{output_dir: {{ws}}runs/distill, seed: 1}}
teacher: {{name_or_path: {{ws}}models/teacher, dtype: float32}}
student: {{init: teacher_layers, layers: [0, 2]}}
data: {{train: [{{ws}}data/corpus.txt], block_size: 32, eval_fraction: 0, cache_dir: {{ws}}cache/corpus}}
masking: {{duplication: 2}}
objective: {{terms: [{{loss: mlm}}, {{loss: logit_kl, positions: masked}}, {{loss: hidden_cosine}}]}}
teacher_cache: {{shard_blocks: 128, dir: {{ws}}cache/teacher}}
train: {TRAIN}
""",
    "pipeline.yaml": """
run: {output_dir: {ws}runs/pipeline}
stages:
  - {name: student, command: distill, recipe: distill.yaml}
  - name: evaluate
    command: evaluate
    settings:
      models: ["${student}"]
      tasks: ["{ws}tasks/tiny_qa.yaml"]
      data: {root: "{ws}data"}
      num_seeds: 1
      train: {epochs: 1, batch_size: 16, learning_rate: 0.001, progress_bar: false}
""",
    "finetune.yaml": f"""
model: {{name_or_path: {{ws}}models/student}}
task: {TASK}
finetune: {{epochs: 1, score_init: false}}
train: {TASK_TRAIN}
""",
    "transfer.yaml": f"""
task: {TASK}
transfer: {{source: {{kind: in_domain, split: train, max_examples: 32}}}}
""",
    "kd.yaml": f"""
teacher: {{name_or_path: {{ws}}models/ft-teacher}}
student: {{name_or_path: {{ws}}models/student}}
task: {TASK}
transfer: {{source: {{kind: saved, path: {{ws}}runs/transfer/transfer_set}}}}
kd: {{epochs: 1, cache_dir: {{ws}}cache/kd}}
train: {TASK_TRAIN}
""",
    "study.yaml": f"""
run: {{output_dir: {{ws}}runs/study}}
data_dir: {{ws}}data
seeds: [1]
resamples: 200
student: {{ws}}models/student
teacher_init: {{ws}}models/teacher
tasks: [{{name: bioasq, teacher_overrides: {{finetune: {{epochs: 1}}}}}}]
defaults:
  finetune: {{task: {{max_length: 48}}, finetune: {{epochs: 1}}, train: {TASK_TRAIN}}}
  kd: {{task: {{max_length: 48}}, kd: {{epochs: 1, cache_dir: {{ws}}cache/study}}, train: {TASK_TRAIN}}}
arms:
  - {{name: finetuned, command: finetune}}
  - {{name: distilled, command: kd, overrides: {{transfer: {{source: {{kind: saved,
      path: {{ws}}runs/transfer/transfer_set}}}}}}}}
""",
    "evaluate.yaml": """
run: {output_dir: {ws}runs/evaluate, seed: 3}
models: [{name: student, path: {ws}models/student}]
tasks: [{ws}tasks/tiny_qa.yaml]
num_seeds: 1
train: {epochs: 1, batch_size: 16, learning_rate: 0.001, progress_bar: false}
data: {root: {ws}data}
""",
}
FINISHED = "already holds a finished run"
DIFFERS = "recipe differs"
BENCH = ["--lengths", "16", "--warmup", "0", "--repeats", "1", "--throughput-batch", "2", "--device", "cpu",
         "--memory", "in-process"]  # paths are checked here; the fresh-process measurement in test_evaluation_bench


def write_recipes(folder: Path, ws: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in RECIPES.items():
        (folder / name).write_text(text.replace("{ws}", ws), encoding="utf-8")


def commands(recipes: str, ws: str) -> dict[str, list[str]]:
    """Every command of the workspace, spelled with recipe folder `recipes` and workspace `ws` (see RECIPES)."""
    return {
        "pretrain": ["pretrain", f"{recipes}pretrain.yaml"],
        "cache-teacher": ["cache-teacher", f"{recipes}distill.yaml"],
        "distill": ["distill", f"{recipes}distill.yaml"],
        "pipeline": ["pipeline", f"{recipes}pipeline.yaml"],
        "finetune": ["finetune", f"{recipes}finetune.yaml", "--out", f"{ws}runs/finetune"],
        "transfer": ["transfer", f"{recipes}transfer.yaml", f"run.output_dir={ws}runs/transfer"],
        "kd": ["kd", f"{recipes}kd.yaml", "--out", f"{ws}runs/kd"],
        "study": ["study", f"{recipes}study.yaml"],
        "evaluate": ["evaluate", f"{recipes}evaluate.yaml"],
        "report": ["report", f"{ws}runs/evaluate", "--out", f"{ws}reports/evaluate"],
        "bench": ["bench", f"{ws}models/student", f"{ws}runs/finetune/model", *BENCH, "--out",
                  f"{ws}reports/bench.json"],
        "export": ["export", f"{ws}runs/finetune/model", "--out", f"{ws}runs/onnx", "--int8", "--task",
                   f"{ws}tasks/tiny_qa.yaml", "--data", f"{ws}data", "--max-examples", "8"],
        "score": ["evaluate", "--finetuned", f"student={ws}runs/finetune/model", f"{ws}runs/onnx", "--task",
                  f"{ws}tasks/tiny_qa.yaml", "--data", f"{ws}data", "--max-examples", "8", "--out", f"{ws}runs/scored"],
    }


RESUMABLE = ("pretrain", "distill", "finetune", "kd", "study", "evaluate")  # refuse a finished run without --resume


def biodistil(cwd: Path, argv: list[str], expected: int = 0) -> tuple[str, str]:
    """Run `biodistil ARGV` in `cwd`; check its exit code; return (stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.chdir(cwd)
        code = main(argv)
    assert code == expected, f"`biodistil {' '.join(argv)}` in {cwd}: exit {code}\n{err.getvalue()[-4000:]}"
    return out.getvalue(), err.getvalue()


def training_records(ws: Path) -> dict[str, object]:
    """What changes when anything trains or is built again: the training steps the runs logged, and the files of
    finished stages, cells, transfer sets and caches (their modification times); and the runs' recipes."""
    records = training_records_of(ws / "runs")
    stamped = [*(ws / "cache").rglob("pattern-*/*"), *(ws / "cache").rglob("*.arrow")]
    records.update({str(p.relative_to(ws)): p.stat().st_mtime_ns for p in stamped})
    return records


def training_records_of(runs: Path, recipes: bool = True) -> dict[str, object]:
    """training_records for the run folders under `runs` (those of them that are there); `recipes`: with the runs'
    config.yaml (a moved run records its new run.output_dir there)."""
    records: dict[str, object] = {}
    for run in ("pretrain", "distill", "finetune", "kd", "pipeline/student"):
        if (runs / run).is_dir():
            lines = (runs / run / "metrics.jsonl").read_text().splitlines()
            records[f"{run} steps"] = [line for line in lines if json.loads(line)["split"] == "train"]
            assert records[f"{run} steps"], run
    stamped = [*runs.glob("study/**/metrics.json"), *runs.glob("evaluate/cells/**/*"),
               *runs.glob("pipeline/**/cells/**/metrics.json"), *runs.glob("transfer/transfer_set/**/*"),
               *runs.glob("pipeline/student/model/model.safetensors")]
    records.update({str(p.relative_to(runs)): p.stat().st_mtime_ns for p in stamped if p.is_file()})
    if recipes:
        records.update({str(p.relative_to(runs)): p.read_text() for p in runs.glob("**/config.yaml")})
    assert len(records) > 5, records
    return records


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, teacher_dir, kd_models, corpus_file) -> Path:
    """A workspace with tiny models, data, a task file and recipes, where every command ran once from its root with
    relative paths (phase 1)."""
    ws = tmp_path_factory.mktemp("paths") / "ws"
    ft_teacher, student = kd_models
    shutil.copytree(teacher_dir, ws / "models" / "teacher")
    shutil.copytree(student, ws / "models" / "student")
    shutil.copytree(ft_teacher, ws / "models" / "ft-teacher")
    (ws / "data").mkdir()
    shutil.copy(corpus_file, ws / "data" / "corpus.txt")
    spec = json.loads(write_pair_task(ws / "data" / "tiny_qa").read_text())
    (ws / "data" / "tiny_qa" / "tiny_qa.yaml").unlink()
    spec["files"] = {split: f"tiny_qa/{split}.json" for split in ("train", "dev", "test")}  # under the data folder
    (ws / "tasks").mkdir()
    (ws / "tasks" / "tiny_qa.yaml").write_text(json.dumps(spec), encoding="utf-8")
    bioasq = ws / "data" / "qa" / "bioasq"  # the built-in task bioasq (yes/no pairs) in the workspace's data folder
    bioasq.mkdir(parents=True)
    for split, name in (("train", "train"), ("dev", "devel"), ("test", "test")):
        shutil.copy(ws / "data" / "tiny_qa" / f"{split}.json", bioasq / f"{name}.json")
    write_recipes(ws / "recipes", "")
    (ws / "elsewhere").mkdir()

    outputs = {name: biodistil(ws, argv) for name, argv in commands("recipes/", "").items()}
    for run in ("pretrain", "distill", "finetune", "kd"):
        assert (ws / "runs" / run / "model" / "config.json").is_file(), run
    assert re.search(r"\(patterns \[0\], [1-9]\d* shards built here", outputs["cache-teacher"][0]), "built"
    assert "0 shards built here" in (ws / "runs" / "distill" / "report.md").read_text(), "distill read the cache"
    assert (ws / "runs" / "pipeline" / "pipeline.json").is_file()
    assert (ws / "runs" / "transfer" / "transfer_set" / "transfer.json").is_file()
    assert json.loads((ws / "runs" / "study" / "summary.json").read_text())["rows"]
    assert json.loads((ws / "runs" / "evaluate" / "results.json").read_text())["complete"]
    assert (ws / "reports" / "evaluate" / "report.md").is_file() and (ws / "reports" / "bench.json").is_file()
    assert (ws / "runs" / "onnx" / "model.int8.onnx").is_file()
    assert json.loads((ws / "runs" / "scored" / "results.json").read_text())["cells"]
    return ws


def rerun_everything(ws: Path, cwd: Path, recipes: str, spelled: str) -> None:
    """Every command again on the workspace's finished outputs, spelled with `recipes` and `spelled`, in `cwd`:
    runs resumed with --resume (nothing trains again, no recipe difference), the other commands repeated."""
    before = training_records(ws)
    scores = [c["score"] for c in json.loads((ws / "runs" / "scored" / "results.json").read_text())["cells"]]
    again = commands(recipes, spelled)
    for name in RESUMABLE:
        _, err = biodistil(cwd, again[name], expected=2)
        assert FINISHED in err or "already holds evaluation cells" in err, f"{name} without --resume: {err}"
        out, err = biodistil(cwd, [*again[name], "--resume"])
        assert DIFFERS not in err, f"{name} --resume refused: {err}"
        if name in ("pretrain", "distill", "finetune", "kd"):  # from the last checkpoint: nothing left to train
            assert "Resuming from" in out and "starting it again" not in err, f"{name} --resume: {out}{err}"
    out, _ = biodistil(cwd, again["cache-teacher"])
    assert re.search(r"\(patterns \[0\], 0 shards built here, [1-9]\d* reused", out), "the cache is complete"
    out, _ = biodistil(cwd, again["pipeline"])
    assert "stage 'student' already exported" in out, "the pipeline's finished stage is skipped"
    biodistil(cwd, [*again["pipeline"], "--out", f"{spelled}fresh/pipeline-{cwd.name}"])  # its stages run anew
    for stage in ("student", "evaluate"):
        first, fresh = (yaml.safe_load((ws / run / stage / "config.yaml").read_text())
                        for run in ("runs/pipeline", f"fresh/pipeline-{cwd.name}"))
        assert fresh["run"].pop("output_dir") == str(ws / "fresh" / f"pipeline-{cwd.name}" / stage)
        assert first["run"].pop("output_dir") == str(ws / "runs" / "pipeline" / stage)
        if stage == "evaluate":  # its model is the pipeline's own student
            assert [m.pop("path") for m in first["models"]] == [str(ws / "runs" / "pipeline" / "student" / "model")]
            assert [m.pop("path") for m in fresh["models"]] == [str(ws / "fresh" / f"pipeline-{cwd.name}" / "student"
                                                                    / "model")]
        assert fresh == first, f"pipeline stage {stage}: the same recipe whatever the spelling"
    _, err = biodistil(cwd, again["transfer"], expected=2)  # transfer has no --resume: a finished set is kept
    assert FINISHED in err and DIFFERS not in err
    biodistil(cwd, [*again["transfer"], f"run.output_dir={spelled}fresh/transfer-{cwd.name}"])  # a new set
    preview = [json.loads((ws / run / "summary.json").read_text())["preview"]
               for run in ("runs/transfer", f"fresh/transfer-{cwd.name}")]
    assert preview[0] == preview[1] and len(preview[0]) == 5, "the same transfer set"
    for name in ("report", "bench", "export", "score"):  # they write their outputs again, refusing nothing
        biodistil(cwd, again[name])
    assert "| student |" in (ws / "reports" / "evaluate" / "report.md").read_text()
    assert training_records(ws) == before, "nothing trained, cached or built again"
    assert scores == [c["score"] for c in json.loads((ws / "runs" / "scored" / "results.json").read_text())["cells"]]


@pytest.mark.slow
def test_every_command_runs_again_from_another_folder_with_relative_paths(workspace):
    write_recipes(workspace / "elsewhere" / "recipes", "../")
    rerun_everything(workspace, workspace / "elsewhere", "recipes/", "../")


@pytest.mark.slow
def test_every_command_runs_again_with_the_absolute_spelling(workspace, tmp_path):
    far = tmp_path / "far"
    write_recipes(far / "recipes", f"{workspace}/")
    rerun_everything(workspace, far, f"{far}/recipes/", f"{workspace}/")


@pytest.mark.slow
def test_moved_run_folders_are_read_back_and_continue(workspace):
    """A study, an evaluation, a pipeline and finetune/kd runs moved out of the workspace: their records lead to
    their runs and models, report/bench/evaluate --finetuned read them, and their commands continue them there."""
    ws, moved = workspace, workspace.parent / "moved"
    names = ("study", "evaluate", "pipeline", "finetune", "kd")
    moved.mkdir()
    for name in names:
        shutil.move(ws / "runs" / name, moved / name)
    try:
        summary = json.loads((moved / "study" / "summary.json").read_text())
        assert len(summary["runs"]) == 2 and summary["teachers"]
        for run in summary["runs"]:
            assert not Path(run["folder"]).is_absolute(), "a run of the study is recorded relative to it"
            assert (recalled(run["folder"], moved / "study") / "metrics.json").is_file(), run["folder"]
        for teacher in summary["teachers"].values():
            assert (recalled(teacher["model"], moved / "study") / "config.json").is_file(), teacher["model"]
        for run in ("finetune", "kd"):
            for record in ("metrics.json", "summary.json"):
                model_dir = json.loads((moved / run / record).read_text())["model_dir"]
                assert recalled(model_dir, moved / run) == moved / run / "model", (run, record)
        for stage in json.loads((moved / "pipeline" / "pipeline.json").read_text())["stages"]:
            assert (recalled(stage["folder"], moved / "pipeline") / "config.yaml").is_file(), stage["name"]

        cwd = moved.parent  # relative paths from the folder that holds the moved runs
        biodistil(cwd, ["report", "moved/evaluate", "moved/pipeline/evaluate", "--out", "moved-report"])
        assert "| student |" in (cwd / "moved-report" / "report.md").read_text()
        biodistil(cwd, ["bench", "moved/finetune/model", "moved/kd/model", *BENCH, "--out", "moved-bench.json"])
        assert len(json.loads((cwd / "moved-bench.json").read_text())["models"]) == 2
        biodistil(cwd, ["evaluate", "--finetuned", "moved/kd/model", "moved/study/bioasq/distilled/seed-1/model",
                        "--task", "ws/tasks/tiny_qa.yaml", "--data", "ws/data", "--out", "moved-scored"])
        assert len(json.loads((cwd / "moved-scored" / "results.json").read_text())["cells"]) == 2

        # continued where they are now (copies of the moved folders: this process holds the locks of the folders it
        # ran in until it ends, wherever they move)
        continued = moved.parent / "continued"
        for name in ("study", "evaluate", "finetune", "kd"):
            shutil.copytree(moved / name, continued / name)
        before = training_records_of(continued, recipes=False)
        for command in ("study", "evaluate", "finetune", "kd"):
            _, err = biodistil(ws, [command, f"recipes/{command}.yaml", "--out", f"../continued/{command}", "--resume"])
            assert DIFFERS not in err
        assert training_records_of(continued, recipes=False) == before, "the moved runs were continued, not run again"
        runs = json.loads((continued / "study" / "summary.json").read_text())["runs"]
        assert [recalled(run["folder"], continued / "study").is_dir() for run in runs] == [True, True]
    finally:
        for name in names:
            shutil.move(moved / name, ws / "runs" / name)
        moved.rmdir()


def study_of_the_task_file(folder: Path, ws: str, out: str) -> Path:
    """study.yaml with the task file tasks/tiny_qa.yaml instead of the built-in task, spelled with `ws`."""
    text = RECIPES["study.yaml"].replace("name: bioasq", "name: {ws}tasks/tiny_qa.yaml")
    text = text.replace("{ws}runs/study}", f"{{ws}}runs/{out}}}").replace("{ws}", ws)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{out}.yaml").write_text(text, encoding="utf-8")
    return folder / f"{out}.yaml"


@pytest.mark.slow
def test_a_study_of_a_task_file_resumes_with_the_absolute_spelling(workspace, tmp_path):
    ws = workspace
    biodistil(ws, ["study", str(study_of_the_task_file(ws / "recipes", "", "study-file").relative_to(ws))])
    stamps = {p: p.stat().st_mtime_ns for p in (ws / "runs" / "study-file").rglob("metrics.json")}
    assert len(stamps) == 3, "the teacher and two arms"
    recipe = study_of_the_task_file(tmp_path / "far", f"{ws}/", "study-file")
    _, err = biodistil(tmp_path / "far", ["study", str(recipe), "--resume"])
    assert DIFFERS not in err
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps, "finished runs are skipped"


@pytest.mark.slow
def test_a_study_of_a_task_file_keeps_its_runs_in_its_folder_from_another_folder(workspace):
    ws, study = workspace, workspace / "runs" / "study-file-elsewhere"
    recipe = study_of_the_task_file(ws / "elsewhere" / "recipes", "../", study.name)
    biodistil(ws / "elsewhere", ["study", str(recipe.relative_to(ws / "elsewhere"))])
    summary = json.loads((study / "summary.json").read_text())
    folders = [run["folder"] for run in summary["runs"]] + [t["model"] for t in summary["teachers"].values()]
    assert len(folders) == 3
    for folder in folders:
        assert not Path(folder).is_absolute() and ".." not in Path(folder).parts, f"{folder} is outside {study}"
        assert recalled(folder, study).is_dir()


@needs_data
@pytest.mark.slow
def test_the_quick_demo_continues_with_any_spelling_of_its_folder(tmp_path):
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    other.mkdir()
    data = data_root()
    biodistil(work, ["demo", "--quick", "--out", "runs/demo", "--data", os.path.relpath(data, work)])
    demo = work / "runs" / "demo"
    report = json.loads((demo / "report.json").read_text())
    assert [row["model"] for row in report["rows"]] == ["teacher", "distilled student", "student without teacher"]
    written = {demo / "report.json", demo / "report.md"}
    stamps = {p: p.stat().st_mtime_ns for p in demo.rglob("*") if p.is_file() and p not in written}
    for cwd, out in ((other, str(demo)), (other, "../work/runs/demo")):
        _, err = biodistil(cwd, ["demo", "--quick", "--out", out, "--data", str(data)])
        assert DIFFERS not in err and FINISHED not in err
        assert {p: p.stat().st_mtime_ns for p in demo.rglob("*") if p.is_file() and p not in written} == stamps, \
            f"demo --quick --out {out} in {cwd} ran a stage again"
        assert json.loads((demo / "report.json").read_text())["rows"] == report["rows"]
    assert not (other / "runs").exists()

    # issue 38: `cp -r runs/demo ../other/copied/` with its distillation stage unfinished (its model and summary gone,
    # its checkpoints kept), then the demo from the new place: the stage continues there, its recorded teacher and
    # corpus cache (inside the demo's folder) compared by their new place
    copied = other / "copied" / "demo"
    shutil.copytree(demo, copied)
    shutil.rmtree(copied / "student" / "model")
    (copied / "student" / "summary.json").unlink()
    _, err = biodistil(other, ["demo", "--quick", "--out", "copied/demo", "--data", str(data)])
    assert DIFFERS not in err and "--resume" not in err
    assert (copied / "student" / "model" / "config.json").is_file(), "the stage finished in the copy"
    assert yaml.safe_load((copied / "student" / "config.yaml").read_text())["teacher"]["name_or_path"] == \
        str(copied / "teacher" / "model"), "the continued stage records its new place"


JOB_STUDY = f"""
run: {{output_dir: job/study}}
data_dir: job/data
seeds: [1]
resamples: 200
student: job/student
teacher_init: job/teacher
tasks: [{{name: bioasq, teacher_overrides: {{finetune: {{epochs: 1}}}}}}]
defaults:
  finetune: {{task: {{max_length: 48}}, finetune: {{epochs: 1}}, train: {TASK_TRAIN}}}
  kd: {{task: {{max_length: 48}}, kd: {{epochs: 1, cache_dir: job/cache}}, train: {TASK_TRAIN}}}
arms:
  - {{name: finetuned, command: finetune}}
  - {{name: distilled, command: kd, overrides: {{transfer: {{source: {{kind: saved, path: job/transfer_set}}}}}}}}
"""


@pytest.mark.slow
def test_a_copied_job_whose_paths_lie_in_its_own_folder_runs_again_from_its_new_place(workspace, tmp_path):
    """Issue 38, case 1 (as the demo is: a study whose student, cache and transfer set lie in the job's folder): a
    finished job copied with `cp -r` elsewhere, one arm's record gone, and the command run again from the new place
    with relative paths (`--resume`, as for any finished study). The arm runs again there; its recorded recipe names
    the old place, which is no difference."""
    ws = workspace
    job = tmp_path / "first" / "job"
    for source, name in (("models/student", "student"), ("models/teacher", "teacher"), ("data", "data"),
                         ("runs/transfer/transfer_set", "transfer_set")):
        shutil.copytree(ws / source, job / name)
    (tmp_path / "first" / "study.yaml").write_text(JOB_STUDY, encoding="utf-8")
    biodistil(tmp_path / "first", ["study", "study.yaml"])
    arm = Path("job/study/bioasq/distilled/seed-1")
    assert (tmp_path / "first" / arm / "metrics.json").is_file()

    copy = tmp_path / "elsewhere" / "copy"  # `cp -r first ../elsewhere/copy`: the whole job under another name
    shutil.copytree(tmp_path / "first", copy)
    for record in ("metrics.json", "summary.json"):  # a kill before its records: this arm must run again
        (copy / arm / record).unlink()
    _, err = biodistil(copy, ["study", "study.yaml"], expected=2)
    assert FINISHED in err, "a finished study is continued with --resume"
    _, err = biodistil(copy, ["study", "study.yaml", "--resume"])
    assert DIFFERS not in err
    assert (copy / arm / "metrics.json").is_file() and (copy / arm / "summary.json").is_file(), \
        "the arm ran again in the copy"
    recorded_config = yaml.safe_load((copy / arm / "config.yaml").read_text())
    assert recorded_config["run"]["output_dir"] == str(copy / arm), "the copy's own run folder"
    assert not (tmp_path / "first" / arm / "metrics.json").stat().st_mtime_ns > \
        (copy / arm / "metrics.json").stat().st_mtime_ns, "the original was not touched"
