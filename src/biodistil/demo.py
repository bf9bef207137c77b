"""`biodistil demo`: does distillation work here? A real pretrained teacher, offline, on 2 CPU cores.

The question a user brings: how much of the teacher does a student of half its depth keep, and what does the
teacher add over training the same student without it? The demo answers it on NCBI-disease (entity-level F1,
strict IOB2, the full test set) in one `biodistil study`:

1. teacher: the embedded all-MiniLM-L6-v2 encoder (6 × 384, `minilm-l6`) fine-tuned on a labelled budget of
   training sentences (a seeded subset), model selection on the dev set;
2. student: the teacher's pre-trained layers 0, 2, 4 (3 × 384), trained three ways from the same start, with
   the same optimizer settings and the same number of steps, for every seed:
   - *distilled*: Hinton KD, 0.5·T²·KL(teacher ‖ student) + 0.5·CE(gold), on the labelled budget;
   - *without teacher*: fine-tuned on the labelled budget alone (the same data and steps, no teacher term);
   - with `--label-free`, *distilled without labels*: label-free Hinton KD on the task's whole training text with
     its labels dropped, so the student never sees a gold label (as when a teacher's data cannot be shared);
   teacher outputs are computed once per transfer set and cached for every seed;
3. speed: parameters, CPU latency at batch 1 and throughput at batch 32 (`biodistil bench`).

Every stage is an ordinary run folder under DIR, so an interrupted demo continues where it stopped. The plan
below was fixed from measured step times (see docs/demo.md) and not tuned on the test set. `--quick` runs the
self-contained toy path instead (demo_quick.py: pre-train, distil, fine-tune tiny models in under a minute).
"""

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from biodistil.config import validate_recipe
from biodistil.data.paths import resolve_data_root
from biodistil.demo_quick import run_quick_demo
from biodistil.errors import BiodistilError
from biodistil.evaluation.bench import run_bench
from biodistil.evaluation.recipe import BenchConfig
from biodistil.io import atomic_write_json, atomic_write_text
from biodistil.kd.recipe import StudyRecipe
from biodistil.kd.study import run_study
from biodistil.methods.finetune import init_model_path
from biodistil.models.embedded import resolve_model_name
from biodistil.tasks.registry import get_task

TASK = "ncbi_disease"


@dataclass(frozen=True)
class DemoPlan:
    """The demo's budget: every cap is stated in the report."""

    teacher: str = "minilm-l6"
    student_layers: tuple[int, ...] = (0, 2, 4)
    labelled: int = 1500  # labelled training sentences (a seeded subset); dev and test are smaller, so kept whole
    max_length: int = 128
    teacher_batch_size: int = 16
    teacher_learning_rate: float = 1e-4
    teacher_epochs: float = 2.0
    student_batch_size: int = 32  # a step's fixed cost (the AdamW update of the embeddings) shared by more tokens
    student_learning_rate: float = 2e-4  # the teacher's rate scaled with the batch
    student_epochs: float = 3.0  # over the labelled sentences; every student arm trains this many steps
    temperature: float = 2.0
    seeds: tuple[int, ...] = (1, 2)
    label_free: bool = False  # add the arm distilled without labels (≈ 3 more minutes per seed on 2 cores)
    transfer: int | None = None  # its training sentences, labels dropped (None: the whole training split)


PLAN = DemoPlan()


def run_demo(out: str | Path, data: str | Path | None = None, quick: bool = False, label_free: bool = False,
             plan: DemoPlan = PLAN) -> Path:
    """Run (or continue) the demo in `out`; returns the path of its Markdown report."""
    plan = replace(plan, label_free=plan.label_free or label_free)
    if quick:
        return run_quick_demo(out, data)
    out = Path(out)
    root = resolve_data_root(data)
    task = get_task(TASK)
    if not task.is_available(root):
        raise BiodistilError(f"NCBI-disease is missing under {root}: expected {task.missing_files(root)}")
    started = time.perf_counter()
    timings: dict[str, float] = {}
    student_init = _timed(timings, "student from teacher layers",
                          lambda: init_model_path(plan.teacher, list(plan.student_layers), out))
    train_size = len(task.load_split("train", root))
    study = _timed(timings, "study", lambda: _run_study(plan, out, root, student_init, train_size))
    summary = json.loads((study.parent / "summary.json").read_text())
    models = _models(summary, plan)
    bench = _timed(timings, "bench", lambda: _bench(out, models))
    report = {"plan": asdict(plan), "task": TASK, "data": str(root), "train_sentences": train_size,
              "models": _rows(summary, models, bench), "stages": _stage_times(summary),
              "demo_minutes": round((time.perf_counter() - started) / 60, 2), "timings": timings,
              "bench": {"device": bench["device"], "settings": bench["settings"]}}
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", render_report(report))
    return out / "report.md"


def _timed(timings: dict[str, float], name: str, step):
    began = time.perf_counter()
    result = step()
    timings[name] = round(time.perf_counter() - began, 1)
    return result


def study_recipe(plan: DemoPlan, out: Path, root: Path, student: str, train_size: int) -> dict[str, Any]:
    """The demo as a `biodistil study` recipe: the teacher, then the three student arms × seeds."""
    labelled = min(plan.labelled, train_size)
    steps = math.ceil(plan.student_epochs * labelled / plan.student_batch_size)
    transfer = min(plan.transfer or train_size, train_size)
    transfer_epochs = round(steps * plan.student_batch_size / transfer, 4)  # the label-free arm: the same steps
    train = {"batch_size": plan.student_batch_size, "learning_rate": plan.student_learning_rate,
             "warmup_ratio": 0.1, "eval_every": 0, "save_every": 0, "log_every": 20, "tensorboard": False,
             "group_by_length": True}  # NCBI-disease batches of random sentences are ~55% padding
    teacher_train = {"batch_size": plan.teacher_batch_size, "learning_rate": plan.teacher_learning_rate}
    task = {"max_length": plan.max_length, "max_examples": plan.labelled}
    return {
        "run": {"output_dir": str(out / "study")},
        "data_dir": str(root),
        "seeds": list(plan.seeds),
        "student": student,
        "teacher_init": resolve_model_name(plan.teacher),
        "tasks": [{"name": TASK, "teacher_overrides": {"finetune": {"epochs": plan.teacher_epochs},
                                                       "train": teacher_train}}],
        "defaults": {
            "finetune": {"task": task, "finetune": {"score_init": False}, "train": train},
            "kd": {"task": task, "train": train,
                   "kd": {"soft_loss": "hinton", "alpha": 0.5, "beta": 0.5, "temperature": plan.temperature,
                          "epochs": plan.student_epochs, "select_on_dev": True,
                          "cache_dir": str(out / "teacher_outputs")},
                   "transfer": {"source": {"kind": "in_domain", "split": "train", "max_examples": plan.labelled},
                                "keep_labels": True}},
        },
        "arms": [
            {"name": "distilled", "command": "kd"},
            {"name": "without-teacher", "command": "finetune", "overrides": {
                "finetune": {"epochs": plan.student_epochs, "score_init": True}}},
            *([{"name": "label-free", "command": "kd", "overrides": {
                "kd": {"alpha": 1.0, "beta": 0.0, "epochs": transfer_epochs},
                "transfer": {"source": {"max_examples": plan.transfer}, "keep_labels": False}}}]
              if plan.label_free else []),
        ],
    }


def _run_study(plan: DemoPlan, out: Path, root: Path, student: str, train_size: int) -> Path:
    raw = study_recipe(plan, out, root, student, train_size)
    recipe = validate_recipe(StudyRecipe, raw, source="demo study")
    return run_study(recipe, resume=(out / "study" / "config.yaml").is_file())


def _models(summary: dict[str, Any], plan: DemoPlan) -> dict[str, str]:
    """Model folders to benchmark: the teacher and the first seed of each student arm (same architecture)."""
    first = {}
    for run in summary["runs"]:
        first.setdefault(run["arm"], str(Path(run["folder"]) / "model"))
    return {"teacher": summary["teachers"][TASK]["model"], **first}


def _bench(out: Path, models: dict[str, str]) -> dict[str, Any]:
    path = out / "bench.json"
    if path.is_file():
        return json.loads(path.read_text())
    cfg = BenchConfig(lengths=[128], latency_batch=1, throughput_batch=32, warmup=2, repeats=10)
    result = run_bench([("teacher", models["teacher"]), ("student", models["distilled"])], cfg)
    atomic_write_json(path, result)
    return result


def _rows(summary: dict[str, Any], models: dict[str, str], bench: dict[str, Any]) -> list[dict[str, Any]]:
    teacher_scores = summary["teachers"][TASK]["test"]
    speed = {row["label"]: row for row in bench["models"]}
    rows = [_row("teacher (6 × 384, fine-tuned)", [teacher_scores], teacher_scores, speed["teacher"])]
    names = {"distilled": "distilled student (3 × 384)", "without-teacher": "student without teacher (3 × 384)",
             "label-free": "distilled without labels (3 × 384)"}
    for arm, name in names.items():
        runs = [r["test"] for r in summary["runs"] if r["arm"] == arm]
        if not runs:
            continue
        rows.append(_row(name, runs, teacher_scores, speed["student"], arm=arm))
    return rows


def _row(name: str, scores: list[dict[str, float]], teacher: dict[str, float], speed: dict[str, Any],
         arm: str | None = None) -> dict[str, Any]:
    f1 = [s["f1"] for s in scores]
    mean = statistics.fmean(f1)
    return {"model": name, "arm": arm, "seeds": len(f1), "f1": f1, "f1_mean": mean,
            "f1_sd": statistics.stdev(f1) if len(f1) > 1 else None,
            "precision_mean": statistics.fmean(s["precision"] for s in scores),
            "recall_mean": statistics.fmean(s["recall"] for s in scores),
            "share_of_teacher": mean / teacher["f1"] if teacher["f1"] else None,
            "parameters": speed["parameters"], "parameters_without_embeddings": speed["parameters_without_embeddings"],
            "latency_ms": speed["latency"]["128"]["median_ms"],
            "sequences_per_s": speed["throughput"]["128"]["sequences_per_s"]}


def _stage_times(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Wall seconds of every run of the study (teacher, then each arm × seed), read from its metrics."""
    stages = []
    teacher_metrics = Path(summary["teachers"][TASK]["model"]).parent / "metrics.json"
    for name, path in [("teacher fine-tuning", teacher_metrics)] + [
            (f"{r['arm']} seed {r['seed']}", Path(r["folder"]) / "metrics.json") for r in summary["runs"]]:
        metrics = json.loads(path.read_text())
        stages.append({"stage": name, "seconds": metrics.get("wall_seconds"),
                       "steps": (metrics.get("train") or metrics.get("result") or {}).get("steps")})
    return stages


def render_report(report: dict[str, Any]) -> str:
    plan = report["plan"]
    lines = [
        "# biodistil demo: does distillation work here?",
        "",
        f"Task NCBI-disease (disease mentions; entity-level F1, strict IOB2, full test set of 940 sentences); data "
        f"folder `{report['data']}`. Teacher: all-MiniLM-L6-v2 (`{plan['teacher']}`, a pretrained general-domain "
        f"BERT encoder, 6 × 384) fine-tuned on {plan['labelled']:,} labelled training sentences (a seeded subset) "
        f"for {plan['teacher_epochs']:g} epochs (batch {plan['teacher_batch_size']}, learning rate "
        f"{plan['teacher_learning_rate']:g}). Every student starts from the teacher's pre-trained layers "
        f"{list(plan['student_layers'])} and trains for the same number of steps (batch "
        f"{plan['student_batch_size']}, learning rate {plan['student_learning_rate']:g}): the *distilled* student "
        f"with Hinton KD (0.5·T²·KL + 0.5·CE, T = {plan['temperature']:g}) on the {plan['labelled']:,} labelled "
        f"sentences for {plan['student_epochs']:g} epochs; the student *without teacher* on the same sentences "
        "and labels alone" + (
            f"; the student *distilled without labels* on the teacher's outputs only (T²·KL) over "
            f"{plan['transfer'] or report['train_sentences']:,} training sentences with their labels dropped"
            if plan["label_free"] else "") +
        f". At most {plan['max_length']} sub-words, model selection on the dev set, seeds {list(plan['seeds'])}.",
        "",
        "| model | parameters (without embeddings) | test F1 (P / R) | share of teacher F1 | latency, batch 1 (ms) "
        "| throughput, batch 32 (seq/s) |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["models"]:
        lines.append(
            f"| {row['model']} | {row['parameters'] / 1e6:.1f} M ({row['parameters_without_embeddings'] / 1e6:.1f} M) "
            f"| {_f1(row)} ({row['precision_mean']:.3f} / {row['recall_mean']:.3f}) | "
            f"{100 * row['share_of_teacher']:.1f}% | {row['latency_ms']:.1f} | {row['sequences_per_s']:.0f} |")
    lines += ["", *verdict({row["arm"] or "teacher": row for row in report["models"]}), "",
              "Wall time per stage:", "", "| stage | steps | seconds |", "|---|---|---|"]
    lines += [f"| {s['stage']} | {s['steps'] or ''} | {s['seconds'] if s['seconds'] is not None else '?'} |"
              for s in report["stages"]]
    lines += [f"| benchmark | | {report['timings'].get('bench', '?')} |", "",
              f"Whole demo: {report['demo_minutes']} minutes (a resumed demo counts only its last invocation). "
              f"Speed: CPU, {report['bench']['device']}, sequence length 128, median of "
              f"{report['bench']['settings']['repeats']} runs; the students share one architecture, so one is timed. "
              "Numbers are as they came out: nothing was tuned on the test set.", ""]
    return "\n".join(lines)


def _f1(row: dict[str, Any]) -> str:
    if row["f1_sd"] is None:
        return f"{row['f1_mean']:.3f}"
    return f"{row['f1_mean']:.3f} ± {row['f1_sd']:.3f}"


def verdict(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Plain-language answers; a difference between student arms must clear twice their seed spread."""
    teacher, distilled, plain = rows["teacher"], rows["distilled"], rows["without-teacher"]
    lines = [f"- The distilled student keeps {100 * distilled['share_of_teacher']:.1f}% of the teacher's F1 with "
             f"{distilled['parameters'] / teacher['parameters']:.0%} of its parameters and "
             f"{teacher['latency_ms'] / distilled['latency_ms']:.1f}× its batch-1 speed.",
             compare("What the teacher adds (distilled vs without teacher, same data, labels and steps)", distilled,
                     plain)]
    if "label-free" in rows:
        label_free = rows["label-free"]
        lines += [f"- Without a single gold label the student keeps {100 * label_free['share_of_teacher']:.1f}% of "
                  "the teacher's F1: everything it knows of the task came through the teacher's outputs.",
                  compare("Gold labels vs teacher outputs only (without teacher vs distilled without labels)", plain,
                          label_free)]
    return lines


def compare(question: str, first: dict[str, Any], second: dict[str, Any]) -> str:
    """`first − second` in F1, called a finding only when it is more than twice the larger seed sd."""
    gain = first["f1_mean"] - second["f1_mean"]
    if min(first["seeds"], second["seeds"]) < 2:
        return f"- {question}: {gain:+.3f} F1 from one seed; with no seed spread measured this is not a finding."
    spread = max(first["f1_sd"], second["f1_sd"])
    if abs(gain) <= 2 * spread:
        return (f"- {question}: {gain:+.3f} F1, within twice the seed spread (sd up to {spread:.3f}): not a finding "
                "at this scale.")
    better, worse = (first, second) if gain > 0 else (second, first)
    return (f"- {question}: {gain:+.3f} F1, more than twice the seed spread (sd up to {spread:.3f}, "
            f"{first['seeds']} seeds): the {better['model']} scores higher than the {worse['model']}.")
