"""`biodistil demo`: what a teacher adds where users distil. A real pretrained teacher, offline, on 2 CPU cores.

The setting of a user with a strong teacher (the transfer-data paper's): the teacher was fine-tuned on a large
labelled set (often not theirs to share); they hold the teacher, unlabelled in-domain text and few labels. On
NCBI-disease (entity-level F1, strict IOB2, the full test set) the demo runs one `biodistil study`:

1. teacher: the embedded all-MiniLM-L6-v2 encoder (6 × 384, `minilm-l6`) fine-tuned on every training sentence;
2. student: the teacher's pre-trained layers 0, 2, 4 (3 × 384), trained three ways from the same start, with the
   same optimizer settings and the same number of steps, for every seed:
   - *fine-tuned*: on the labelled budget alone (a seeded 15% of the training sentences);
   - *distilled*: Hinton KD on the transfer text (every training sentence, labels dropped) plus CE on the labelled
     budget, α·T²·KL(teacher ‖ student) + β·CE(gold);
   - *distilled without labels*: the KD term alone on the transfer text: the student never sees a gold label;
   teacher outputs are computed once and cached for every arm and seed;
3. deployment: the distilled student (first seed) exported to ONNX fp32 and int8 (`biodistil export --int8`, the
   int8 drop measured on the dev split), then teacher, student and its exports scored on the test set and timed
   side by side (`biodistil evaluate --finetuned --bench`).

`same_labels` (`--same-labels`) runs the earlier comparison instead: the teacher fine-tuned on the same labelled
budget as the students, and the distilled student trained on those sentences only; there a student made of a
pretrained encoder's layers gets little from a teacher that knows no more than its labels.

Every stage is an ordinary run folder under DIR, so an interrupted demo continues where it stopped, and a finished
one only writes its report again. The plan was fixed on dev scores (docs/demo.md), never on the test set. `--quick`
runs the self-contained toy path instead (demo_quick.py: pre-train, distil, fine-tune tiny models in a minute).
"""

import math
import shlex
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from biodistil.config import validate_recipe
from biodistil.data.paths import resolve_data_root
from biodistil.demo_quick import run_quick_demo
from biodistil.embedded import resolve_model_name
from biodistil.errors import BiodistilError
from biodistil.evaluation.finetuned import ScoringPlan, run_scoring
from biodistil.evaluation.recipe import BenchConfig
from biodistil.export.command import ExportOptions, run_export
from biodistil.finetune.init_model import init_model_path
from biodistil.io import atomic_write_json, atomic_write_text, read_json
from biodistil.kd.recipe import StudyRecipe
from biodistil.kd.study import run_study, side_by_side_line
from biodistil.paths import absolute, recalled
from biodistil.tasks.registry import get_task
from biodistil.tasks.significance import Comparison, compare_scores, holm
from biodistil.training.machine import describe_machine

TASK = "ncbi_disease"
ARMS = {"fine-tuned": "fine-tuned on the labelled budget", "distilled": "distilled (KD on text + CE on budget)",
        "label-free": "distilled without labels"}
SHORT = {"fine-tuned": "fine-tuned student", "distilled": "distilled student", "label-free": "student distilled "
         "without labels"}


@dataclass(frozen=True)
class DemoPlan:
    """The demo's budget: every cap is stated in the report."""

    teacher: str = "minilm-l6"
    student_layers: tuple[int, ...] = (0, 2, 4)
    max_length: int = 128
    teacher_steps: int = 250  # as long as each student (1.5 passes over NCBI-disease's 5,424 training sentences)
    teacher_batch_size: int = 32
    teacher_learning_rate: float = 2e-4
    labelled_share: float = 0.15  # the students' labelled budget: a seeded share of the training sentences
    student_steps: int = 250  # every arm: 1.5 passes over the transfer text at batch 32
    student_batch_size: int = 32
    student_learning_rate: float = 3e-4
    evaluations: int = 2  # dev evaluations per student run (the best is kept)
    temperature: float = 2.0
    alpha: float = 1.0  # the KD term of the distilled arm
    beta: float = 0.2  # its CE term on the labelled budget
    seeds: tuple[int, ...] = (1, 2, 3)  # fixed before any run (issue 55); each seed trains every arm
    processes: int | str = "auto"  # student runs side by side in worker processes (`study --processes`)
    same_labels: bool = False  # the teacher knows only the students' labelled budget (the earlier demo)

    def labelled(self, train_size: int) -> int:
        return max(1, min(train_size, round(self.labelled_share * train_size)))


PLAN = DemoPlan()


def run_demo(out: str | Path, data: str | Path | None = None, quick: bool = False, same_labels: bool = False,
             plan: DemoPlan = PLAN, record: str | Path | None = None) -> Path:
    """Run (or continue) the demo in `out`; returns the path of its Markdown report. `record`: also write its
    report.json there (e.g. docs/results/demo.json, the record docs/demo.md quotes)."""
    if quick:
        return run_quick_demo(out, data)
    plan = replace(plan, same_labels=plan.same_labels or same_labels)
    out = Path(absolute(out))
    root = resolve_data_root(data)
    task = get_task(TASK)
    if not task.is_available(root):
        raise BiodistilError(f"NCBI-disease is missing under {root}: expected {task.missing_files(root)}")
    train_size = len(task.load_split("train", root))
    student_init = init_model_path(plan.teacher, list(plan.student_layers), out)
    study_dir = _run_study(plan, out, root, student_init, train_size)
    summary = read_json(study_dir / "summary.json")
    models = _models(summary, study_dir)
    export = _export(out, models["distilled"], root)
    deployed = _deployed(out, models, root)
    report = build_report(plan, summary, deployed, export, root, train_size)
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", render_report(report, out))
    if record is not None:
        atomic_write_json(Path(absolute(record)), report)
    return out / "report.md"


def study_recipe(plan: DemoPlan, out: Path, root: Path, student: str, train_size: int) -> dict[str, Any]:
    """The demo as a `biodistil study` recipe: the teacher, then the three student arms × seeds, equal steps."""
    labelled = plan.labelled(train_size)
    train = {"batch_size": plan.student_batch_size, "learning_rate": plan.student_learning_rate,
             "max_steps": plan.student_steps, "warmup_ratio": 0.1,
             "eval_every": math.ceil(plan.student_steps / plan.evaluations), "save_every": 0, "log_every": 20,
             "tensorboard": False, "group_by_length": True}  # NCBI-disease batches of random sentences: ~55% padding
    teacher = {"finetune": {"epochs": None, "score_init": False},  # the students' schedule: steps, dev selection
               "train": {"batch_size": plan.teacher_batch_size, "learning_rate": plan.teacher_learning_rate,
                         "max_steps": plan.teacher_steps, "warmup_ratio": 0.1,
                         "eval_every": math.ceil(plan.teacher_steps / plan.evaluations)},
               "task": {"train_examples": labelled if plan.same_labels else None}}
    kd = {"soft_loss": "hinton", "temperature": plan.temperature, "select_on_dev": True,
          "cache_dir": str(out / "teacher_outputs")}
    text = {"kind": "in_domain", "split": "train"}
    distilled = ({"source": {**text, "max_examples": labelled}, "keep_labels": True} if plan.same_labels
                 else {"source": text, "keep_labels": True, "labelled": labelled})
    return {
        "run": {"output_dir": str(out / "study")},
        "data_dir": str(root),
        "seeds": list(plan.seeds),
        "student": student,
        "teacher_init": resolve_model_name(plan.teacher),
        "tasks": [{"name": TASK, "teacher_overrides": teacher}],
        "defaults": {
            "finetune": {"task": {"max_length": plan.max_length, "train_examples": labelled},
                         "finetune": {"score_init": False}, "train": train},
            "kd": {"task": {"max_length": plan.max_length}, "train": train, "kd": kd},
        },
        "arms": [
            {"name": "fine-tuned", "command": "finetune", "overrides": {"finetune": {"score_init": True}}},
            {"name": "distilled", "command": "kd", "overrides": {
                "kd": {"alpha": plan.alpha, "beta": plan.beta}, "transfer": distilled}},
            {"name": "label-free", "command": "kd", "overrides": {
                "kd": {"alpha": 1.0, "beta": 0.0}, "transfer": {"source": text, "keep_labels": False}}},
        ],
    }


def _run_study(plan: DemoPlan, out: Path, root: Path, student: str, train_size: int) -> Path:
    raw = study_recipe(plan, out, root, student, train_size)
    recipe = validate_recipe(StudyRecipe, raw, source="demo study")
    return run_study(recipe, resume=(out / "study" / "config.yaml").is_file(), processes=plan.processes).parent


def _models(summary: dict[str, Any], study_dir: Path) -> dict[str, Path]:
    """Model folders: the teacher and each student arm's first seed (the students share one architecture)."""
    first: dict[str, Path] = {}
    for run in summary["runs"]:
        first.setdefault(run["arm"], recalled(run["folder"], study_dir) / "model")
    return {"teacher": recalled(summary["teachers"][TASK]["model"], study_dir), **first}


def _export(out: Path, student: Path, root: Path) -> dict[str, Any]:
    """The distilled student as ONNX fp32 and int8 (`biodistil export --int8 --task ... --split dev`): the int8
    accuracy gate runs on the dev split, so the test scores below are the first the exports see."""
    folder = out / "student-onnx"
    if not (folder / "export.json").is_file():
        run_export(student, folder, ExportOptions(int8=True, task=TASK, split="dev", data_root=str(root)))
    return read_json(folder / "export.json")


def _deployed(out: Path, models: dict[str, Path], root: Path) -> dict[str, Any]:
    """Teacher, student and the student's exports scored on the test set and timed side by side
    (`biodistil evaluate --finetuned ... --bench`)."""
    folder = out / "deployed"
    if not ((folder / "results.json").is_file() and (folder / "bench.json").is_file()):
        specs = [("teacher", str(models["teacher"])), ("student", str(models["distilled"])),
                 ("student-onnx", str(out / "student-onnx"))]
        bench = BenchConfig(lengths=[128], latency_batch=1, throughput_batch=32, warmup=3, repeats=20)
        run_scoring(specs, ScoringPlan(TASK, "test", data_root=str(root)), folder, bench)
    return {"results": read_json(folder / "results.json"), "bench": read_json(folder / "bench.json")}


# ---------------------------------------------------------------------------------------------- the report


def build_report(plan: DemoPlan, summary: dict[str, Any], deployed: dict[str, Any], export: dict[str, Any],
                 root: Path, train_size: int) -> dict[str, Any]:
    """report.json: the plan, one row per model (scores over seeds, speed), the stages' wall times; made from the
    run folders' records only, so a finished demo gives the same report every time."""
    speed = {row["label"]: row for row in deployed["bench"]["models"]}
    scored = {cell["model"]: cell for cell in deployed["results"]["cells"]}
    teacher = summary["teachers"][TASK]
    rows = [_row("teacher (6 × 384), PyTorch fp32", None, [teacher["test"]], speed["teacher"],
                 teacher.get("degenerate"))]
    for arm, name in ARMS.items():
        runs = [r for r in summary["runs"] if r["arm"] == arm]
        rows.append(_row(f"student (3 × 384) {name}, PyTorch fp32", arm, [r["test"] for r in runs],
                         speed["student"], "; ".join(r["degenerate"] for r in runs if r["degenerate"])))
    for label, name in (("student-onnx", "ONNX fp32"), ("student-onnx-int8", "ONNX int8")):
        cell = scored[label]
        rows.append(_row(f"distilled student, seed {plan.seeds[0]}, {name}", label, [cell["test"]], speed[label],
                         cell.get("degenerate")))
    teacher_f1 = rows[0]["f1_mean"]
    for row in rows:
        row["share_of_teacher"] = row["f1_mean"] / teacher_f1 if teacher_f1 else None
        row["speedup"] = rows[0]["latency_ms"] / row["latency_ms"] if row["latency_ms"] else None
    stages = _stage_times(summary)
    return {"plan": asdict(plan), "task": TASK, "data": str(root), "train_sentences": train_size,
            "labelled": plan.labelled(train_size), "models": rows, "stages": stages,
            "distilled_seed_1_pytorch_f1": _first_seed_f1(summary, plan.seeds[0]),
            "int8_dev_gate": export.get("accuracy"),
            "demo_minutes": round(_training_seconds(summary, stages) / 60, 1),
            "side_by_side": summary.get("side_by_side"),
            "bench": {"device": deployed["bench"]["device"], "settings": deployed["bench"]["settings"]},
            "machine": summary.get("machine") or describe_machine()}


def _row(name: str, arm: str | None, scores: list[dict[str, float]], speed: dict[str, Any],
         degenerate: str | None) -> dict[str, Any]:
    f1 = [s["f1"] for s in scores]
    return {"model": name, "arm": arm, "seeds": len(f1), "f1": f1, "f1_mean": statistics.fmean(f1),
            "f1_sd": statistics.stdev(f1) if len(f1) > 1 else None,
            "precision_mean": statistics.fmean(s["precision"] for s in scores),
            "recall_mean": statistics.fmean(s["recall"] for s in scores),
            "parameters": speed.get("parameters"), "latency_ms": speed["latency"]["128"]["median_ms"],
            "sequences_per_s": speed["throughput"]["128"]["sequences_per_s"], "degenerate": degenerate or ""}


def _first_seed_f1(summary: dict[str, Any], seed: int) -> float:
    return next(r["test"]["f1"] for r in summary["runs"] if r["arm"] == "distilled" and r["seed"] == seed)


def _training_seconds(summary: dict[str, Any], stages: list[dict[str, Any]]) -> float:
    """The training runs' elapsed time: the stages' wall times added up, or, when every student run ran side by
    side in worker processes, the teacher's and the pool's elapsed time."""
    side_by_side = summary.get("side_by_side")
    if side_by_side and side_by_side["runs"] == len(summary["runs"]):
        return (stages[0]["seconds"] or 0) + side_by_side["elapsed_seconds"]
    return sum(s["seconds"] or 0 for s in stages)


def _stage_times(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Wall seconds and steps of every run of the study (teacher, then each arm × seed), from its records."""
    teacher = summary["teachers"][TASK]
    stages = [{"stage": "teacher fine-tuning", "seconds": teacher.get("wall_seconds"), "steps": teacher.get("steps")}]
    stages += [{"stage": f"{r['arm']} seed {r['seed']}", "seconds": r["wall_seconds"], "steps": r["steps"]}
               for r in summary["runs"]]
    return stages


def render_report(report: dict[str, Any], out: Path | None = None) -> str:
    plan = report["plan"]
    lines = ["# biodistil demo: what does the teacher add?", "", _setting(report), "", results_block(report), "",
             "Wall time per stage (as recorded when it ran):", "", "| stage | steps | seconds |", "|---|---|---|"]
    lines += [f"| {s['stage']} | {s['steps'] or ''} | {s['seconds'] if s['seconds'] is not None else '?'} |"
              for s in report["stages"]]
    machine = report["machine"]
    side_by_side = report.get("side_by_side")
    lines += ["", *([side_by_side_line(side_by_side)] if side_by_side else []),
              f"Training runs: {report['demo_minutes']} minutes elapsed in all (export, scoring and timing not "
              f"included). Speed: {report['bench']['device']}, sequence length 128, median of "
              f"{report['bench']['settings']['repeats']} runs after {report['bench']['settings']['warmup']} "
              f"untimed; the three PyTorch students share one architecture, so one is timed. CPU: "
              f"{machine.get('cpu')}. F1 mean ± sd over seeds "
              f"{list(plan['seeds'])}; nothing was tuned on the test set.", ""]
    onnx = shlex.quote(str(out / "student-onnx")) if out is not None else "DIR/student-onnx"
    lines += ["Run the distilled student (its int8 graph) on your own documents — text files, folders of .txt, JSON "
              "lines — entities with character offsets, one JSON line per document:", "",
              f"    biodistil predict {onnx} YOUR_DOCUMENTS --out entities.jsonl", ""]
    return "\n".join(lines)


def results_block(report: dict[str, Any]) -> str:
    """The table of every model and what it shows: the part of the report docs/demo.md quotes from its record
    (`docs/results/demo.json`, written by `biodistil demo --record`)."""
    lines = ["| model | parameters | test F1 (P / R) | share of teacher F1 | latency, batch 1 (ms) | speed-up "
             "| throughput, batch 32 (seq/s) |", "|---|---|---|---|---|---|---|"]
    for row in report["models"]:
        flag = f" **(one class: {row['degenerate']})**" if row["degenerate"] else ""
        lines.append(f"| {row['model']} | {_millions(row['parameters'])} | {_f1(row)} ({row['precision_mean']:.3f} "
                     f"/ {row['recall_mean']:.3f}){flag} | {100 * row['share_of_teacher']:.1f}% | "
                     f"{row['latency_ms']:.1f} | {row['speedup']:.1f}× | {row['sequences_per_s']:.0f} |")
    return "\n".join([*lines, "", "What it shows:", "", *verdict(report)])


def _setting(report: dict[str, Any]) -> str:
    plan = report["plan"]
    teacher_data = (f"the same {report['labelled']:,} labelled sentences as the students" if plan["same_labels"]
                    else f"all {report['train_sentences']:,} labelled training sentences")
    text = ("the same labelled sentences (every one labelled)" if plan["same_labels"] else
            f"all {report['train_sentences']:,} training sentences as unlabelled text")
    return (
        f"Task NCBI-disease (disease mentions; entity-level F1, strict IOB2, full test set of 940 sentences); data "
        f"folder `{report['data']}`. Teacher: all-MiniLM-L6-v2 (`{plan['teacher']}`, a pretrained general-domain "
        f"BERT encoder, 6 × 384) fine-tuned on {teacher_data} for {_teacher_schedule(plan)} (batch "
        f"{plan['teacher_batch_size']}, learning rate {plan['teacher_learning_rate']:g}). Every student starts from "
        f"the teacher's pre-trained layers {list(plan['student_layers'])} and trains {plan['student_steps']} steps "
        f"(batch {plan['student_batch_size']}, learning rate {plan['student_learning_rate']:g}, the best of "
        f"{plan['evaluations']} dev evaluations kept). Labelled budget: a seeded {report['labelled']:,} sentences "
        f"({100 * plan['labelled_share']:.0f}%). *Fine-tuned*: the budget alone. *Distilled*: "
        f"{plan['alpha']:g}·T²·KL(teacher ‖ student) (T = {plan['temperature']:g}) over {text} + "
        f"{plan['beta']:g}·CE on the budget's labels. *Without labels*: T²·KL alone over all training sentences. "
        f"At most {plan['max_length']} sub-words. The distilled student of the first seed is exported to ONNX "
        "(`biodistil export --int8`; the int8 check on the dev split) and scored on the test set with its exports.")


def _teacher_schedule(plan: dict[str, Any]) -> str:
    if "teacher_steps" not in plan:  # a record made before the teacher trained as long as its students
        return f"{plan['teacher_epochs']:g} epoch(s)"
    return (f"{plan['teacher_steps']} steps, as long as each student, the best of {plan['evaluations']} dev "
            "evaluations kept")


def verdict(report: dict[str, Any]) -> list[str]:
    """Plain-language answers; the three differences between student arms are one family: each a finding only when a
    t-test on the per-seed scores says so after Holm's adjustment (`compare`)."""
    rows = {row["arm"] or "teacher": row for row in report["models"]}
    teacher, distilled, plain, label_free = (rows["teacher"], rows["distilled"], rows["fine-tuned"],
                                             rows["label-free"])
    int8 = rows["student-onnx-int8"]
    questions = [("What the teacher adds (distilled vs fine-tuned on the labelled budget alone, equal steps)",
                  distilled, plain),
                 ("The teacher's outputs alone vs the labelled budget alone (without labels vs fine-tuned)",
                  label_free, plain),
                 ("What the budget's labels add to the teacher's outputs (distilled vs without labels)",
                  distilled, label_free)]
    results = holm([compare_scores(first["f1"], second["f1"]) for _, first, second in questions])
    lines = [f"- The distilled student keeps {100 * distilled['share_of_teacher']:.1f}% of the teacher's F1 with "
             f"{distilled['parameters'] / teacher['parameters']:.0%} of its parameters at "
             f"{distilled['speedup']:.1f}× its batch-1 speed (PyTorch); exported to ONNX int8 it keeps "
             f"{100 * int8['share_of_teacher']:.1f}% at {int8['speedup']:.1f}× the teacher's speed.",
             *(compare(question, first, second, result)
               for (question, first, second), result in zip(questions, results, strict=True)),
             _int8_line(report, int8)]
    if report["plan"]["same_labels"]:
        lines.append("- Here the teacher knows only the students' labelled sentences: a student made of a "
                     "pretrained encoder's layers, fine-tuned on the same labels, has little to learn from it. The "
                     "default demo gives the teacher the whole training set, as a user's teacher usually has.")
    else:
        lines.append("- The unlabelled sentences here are the teacher's own training sentences. What they carry is the "
                     "teacher's knowledge of them: unlabelled in-domain text the teacher never saw added nothing "
                     "measurable in Study 4 (docs/results.md).")
    return lines


def _int8_line(report: dict[str, Any], int8: dict[str, Any]) -> str:
    fp32 = report["distilled_seed_1_pytorch_f1"]
    drop = fp32 - int8["f1_mean"]
    gate = report.get("int8_dev_gate") or {}
    dev = f"; the export's dev-split check measured {_gate_drop(gate)}" if gate else ""
    within = "within" if abs(drop) <= 0.01 else "more than"
    return (f"- ONNX int8 vs the same student in PyTorch fp32 (seed 1): {-drop:+.4f} F1 on the test set, {within} "
            f"1 point{dev}.")


def _gate_drop(gate: dict[str, Any]) -> str:
    if gate.get("int8_drop") is None:
        return "no int8 score"
    return f"{-gate['int8_drop']:+.4f} F1 (int8 − PyTorch fp32 on the {gate.get('examples', '?')} dev sentences)"


def compare(question: str, first: dict[str, Any], second: dict[str, Any], result: Comparison) -> str:
    """`first − second` in F1 and its verdict `result` (`tasks.significance`: Welch's t-test on the per-seed scores —
    the arms share seeds, not their training data —, Holm-adjusted within the demo's comparisons)."""
    line = f"- {question}: {result.describe(' F1')}"
    if result.finding:
        better, worse = (first, second) if result.difference > 0 else (second, first)
        name = lambda row: SHORT.get(row.get("arm"), row["model"])  # noqa: E731
        line += f" — the {name(better)} scores higher than the {name(worse)}"
    return line + "."


def _f1(row: dict[str, Any]) -> str:
    if row["f1_sd"] is None:
        return f"{row['f1_mean']:.3f}"
    return f"{row['f1_mean']:.3f} ± {row['f1_sd']:.3f}"


def _millions(count: int | None) -> str:
    return "?" if count is None else f"{count / 1e6:.1f} M"

