"""Print the tables of docs/results.md from the committed study records beside this file.

    python docs/results/tables.py            # every study
    python docs/results/tables.py meta-kd    # one
    python docs/results/tables.py --write    # replace the marked tables and figures of docs/results.md and docs/demo.md
    python docs/results/tables.py --figures  # every named figure of the prose, as its record gives it

Each record is what its study recipe wrote: `task-agnostic.json` and `cross-tokenizer.json` are the `pipeline.json`
of recipes/studies/task-agnostic-seeds.yaml and cross-tokenizer.yaml, `transfer-data.json`, `meta-kd.json` and
`users-setting.json` the `summary.json` of recipes/studies/transfer-data.yaml, meta-kd.yaml and
users-setting-converged.yaml; `multi-teacher.json` that of multi-teacher-converged.yaml;
`seeds-scale.json` the `pipeline.json` of recipes/studies/seeds-scale.yaml (its replacement, that of
seeds-scale-converged.yaml, is read by the `seeds_scale_converged_*` functions once it is whole);
`demo.json` the `report.json` of `biodistil demo --out DIR --record docs/results/demo.json` (docs/demo.md).
A difference between two arms is a finding only when a t-test on the per-seed scores says so after Holm's adjustment
within its table (biodistil's one verdict rule, `biodistil.tasks.significance`: paired where the arms share seeds and
data order — the fine-tuning cells of one evaluation —, else Welch's; each table's comparisons are one family);
otherwise it is inconclusive, with about the seeds per arm that would give the test 80% power at the observed
difference and spread.

The prose quotes figures too: each sits between markers, `<!-- fig: STUDY/NAME -->78.8<!-- /fig -->` (invisible when
rendered), and `--write` fills it with FIGURES[STUDY](record)[NAME] — one function per study returns its named figures
as the prose writes them (signs "−"/"+", the tables' digits), computed once per record (they share its Holm families).
"""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))  # run from a checkout: its own biodistil
from biodistil.tasks.significance import ALPHA, Comparison, compare_scores, holm, mean_estimate  # noqa: E402

TASK_TITLES = {"ncbi_disease": "NCBI-disease", "bc5cdr_disease": "BC5CDR-disease", "gad": "GAD", "hoc": "HoC",
               "chemprot": "ChemProt", "bioasq": "BioASQ"}


def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))


def pm(mean: float, sd: float | None, scale: float = 100.0, digits: int = 1) -> str:
    return f"{scale * mean:.{digits}f}" + (f" ± {scale * sd:.{digits}f}" if sd is not None else "")


def num(value: float, digits: int = 1, scale: float = 1.0) -> str:
    """A figure as the prose writes it: a negative with "−" (U+2212)."""
    return f"{scale * value:.{digits}f}".replace("-", "−")


def signed(value: float, digits: int = 1, scale: float = 1.0) -> str:
    """A difference as the prose writes it: "+1.0", "−1.2"."""
    return f"{scale * value:+.{digits}f}".replace("-", "−")


def ci(result: Comparison, digits: int = 1, scale: float = 100.0) -> str:
    """A comparison's interval as the prose writes it: "−0.3 to +2.4"."""
    return f"{signed(result.low, digits, scale)} to {signed(result.high, digits, scale)}"


def pct(value: float, digits: int = 1) -> str:
    """A share as the prose writes it: "96.1%"."""
    return f"{100 * value:.{digits}f}%"


def p_text(value: float) -> str:
    return f"{value:.2g}"


def each(values: list[str]) -> str:
    """Figures that the prose gives together: "0.18 each" when they are one, else "0.18 and 0.2"."""
    unique = list(dict.fromkeys(values))
    return f"{unique[0]} each" if len(unique) == 1 else ", ".join(values[:-1]) + f" and {values[-1]}"


def comparison_figures(prefix: str, result: Comparison, digits: int = 1, scale: float = 100.0) -> dict[str, str]:
    """A comparison's figures under `prefix`: its difference, interval, p, Holm p and seeds for 80% power."""
    figures = {f"{prefix}": signed(result.difference, digits, scale)}
    if result.low is not None:
        figures |= {f"{prefix}:ci": ci(result, digits, scale), f"{prefix}:p": p_text(result.p_value)}
    if result.p_holm is not None:
        figures[f"{prefix}:holm"] = p_text(result.p_holm)
    if result.seeds_needed:
        figures[f"{prefix}:seeds"] = str(result.seeds_needed)
    return figures


def gap_cell(gaps: list[float | None]) -> str:
    """Mean ± sd of the gap closed per seed, in %; "n/a" when a seed's teacher does not beat the initialisation
    (no gap to close: the study records it as null)."""
    if any(gap is None or math.isnan(gap) for gap in gaps):
        return "n/a (no gap)"
    return pm(statistics.fmean(gaps), statistics.stdev(gaps) if len(gaps) > 1 else None, 100, 0) + "%"


# Studies whose scores were looked at before their record was final (the records predate the `looks` field): Study 4's
# budget and unseen-text arms got seeds 4 and 5 after its 3-seed result was seen; Study 6's student arms were cut from
# 2 epochs to 1 after two runs' scores were seen. Every comparison of such a study is tested at α/looks.
LOOKS = {"seeds-scale": 2}


def family(pairs: list[tuple[list[float], list[float]]], paired: bool = False, looks: int = 1) -> list[Comparison]:
    """One table's comparisons (mean(first) − mean(second) each) as one family: Holm-adjusted, each tested at α/looks
    first when the study looked at its scores `looks` times before they were final."""
    return holm([compare_scores(first, second, paired, looks) for first, second in pairs])


def verdict(result: Comparison, scale: float = 1.0, digits: int = 3) -> str:
    """"finding, 95% CI …, Holm p …" or "inconclusive, …; ~N seeds", figures × `scale`."""
    if result.low is None:
        return f"inconclusive: {result.why_no_test}"
    interval = f"{100 * (1 - ALPHA / result.looks):g}% CI {scale * result.low:+.{digits}f} to " \
               f"{scale * result.high:+.{digits}f}"
    p_values = f"p {result.p_value:.2g}" + (f" ({result.looks} looks)" if result.looks > 1 else "")
    p_values += f", Holm p {result.p_holm:.2g}" if result.family > 1 else ""
    if result.finding:
        return f"finding, {interval}, {p_values}"
    unit = "runs" if result.crossed else "seeds"  # a grid's units: distillation runs, with their seeds
    seeds = f"; ~{result.seeds_needed} {unit}" if result.seeds_needed else ""
    return f"inconclusive, {interval}, {p_values}{seeds}"


def auroc_row(name: str, records: list[dict[str, Any]]) -> str:
    """A table row of one model's or arm's runs: test AUROC mean ± sd, the seeds, how many predicted one class."""
    values = [r["test"]["auroc"] for r in records]
    sd = statistics.stdev(values) if len(values) > 1 else None
    one_class = sum(bool(r.get("degenerate")) for r in records)
    return (f"| {name} | {pm(statistics.fmean(values), sd, 1, 3)} | {', '.join(f'{v:.3f}' for v in values)} | "
            f"{one_class} of {len(records)} |")


# ------------------------------------------------------------- pipelines: distill stages, then evaluate


CROSS_TOKENIZER_PAIRS = [("cross-distil", "cross-mlm"), ("cross-distil", "same-distil"), ("cross-mlm", "same-layers"),
                         ("same-distil", "same-layers"), ("cross-distil", "same-layers")]


def cross_tokenizer_tables(record: dict[str, Any]) -> str:
    return pipeline_tables(record, CROSS_TOKENIZER_PAIRS, teacher=None)


def cross_tokenizer_figures(record: dict[str, Any]) -> dict[str, str]:
    """The cross-tokenizer section's prose figures: each model's F1 (`f1:MODEL`), each comparison (`A-B`, ...), the
    distillation stages' tokens (M), held-out losses and throughput (`rate:STAGE`, tokens/s, and their ratio)."""
    results = evaluation(record)
    task = results["tasks"][0]["name"]
    stages = {stage["name"]: stage["summary"]["result"] for stage in record["stages"] if stage["command"] != "evaluate"}
    rate = {name: result["tokens_per_second"] for name, result in stages.items()}
    figures = {f"f1:{label}": num(entry[task]["mean"], 1, 100) for label, entry in results["summary"].items()}
    for (first, second), result in pipeline_family(record, CROSS_TOKENIZER_PAIRS).items():
        figures |= comparison_figures(f"{first}-{second}", result)
    return figures | {
        "tokens:cross": f"{stages['cross-distil']['tokens_seen'] / 1e6:.2f}",
        "tokens:cross-1": f"{stages['cross-distil']['tokens_seen'] / 1e6:.1f}",
        "tokens:same": f"{stages['same-distil']['tokens_seen'] / 1e6:.2f}",
        "mlm-loss:cross-distil": f"{stages['cross-distil']['final_eval']['loss_mlm']:.2f}",
        "mlm-loss:cross-mlm": f"{stages['cross-mlm']['final_eval']['loss_mlm']:.2f}",
        "cosine:cross-distil": f"{stages['cross-distil']['final_eval']['loss_hidden_cosine']:.2f}",
        "rate:cross-distil": f"{rate['cross-distil']:,.0f}", "rate:same-distil": f"{rate['same-distil']:,.0f}",
        "rate-ratio": f"{rate['cross-distil'] / rate['same-distil']:.2f}"}


def pipeline_tables(record: dict[str, Any], comparisons: list[tuple[str, str]], teacher: str | None = "") -> str:
    """The tables of a pipeline that distils students and then evaluates them: scores per model and task (with each
    model's share of `teacher`'s macro average; "" = the evaluation's reference model, None = no such column), seed
    by seed, AUROC where the tasks have it, wall time and the `comparisons` of macro averages with their verdicts."""
    stages = {stage["name"]: stage for stage in record["stages"]}
    results = next(stage["results"] for stage in record["stages"] if stage["command"] == "evaluate")
    tasks = [task["name"] for task in results["tasks"]]
    summary = results["summary"]
    teacher = results["reference"] if teacher == "" else teacher
    share = [] if teacher is None else ["share of teacher"]
    lines = ["| model | start | distillation | " + " | ".join([*(TASK_TITLES.get(t, t) for t in tasks),
                                                                  "macro average", *share]) + " |",
             "|---" * (len(tasks) + 4 + len(share)) + "|"]
    macro = {label: statistics.fmean(summary[label][t]["mean"] for t in tasks) for label in summary}
    for model in results["models"]:
        label = model["label"]
        cells = []
        for task in tasks:
            entry = summary[label][task]
            flag = " (degenerate)" if entry["degenerate"] else ""
            cells.append(pm(entry["mean"], entry["std"]) + flag)
        stage = stages.get(label)
        cells = [_start(label, stage), _distillation(stage), *cells, f"{100 * macro[label]:.1f}",
                 *([] if teacher is None else [_share(macro[label], macro[teacher])])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Seed by seed (headline score ×100):", "", "| model | " + " | ".join(
        TASK_TITLES.get(t, t) for t in tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for model in results["models"]:
        label = model["label"]
        seeds = [", ".join(f"{100 * v:.1f}" for v in summary[label][t]["seeds"].values()) for t in tasks]
        lines.append(f"| {label} | " + " | ".join(seeds) + " |")
    for task in [t for t in tasks if all("auroc" in c["test"] for c in results["cells"] if c["task"] == t)]:
        title = TASK_TITLES.get(task, task)
        lines += ["", f"{title} AUROC (threshold-free: it ranks the models that predict one class):", "",
                  "| model | AUROC (mean ± sd) | seeds | predicted one class |", "|---|---|---|---|"]
        for model in results["models"]:
            cells = [c for c in results["cells"] if c["task"] == task and c["model"] == model["label"]]
            lines.append(auroc_row(model["label"], cells))
    distil = sum(training_seconds(stage) for stage in stages.values() if stage["command"] != "evaluate")
    tune = sum(cell.get("wall_seconds", cell["train"]["seconds"]) for cell in results["cells"])
    lines += ["", f"Wall time: distillation {distil / 60:.1f} min, fine-tuning and scoring {tune / 60:.1f} min "
              f"({len(results['cells'])} cells), {(distil + tune) / 60:.1f} min in all."]
    lines += ["", "Differences of macro averages (per seed: the mean over tasks of that seed's scores):", "",
              "| comparison | difference | verdict |", "|---|---|---|"]
    for (first, second), result in pipeline_family(record, comparisons).items():
        lines.append(f"| {first} − {second} | {100 * result.difference:+.1f} | {verdict(result, 100, 1)} |")
    return "\n".join(lines)


def evaluation(record: dict[str, Any]) -> dict[str, Any]:
    """The results of a pipeline's evaluate stage."""
    return next(stage["results"] for stage in record["stages"] if stage["command"] == "evaluate")


def pipeline_family(record: dict[str, Any], comparisons: list[tuple[str, str]]) -> dict[tuple[str, str], Comparison]:
    """The `comparisons` of macro averages present in the record (per seed: the mean over tasks), one family."""
    results = evaluation(record)
    tasks = [task["name"] for task in results["tasks"]]
    summary = results["summary"]
    per_seed = {label: [statistics.fmean(summary[label][t]["seeds"][s] for t in tasks)
                        for s in summary[label][tasks[0]]["seeds"]] for label in summary}
    present = [(first, second) for first, second in comparisons if first in per_seed and second in per_seed]
    return dict(zip(present, family([(per_seed[first], per_seed[second]) for first, second in present], paired=True),
                    strict=True))


def _share(score: float, teacher: float) -> str:
    """A model's share of the teacher's score; n/a when the teacher scores 0 (it predicted nothing)."""
    return f"{100 * score / teacher:.1f}%" if teacher > 0 else "n/a (teacher 0)"


def _start(label: str, stage: dict[str, Any] | None) -> str:
    if stage is None:
        return {"same-layers": "teacher layers 0, 2, 4"}.get(label, "pre-trained")
    student = stage["config"]["student"]
    start = "random" if student["init"] == "architecture" else \
        f"teacher layers {', '.join(map(str, student['layers']))}"
    own = student.get("tokenizer")
    if own is not None:
        start += f", a {'un' if own['lowercase'] else ''}cased vocabulary of {own['vocab_size']:,} from the corpus"
    return start


def _distillation(stage: dict[str, Any] | None) -> str:
    if stage is None:
        return "none"
    result, config = stage["summary"]["result"], stage["config"]
    tokens = result.get("tokens_seen") or result["steps"] * config["train"]["batch_size"] * config["data"]["block_size"]
    terms = " + ".join(term["loss"] for term in config["objective"]["terms"])
    return f"{terms}; {result['steps']} steps, {tokens:,} tokens, {training_seconds(stage) / 60:.1f} min"


# ------------------------------------------------------------------------------------------ study 1

STUDY1_PAIRS = (("distilbert", "layers-only"), ("tinybert", "layers-only"), ("distilbert", "tinybert"),
                ("layers-only", "random-init"))
STUDY1_STARTS = {"distilbert": "teacher layers 0, 2, 4", "tinybert": "teacher layers 0, 2, 4",
                 "layers-only": "teacher layers 0, 2, 4", "random-init": "random, drawn from each seed"}


def task_agnostic_seeds_tables(record: dict[str, Any]) -> str:
    """Study 1 repeated (the `pipeline.json` of recipes/studies/task-agnostic-seeds.yaml): the teacher's seeds and
    the dev checkpoints they kept; every arm's F1 over its distillation runs (or seeds) with its share of the teacher
    on test and dev (two-level bootstrap intervals); the runs seed by seed; the comparisons, one family."""
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary = stages["study"]["summary"]
    (task, teacher), = summary["teachers"].items()
    seeds = teacher["teacher_seeds"].values()
    lines = [f"Teacher (`minilm-l6` fine-tuned on {TASK_TITLES.get(task, task)} for {teacher['steps']} steps; seeds "
             f"{', '.join(teacher['teacher_seeds'])}): test F1 {', '.join(num(s['test']['f1'], 1, 100) for s in seeds)}"
             f" (T = {num(teacher['test']['f1'], 1, 100)}); the dev checkpoints kept at steps "
             f"{', '.join(str(s['best_step']) for s in seeds)}.", "",
             "| model | start | distillation (each run) | F1 (mean ± sd) | 95% CI | distillation runs | share of the "
             "teacher, test | share, dev |", "|---|---|---|---|---|---|---|---|"]
    for row in summary["rows"]:
        flag = " (degenerate)" if row["degenerate_seeds"] else ""
        runs = ", ".join(f"{100 * s:.1f}" for s in row.get("start_scores", [])) or "—"
        lines.append(f"| {row['arm']} | {STUDY1_STARTS.get(row['arm'], '')} | "
                     f"{_distillation_runs(stages, row['arm'])} | {pm(row['mean'], row['sd'])}{flag} | "
                     f"{_mean_interval(_units(row))} | {runs} | "
                     f"{_bootstrap_share(row['share'])} | {_bootstrap_share(row.get('share_dev'))} |")
    lines += ["", *_run_by_run(summary), "", "| comparison | difference (F1) | verdict |", "|---|---|---|"]
    for (first, second), result in task_agnostic_seeds_family(summary).items():
        lines.append(f"| {first} − {second} | {100 * result.difference:+.1f} | {verdict(result, 100, 1)} |")
    return "\n".join([*lines, "", _study_pipeline_wall_time(record)])


def _distillation_runs(stages: dict[str, dict[str, Any]], arm: str) -> str:
    """An arm's distillation stages (`<arm>-1`, `<arm>-2`, ...): their terms, steps and tokens, and mean minutes."""
    runs = [stage for name, stage in stages.items() if name.rsplit("-", 1)[0] == arm and stage["command"] == "distill"]
    if not runs:
        return "none"
    minutes = statistics.fmean(training_seconds(run) for run in runs) / 60
    return f"{_distillation(runs[0]).rsplit(',', 1)[0]}; {len(runs)} runs, {minutes:.1f} min each"


def _units(row: dict[str, Any]) -> list[float] | list[list[float]]:
    """What a study row's interval and t-test take (the study's `compared_scores`, without importing the library's
    training code): its grid of distillation runs × fine-tuning seeds where it has several starts, else its seeds'
    scores."""
    return row.get("start_seed_scores") or row.get("start_scores") or row["scores"]


def task_agnostic_seeds_family(summary: dict[str, Any], units: Callable[[dict[str, Any]], Any] = _units,
                               ) -> dict[tuple[str, str], Comparison]:
    """Study 1's comparisons, one family: Welch on each arm's `units` — by default the grid of distillation runs ×
    fine-tuning seeds of a distilled arm (crossed) or the seeds' scores of an arm without distillation — at α/looks."""
    return _units_family(summary, STUDY1_PAIRS, units)


def _units_family(summary: dict[str, Any], pairs: tuple[tuple[str, str], ...],
                  units: Callable[[dict[str, Any]], Any] = _units) -> dict[tuple[str, str], Comparison]:
    """The `pairs` of arms both present in a study summary, one family: Welch on each arm's `units`, at α/looks."""
    rows = {row["arm"]: units(row) for row in summary["rows"]}
    present = [(first, second) for first, second in pairs if first in rows and second in rows]
    results = family([(rows[first], rows[second]) for first, second in present], looks=summary.get("looks", 1))
    return dict(zip(present, results, strict=True))


def _runs_means(row: dict[str, Any]) -> list[float]:
    """The units the recipe first named for a distilled arm's test: its distillation runs' means (the seeds' shared
    effect left out; docs/results.md, Study 1)."""
    return row.get("start_scores") or row["scores"]


def task_agnostic_seeds_figures(record: dict[str, Any]) -> dict[str, str]:
    """Study 1's prose figures: the paper's share; the teacher's F1 (`teacher`, `teacher-seeds`) and its dev-selected
    steps (`best-steps`, of `teacher-steps`); each arm's F1, sd, distillation runs' means and shares (`f1:ARM`,
    `sd:ARM`, `runs:ARM`, each fine-tuning seed's mean over the runs `seed-means:ARM`, `share:ARM`,
    `share-dev:ARM`); each comparison (`A-B`, ...) and, under the test on the
    runs' means alone, its p and Holm p (`means:A-B:p`, `means:A-B:holm`); the wall time (`minutes`)."""
    summary = {stage["name"]: stage for stage in record["stages"]}["study"]["summary"]
    (_, teacher), = summary["teachers"].items()
    seeds = teacher["teacher_seeds"].values()
    paper = PAPER_NCBI["DistilBioBERT (6 × 768)"] / PAPER_NCBI["BioBERT (12 × 768)"]
    figures = {"paper-share": f"{100 * paper:.0f}%", "minutes": f"{_study_pipeline_minutes(record):.0f}",
               "teacher": num(teacher["test"]["f1"], 1, 100), "teacher-steps": str(teacher["steps"]),
               "teacher-seeds": ", ".join(num(seed["test"]["f1"], 1, 100) for seed in seeds),
               "best-steps": ", ".join(str(seed["best_step"]) for seed in seeds)}
    for row in summary["rows"]:
        columns = zip(*row.get("start_seed_scores", []), strict=True)
        figures |= {f"f1:{row['arm']}": num(row["mean"], 1, 100), f"sd:{row['arm']}": num(row["sd"], 1, 100),
                    f"runs:{row['arm']}": ", ".join(num(score, 1, 100) for score in row.get("start_scores", [])),
                    f"seed-means:{row['arm']}": ", ".join(num(statistics.fmean(c), 1, 100) for c in columns),
                    f"share:{row['arm']}": _bootstrap_share(row["share"]),
                    f"share-dev:{row['arm']}": _bootstrap_share(row.get("share_dev"))}
    for (first, second), result in task_agnostic_seeds_family(summary).items():
        figures |= comparison_figures(f"{first}-{second}", result)
    for (first, second), result in task_agnostic_seeds_family(summary, _runs_means).items():
        figures |= {f"means:{first}-{second}:p": f"{result.p_value:.2g}",
                    f"means:{first}-{second}:holm": f"{result.p_holm:.2g}"}
    return figures


def _study_pipeline_minutes(record: dict[str, Any]) -> float:
    """The training stages' training time, the study's wall time and the deploy stage's (its exports' and scoring's
    seconds), in minutes."""
    return sum(_stage_seconds(stage) for stage in record["stages"]) / 60


def _stage_seconds(stage: dict[str, Any]) -> float:
    if stage["command"] == "deploy":
        return sum(stage["deploy"].get("seconds", {}).values())
    return stage["summary"]["wall_seconds"] if stage["command"] == "study" else training_seconds(stage)


def training_seconds(stage: dict[str, Any]) -> float:
    """A training stage's time: a resumed run's adds the segments before the checkpoint it resumed (recorded since
    2026-11-30; earlier records lack it and their resumed stages count the last segment only)."""
    result = stage["summary"]["result"]
    return result["seconds"] + result.get("earlier_seconds", 0.0)


def _study_pipeline_wall_time(record: dict[str, Any]) -> str:
    machine = record["machine"]
    together = {stage["name"]: stage for stage in record["stages"]}["study"]["summary"].get("side_by_side")
    apart = (f"; {together['runs']} of the study's runs ran {together['processes']} at a time at "
             f"{together['threads']} thread each, {together['elapsed_seconds'] / 60:.0f} min elapsed"
             if together else "")
    return (f"Wall time: {_study_pipeline_minutes(record):.0f} min in all (each stage's and run's own wall time, "
            f"summed{apart}) on {machine['usable_cores']} cores of {machine['cpu']} "
            f"(CPU flags: {', '.join(machine['flags']) or 'none of avx2, avx512f, avx512_bf16, amx'}; "
            f"{machine['bf16_why']}).")


# ------------------------------------------------------------------------------------------ study 2


TRANSFER_PAIRS = (("kd-gad", "kd-general"), ("kd-general", "kd-random-general"), ("kd-chemprot", "kd-general"),
                  ("kd-chemprot", "finetune-chemprot"), ("kd-gad", "finetune-gad"))


def transfer_tables(summary: dict[str, Any]) -> str:
    rows = summary["rows"]
    task = rows[0]["task"]
    lines = [f"Teacher {summary['rows'][0]['metric'].upper()} on the {TASK_TITLES.get(task, task)} test set: "
             f"{summary['teachers'][task]['test'][rows[0]['metric']]:.3f}; the student's initialisation (layers "
             f"0, 2, 4 with an untrained head): {statistics.fmean(r['init'] for r in rows):.3f} (mean over runs).", "",
             "| arm | test AUROC (mean ± sd) | seeds | gap closed (mean ± sd over seeds) | F1 (mean) "
             "| predicted one class |", "|---|---|---|---|---|---|"]
    for row in rows:
        group = [r for r in summary["runs"] if r["task"] == task and r["arm"] == row["arm"]]
        f1 = statistics.fmean(r["test"]["f1"] for r in group) if all("f1" in r["test"] for r in group) else None
        lines.append(f"| {row['arm']} | {pm(row['mean'], row['sd'], 1, 3)} | "
                     f"{', '.join(f'{s:.3f}' for s in row['scores'])} | {gap_cell(row['gap_closed_per_seed'])} | "
                     f"{'' if f1 is None else f'{100 * f1:.1f}'} | {len(row['degenerate_seeds'])} of {len(group)} |")
    lines += ["", _wall_time(summary), "", "| comparison | AUROC difference | verdict |", "|---|---|---|"]
    scores = {row["arm"]: row["scores"] for row in rows}
    present = [(first, second) for first, second in TRANSFER_PAIRS if first in scores and second in scores]
    results = family([(scores[a], scores[b]) for a, b in present], looks=summary.get("looks", 1))
    for (first, second), result in zip(present, results, strict=True):
        lines.append(f"| {first} − {second} | {result.difference:+.3f} | {verdict(result)} |")
    return "\n".join(lines)


def transfer_figures(summary: dict[str, Any]) -> dict[str, str]:
    """Study 2's prose figures: the BioASQ teacher of its first version (`bioasq-teacher.json`), the teacher and the
    initialisation, the runs that predicted one class, each arm's AUROC (`auroc:ARM`, `sd:ARM`), gap closed
    (`gap:ARM`) and its runs' initial AUROC (`init:ARM`), each comparison (`A-B`, ...), the paper's gaps
    (`paper:ARM`) and its GAD appendix (`paper-gad:...`)."""
    rows, task = summary["rows"], summary["rows"][0]["task"]
    bioasq = load("bioasq-teacher")
    figures = {"bioasq-dev": ", ".join(f"{epoch['auroc']:.2f}" for epoch in bioasq["dev_by_epoch"]),
               "bioasq-test": f"{bioasq['test']['auroc']:.3f}",
               "teacher": f"{summary['teachers'][task]['test'][rows[0]['metric']]:.3f}",
               "init": f"{statistics.fmean(r['init'] for r in rows):.3f}",
               "one-class": f"{sum(bool(r['degenerate']) for r in summary['runs'])} of the {len(summary['runs'])}"}
    figures |= {f"paper:{arm}": pct(gap) for arm, gap in PAPER_GAP.items()}
    figures |= {f"paper-gad:{name}": f"{auc:.3f}" for name, auc in PAPER_GAD_APPENDIX.items()}
    for row in rows:
        runs = [r for r in summary["runs"] if r["task"] == task and r["arm"] == row["arm"]]
        figures |= {f"auroc:{row['arm']}": f"{row['mean']:.3f}", f"sd:{row['arm']}": f"{row['sd']:.3f}",
                    f"gap:{row['arm']}": gap_cell(row["gap_closed_per_seed"]),
                    f"init:{row['arm']}": ", ".join(f"{r['init']['auroc']:.2f}" for r in runs)}
    scores = {row["arm"]: row["scores"] for row in rows}
    present = [(first, second) for first, second in TRANSFER_PAIRS if first in scores and second in scores]
    results = family([(scores[a], scores[b]) for a, b in present], looks=summary.get("looks", 1))
    for (first, second), result in zip(present, results, strict=True):
        figures |= comparison_figures(f"{first}-{second}", result, 3, 1.0)
    return figures


# ------------------------------------------------------------------------------------------ study 3


ORDER = [("meta-adaptive", "metadistil"), ("metadistil", "kd"), ("kd", "pkd"), ("kd", "finetune"), ("pkd", "finetune")]


def meta_tables(summary: dict[str, Any]) -> str:
    rows = summary["rows"]
    tasks = list(dict.fromkeys(row["task"] for row in rows))
    arms = list(dict.fromkeys(row["arm"] for row in rows))
    by = {(row["task"], row["arm"]): row for row in rows}
    lines = ["| arm | " + " | ".join(f"{TASK_TITLES.get(t, t)} F1" for t in tasks) + " | mean |",
             "|---" * (len(tasks) + 2) + "|",
             "| teacher (6 × 384) | " + " | ".join(f"{100 * by[t, arms[0]]['teacher']:.1f}" for t in tasks)
             + f" | {100 * statistics.fmean(by[t, arms[0]]['teacher'] for t in tasks):.1f} |"]
    for arm in arms:
        cells = [pm(by[t, arm]["mean"], by[t, arm]["sd"]) + (" (degenerate)" if by[t, arm]["degenerate_seeds"] else "")
                 for t in tasks]
        mean = statistics.fmean(by[t, arm]["mean"] for t in tasks)
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {100 * mean:.1f} |")
    lines += ["", "Seeds (F1 ×100): " + "; ".join(
        f"{TASK_TITLES.get(t, t)} {arm} " + ", ".join(f"{100 * s:.1f}" for s in by[t, arm]["scores"])
        for t in tasks for arm in arms), "",
        "| comparison (the paper's order) | " + " | ".join(TASK_TITLES.get(t, t) for t in tasks) + " |",
        "|---" * (len(tasks) + 1) + "|"]
    present = [(first, second) for first, second in ORDER if first in arms and second in arms]
    results = iter(family([(by[task, first]["scores"], by[task, second]["scores"])
                           for first, second in present for task in tasks], looks=summary.get("looks", 1)))
    for first, second in present:
        cells = [f"{100 * result.difference:+.1f} ({verdict(result, 100, 1)})" for result in
                 (next(results) for _ in tasks)]
        lines.append(f"| {first} − {second} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, *_auroc_table(summary, tasks, arms), "", _wall_time(summary)])


def _auroc_table(summary: dict[str, Any], tasks: list[str], arms: list[str]) -> list[str]:
    """Binary tasks also report AUROC, which still ranks the models that predict one class (F1 0 or 0.67)."""
    runs = summary["runs"]
    binary = [t for t in tasks if all("auroc" in r["test"] for r in runs if r["task"] == t)]
    lines = []
    for task in binary:
        title = TASK_TITLES.get(task, task)
        teacher = summary["teachers"][task]["test"].get("auroc")
        lines += ["", f"{title} AUROC (threshold-free; teacher {teacher:.3f}):", "",
                  "| arm | AUROC (mean ± sd) | seeds | predicted one class |", "|---|---|---|---|"]
        for arm in arms:
            lines.append(auroc_row(arm, [r for r in runs if r["task"] == task and r["arm"] == arm]))
        lines += ["", f"| comparison (the paper's order) | {title} AUROC |", "|---|---|"]
        for (first, second), result in auroc_family(summary, task, arms).items():
            lines.append(f"| {first} − {second} | {result.difference:+.3f} ({verdict(result)}) |")
    return lines


def auroc_family(summary: dict[str, Any], task: str, arms: list[str]) -> dict[tuple[str, str], Comparison]:
    """The paper's order of comparisons on a task's test AUROC, one family."""
    present = [(first, second) for first, second in ORDER if first in arms and second in arms]
    auroc = {arm: [r["test"]["auroc"] for r in summary["runs"] if r["task"] == task and r["arm"] == arm]
             for arm in arms}
    results = family([(auroc[a], auroc[b]) for a, b in present], looks=summary.get("looks", 1))
    return dict(zip(present, results, strict=True))


def meta_figures(summary: dict[str, Any]) -> dict[str, str]:
    """Study 3's prose figures: the ChemProt teacher of its first version (`chemprot-teacher.json`), the runs that
    predicted one class, each arm's F1 sd (`f1-sd:ARM`, ×100, whole points) and test AUROC (`auroc:ARM`, `sd:ARM`,
    `seeds:ARM`), the teacher's AUROC and the AUROC comparisons (`A-B`, ...)."""
    task = "gad"
    runs = [r for r in summary["runs"] if r["task"] == task]
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    figures = {"chemprot-teacher": num(load("chemprot-teacher")["test"]["f1"], 1),
               "one-class": f"{sum(bool(r['degenerate']) for r in runs)} of the {len(runs)}",
               "teacher": f"{summary['teachers'][task]['test']['auroc']:.3f}"}
    for row in (row for row in summary["rows"] if row["task"] == task):
        auroc = [r["test"]["auroc"] for r in runs if r["arm"] == row["arm"]]
        figures |= {f"f1-sd:{row['arm']}": f"{100 * row['sd']:.0f}",
                    f"auroc:{row['arm']}": f"{statistics.fmean(auroc):.3f}",
                    f"sd:{row['arm']}": f"{statistics.stdev(auroc):.3f}"}
    for (first, second), result in auroc_family(summary, task, arms).items():
        figures |= comparison_figures(f"{first}-{second}", result, 3, 1.0)
    figures["holm:finetune"] = each([figures["kd-finetune:holm"], figures["pkd-finetune:holm"]])
    meta = [[f"{r['test']['auroc']:.3f}" for r in runs if r["arm"] == arm] for arm in ("metadistil", "meta-adaptive")]
    figures["meta-seeds"] = ", ".join("/".join(pair) for pair in zip(*meta, strict=True))
    return figures


# ------------------------------------------------------------------------------------------ study 4


PAPER_GAP = {"kd-general": 0.484, "kd-random": 0.232}  # the transfer-data paper, BioASQ yes/no
# The same paper's appendix Table 1, GAD AUC: BioBERT distilled into BERT on biomedical (EUADR) and general (TACRED)
# data, and BERT fine-tuned.
PAPER_GAD_APPENDIX = {"euadr": 0.471, "tacred": 0.503, "bert": 0.701}


def users_setting_tables(summary: dict[str, Any]) -> str:
    """Per task: the teacher (its seeds and the dev checkpoints they kept, where it has several), every arm's F1
    (P/R), and each arm against the budget-only student: the difference with its verdict (every task's comparisons
    one family) and the gap closed (S − S_budget)/(T − S_budget) — with the study's bootstrap interval over both arms'
    seeds, the teacher seeds and the sentences, on test and dev, where the record has it (`reference_arm`); else
    the difference's interval on the same scale (T and the budget's mean taken as fixed)."""
    lines: list[str] = []
    judged = users_family(summary)
    for task in dict.fromkeys(row["task"] for row in summary["rows"]):
        rows = {row["arm"]: row for row in summary["rows"] if row["task"] == task}
        budget, record = rows["budget"], summary["teachers"][task]
        teacher, runs = record["test"], [r for r in summary["runs"] if r["task"] == task]
        gap = teacher[budget["metric"]] - budget["mean"]
        bootstrapped = any("gap" in row for row in rows.values())
        lines += [f"**{TASK_TITLES.get(task, task)}** — teacher F1 {100 * teacher['f1']:.1f} "
                  f"(P {100 * teacher['precision']:.1f}, R {100 * teacher['recall']:.1f}){_teacher_seeds(record)}; "
                  f"the gap to close from the budget-only student: {100 * gap:.1f} F1.", "",
                  "| arm | F1 (mean ± sd) | P | R | seeds | − budget (F1) | verdict | gap closed |"
                  + (" gap closed, dev |" if bootstrapped else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if bootstrapped else "")]
        for arm, row in rows.items():
            group = [r["test"] for r in runs if r["arm"] == arm]
            precision, recall = (statistics.fmean(t[key] for t in group) for key in ("precision", "recall"))
            cells = ["", "", ""] + ([""] if bootstrapped else [])
            if arm != "budget":
                result = judged[task, arm]
                if bootstrapped:
                    closed, dev = _gap_cell(row.get("gap")), [_gap_cell(row.get("gap_dev"))]
                else:
                    closed, dev = f"{100 * result.difference / gap:.0f}%", []
                    if result.low is not None:
                        closed += f" ({100 * result.low / gap:.0f}% to {100 * result.high / gap:.0f}%)"
                if arm in PAPER_GAP:
                    closed += f"; paper {100 * PAPER_GAP[arm]:.1f}%"
                cells = [f"{100 * result.difference:+.1f}", verdict(result, 100, 1), closed, *dev]
            flag = " (degenerate)" if row["degenerate_seeds"] else ""
            lines.append(f"| {arm} | {pm(row['mean'], row['sd'])}{flag} | {100 * precision:.1f} | {100 * recall:.1f} | "
                         f"{', '.join(f'{100 * s:.1f}' for s in row['scores'])} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join([*lines, _wall_time(summary)])


def _teacher_seeds(record: dict[str, Any]) -> str:
    """`, mean of seeds 1 (F1 …, dev checkpoint at step …) and 2 (…)` for a teacher trained with several seeds."""
    seeds = record.get("teacher_seeds") or {}
    if len(seeds) < 2:
        return ""
    return ", the mean of seeds " + " and ".join(
        f"{seed} ({100 * one['test']['f1']:.1f}, dev checkpoint at step {one['best_step']})"
        for seed, one in seeds.items())


def _gap_cell(gap: dict[str, Any] | None) -> str:
    if not gap or "estimate" not in gap:
        return "–"
    return f"{100 * gap['estimate']:.0f}% ({100 * gap['low']:.0f}% to {100 * gap['high']:.0f}%)"


def users_family(summary: dict[str, Any]) -> dict[tuple[str, str], Comparison]:
    """Study 4's comparisons, each arm against its task's budget-only student: one family, at α/looks."""
    budgets = {row["task"]: row for row in summary["rows"] if row["arm"] == "budget"}
    others = [row for row in summary["rows"] if row["arm"] != "budget"]
    return dict(zip([(row["task"], row["arm"]) for row in others],
                    family([(row["scores"], budgets[row["task"]]["scores"]) for row in others],
                           looks=summary.get("looks", 1)), strict=True))


def users_setting_figures(summary: dict[str, Any]) -> dict[str, str]:
    """Study 4's prose figures, per task (TASK:…): each arm against the budget (`TASK:ARM`, `:ci`, `:p`, `:holm`,
    `:seeds`; `:p1` its p before the correction for any extra look), the gap closed and its interval (`TASK:ARM:gap`,
    `:gap-ci`; the bootstrap's over runs, teacher seeds and sentences where the record has it, with `:gap-dev` and
    `:gap-dev-ci` on the dev split), the teacher (`TASK:teacher`, its seeds' scores `TASK:teacher-seeds`), the
    budget-only student's F1 range over the tasks, the runs' seconds; the wall times."""
    figures = _wall_time_figures(summary) | {f"paper:{arm}": pct(gap) for arm, gap in PAPER_GAP.items()}
    budgets = {row["task"]: row for row in summary["rows"] if row["arm"] == "budget"}
    rows = {(row["task"], row["arm"]): row for row in summary["rows"]}
    for (task, arm), result in users_family(summary).items():
        gap = summary["teachers"][task]["test"]["f1"] - budgets[task]["mean"]
        figures |= comparison_figures(f"{task}:{arm}", result)
        figures[f"{task}:{arm}:p1"] = p_text(result.p_value / result.looks)
        figures |= _gap_figures(f"{task}:{arm}", rows[task, arm], result, gap)
    for task, record in summary["teachers"].items():
        figures[f"{task}:teacher"] = num(record["test"]["f1"], 1, 100)
        seeds = record.get("teacher_seeds") or {}
        if seeds:
            figures[f"{task}:teacher-seeds"] = " and ".join(num(one["test"]["f1"], 1, 100) for one in seeds.values())
    budget = [row["mean"] for row in budgets.values()]
    figures["budget-range"] = f"{100 * min(budget):.0f}-{100 * max(budget):.0f}"
    for task in budgets:
        seconds = [run["wall_seconds"] for run in summary["runs"] if run["task"] == task]
        figures[f"{task}:run-seconds"] = f"{min(seconds):.0f}-{max(seconds):.0f}"
    return figures


def _gap_figures(prefix: str, row: dict[str, Any], result: Comparison, gap: float) -> dict[str, str]:
    """The gap closed and its interval: the bootstrap's (test, and dev as `:gap-dev`) where the row has it, else the
    difference's interval divided by the gap (T and the budget's mean taken as fixed)."""
    if "estimate" in row.get("gap", {}):
        figures = {}
        for name, key in ((":gap", "gap"), (":gap-dev", "gap_dev")):
            if "estimate" in row.get(key, {}):
                closed = row[key]
                figures |= {prefix + name: num(closed["estimate"], 0, 100) + "%",
                            prefix + name + "-ci": f"{num(closed['low'], 0, 100)}% to {num(closed['high'], 0, 100)}%"}
        return figures
    return {prefix + ":gap": num(result.difference / gap, 0, 100) + "%",
            prefix + ":gap-ci": f"{num(result.low / gap, 0, 100)}% to {num(result.high / gap, 0, 100)}%"}


def _wall_time_figures(summary: dict[str, Any]) -> dict[str, str]:
    """A study's minutes in all, of its teachers and of its student runs (as `_wall_time` writes them)."""
    teachers = _teacher_seconds(summary)
    return {"minutes": f"{summary['wall_seconds'] / 60:.1f}", "teacher-minutes": f"{teachers / 60:.1f}",
            "student-minutes": f"{(summary['wall_seconds'] - teachers) / 60:.1f}", "runs": str(len(summary["runs"]))}


def _teacher_seconds(summary: dict[str, Any]) -> float:
    return sum((t.get("wall_seconds") or 0) + sum(m.get("wall_seconds") or 0 for m in t.get("more_teachers", {})
                                                  .values()) for t in summary["teachers"].values())


def _wall_time(summary: dict[str, Any]) -> str:
    teachers = _teacher_seconds(summary)
    runs = len(summary["runs"])
    return (f"Wall time: {summary['wall_seconds'] / 60:.1f} min in all (teachers {teachers / 60:.1f} min, "
            f"{runs} student runs {(summary['wall_seconds'] - teachers) / 60:.1f} min), "
            f"{summary['machine']['torch_threads']} torch thread(s).")


# ------------------------------------------------------------------------------------------ study 5


def multi_teacher_tables(summary: dict[str, Any]) -> str:
    """Per task: each teacher and their ensemble, every arm's F1, and each arm of two teachers against the better
    single-teacher arm (Welch's t-test on the per-seed scores)."""
    lines: list[str] = []
    for task in dict.fromkeys(row["task"] for row in summary["rows"]):
        rows = {row["arm"]: row for row in summary["rows"] if row["task"] == task}
        record = summary["teachers"][task]
        metric = next(iter(rows.values()))["metric"]
        teachers = [("teacher", record["test"]), *((name, more["test"])
                                                   for name, more in record.get("more_teachers", {}).items())]
        cells = [f"{name} {100 * scores[metric]:.1f}" for name, scores in teachers]
        if "ensemble" in record:
            cells.append(f"their ensemble {100 * record['ensemble']['test'][metric]:.1f}")
        lines += [f"**{TASK_TITLES.get(task, task)}** — teachers' test {metric.upper()}: " + "; ".join(cells) + ".",
                  "", f"| arm | {metric} (mean ± sd) | seeds |", "|---|---|---|"]
        lines += [f"| {arm} | {pm(row['mean'], row['sd'])} | {', '.join(f'{100 * s:.1f}' for s in row['scores'])} |"
                  for arm, row in rows.items()]
        best, results = multi_teacher_family(summary, task)
        if best:
            lines += ["", f"| two teachers − the better single teacher ({best}) | difference | verdict |",
                      "|---|---|---|"]
            for arm, result in results.items():
                lines.append(f"| {arm} | {100 * result.difference:+.1f} | {verdict(result, 100, 1)} |")
        lines.append("")
    return "\n".join([*lines, _wall_time(summary)])


SINGLE_TEACHER = ("kd-minilm", "kd-mpnet")


def multi_teacher_family(summary: dict[str, Any], task: str) -> tuple[str, dict[str, Comparison]]:
    """The better single-teacher arm of a task and each other arm against it, one family ("" and {}: no such arm)."""
    rows = {row["arm"]: row for row in summary["rows"] if row["task"] == task}
    single = [arm for arm in rows if arm in SINGLE_TEACHER]
    if not single:
        return "", {}
    best = max(single, key=lambda arm: rows[arm]["mean"])
    pairs = [arm for arm in rows if arm not in single]
    results = family([(rows[arm]["scores"], rows[best]["scores"]) for arm in pairs], looks=summary.get("looks", 1))
    return best, dict(zip(pairs, results, strict=True))


def multi_teacher_figures(summary: dict[str, Any]) -> dict[str, str]:
    """Study 5's prose figures (NCBI-disease): the teachers' F1 (`teacher:NAME`) and their ensemble's gain over the
    better one, each arm's F1 (`f1:ARM`), the single-teacher arms' difference (its own test), the two-teacher arms
    against the better single teacher (`ARM`, ... and their ranges), the seeds at which kd-per-teacher scores exactly
    as kd-mixture, the wall times (and the runs recorded at under half the median run's, resumed ones)."""
    task = "ncbi_disease"
    record, rows = summary["teachers"][task], {row["arm"]: row for row in summary["rows"] if row["task"] == task}
    teachers = [record["test"]["f1"], *(more["test"]["f1"] for more in record["more_teachers"].values())]
    figures = _wall_time_figures(summary) | {
        "teachers": "/".join(dict.fromkeys(num(f1, 1, 100) for f1 in teachers)),
        "ensemble": num(record["ensemble"]["test"]["f1"], 1, 100),
        "ensemble-gain": signed(record["ensemble"]["test"]["f1"] - max(teachers), 1, 100),
        "mpnet-teacher-minutes": f"{record['more_teachers']['mpnet']['wall_seconds'] / 60:.1f}",
        "teacher:teacher": num(record["test"]["f1"], 1, 100),
        "teacher-lead": num(max(teachers) - min(teachers), 1, 100)}
    figures |= {f"teacher:{name}": num(more["test"]["f1"], 1, 100) for name, more in record["more_teachers"].items()}
    figures |= {f"f1:{arm}": num(row["mean"], 1, 100) for arm, row in rows.items()}
    same = sum(a == b for a, b in zip(rows["kd-per-teacher"]["scores"], rows["kd-mixture"]["scores"], strict=True))
    figures["per-teacher-as-mixture"] = f"{same} of {len(rows['kd-mixture']['scores'])}"
    figures |= _short_run_figures(summary)
    figures |= comparison_figures("kd-mpnet-kd-minilm", compare_scores(rows["kd-mpnet"]["scores"],
                                                                        rows["kd-minilm"]["scores"]))
    results = multi_teacher_family(summary, task)[1]
    for arm, result in results.items():
        figures |= comparison_figures(arm, result)
    two = [rows[arm]["mean"] for arm in results]
    gains = [result.difference for result in results.values()]
    seeds = [result.seeds_needed for result in results.values()]
    figures |= {"two-teacher-range": f"{num(min(two), 1, 100)}-{num(max(two), 1, 100)}",
                "gain-range": f"{signed(min(gains), 1, 100)} to {signed(max(gains), 1, 100)}",
                "highs": f"{signed(min(r.high for r in results.values()), 1, 100)} to "
                         f"{signed(max(r.high for r in results.values()), 1, 100)}",
                "holm": each([p_text(result.p_holm) for result in results.values()]),
                "seeds-range": f"{min(seeds)}-{max(seeds)}"}
    return figures


def _short_run_figures(summary: dict[str, Any]) -> dict[str, str]:
    """The runs recorded at under half the median run's wall time (resumed before a run's wall time counted its
    earlier segments): which (`short-runs`), their seconds, the median, and the minutes the sum leaves out were each
    as long as the median (`short-minutes`)."""
    seconds = [run["wall_seconds"] for run in summary["runs"]]
    median = statistics.median(seconds)
    short = [run for run in summary["runs"] if run["wall_seconds"] < median / 2]
    if not short:
        return {"short-runs": "none", "median-run-seconds": f"{median:.0f}", "short-minutes": "0.0"}
    return {"short-runs": each([f"{run['arm']} seed {run['seed']}" for run in short]),
            "short-seconds": each([f"{run['wall_seconds']:.0f}" for run in short]),
            "median-run-seconds": f"{median:.0f}",
            "short-minutes": f"{sum(median - run['wall_seconds'] for run in short) / 60:.1f}"}


# ------------------------------------------------------------------------------------------ study 6

PAPER_NCBI = {"BioBERT (12 × 768)": 88.62, "DistilBioBERT (6 × 768)": 87.93}  # Rohanian et al., NCBI-disease F1
SEEDS_SCALE_PAIRS = (("kd-6x768", "ft-6x768"), ("ft-6x768-distilled", "ft-6x768"), ("kd-3x384", "ft-3x384"))


def seeds_scale_tables(record: dict[str, Any]) -> str:
    """Study 6 (the `pipeline.json` of recipes/studies/seeds-scale.yaml): every arm's F1 with its 95% interval and
    share of the teacher; each distilled arm against its fine-tuned peer; the deploy stage's size, scores and speed
    of the teacher and of each arm's first seed, PyTorch fp32 and ONNX int8 side by side."""
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary = stages["study"]["summary"]
    task = summary["rows"][0]["task"]
    teacher = summary["teachers"][task]["test"]
    deploy = stages["deploy"]["deploy"] if stages.get("deploy") and stages["deploy"].get("deploy") else None
    papers = "; ".join(f"{name} {score:.2f}" for name, score in PAPER_NCBI.items())
    lines = [f"**{TASK_TITLES.get(task, task)}**, full training and test sets — teacher `mpnet-base` (a general-domain "
             f"sentence encoder, not a biomedical one) fine-tuned: F1 {100 * teacher['f1']:.1f} (P "
             f"{100 * teacher['precision']:.1f}, R {100 * teacher['recall']:.1f}); the papers: {papers}.", "",
             "| arm | F1 (mean ± sd) | 95% CI | P | R | seeds | share of the teacher |",
             "|---|---|---|---|---|---|---|"]
    rows = {row["arm"]: row for row in summary["rows"]}
    for arm, row in rows.items():
        group = [r["test"] for r in summary["runs"] if r["arm"] == arm]
        precision, recall = (statistics.fmean(t[key] for t in group) for key in ("precision", "recall"))
        flag = " (degenerate)" if row["degenerate_seeds"] else ""
        lines.append(f"| {arm} | {pm(row['mean'], row['sd'])}{flag} | {_mean_interval(row['scores'])} | "
                     f"{100 * precision:.1f} | {100 * recall:.1f} | "
                     f"{', '.join(f'{100 * s:.1f}' for s in row['scores'])} | {_share(row['mean'], teacher['f1'])} |")
    lines += ["", "| comparison | difference (F1) | verdict |", "|---|---|---|"]
    for (first, second), result in seeds_scale_family(summary).items():
        lines.append(f"| {first} − {second} | {100 * result.difference:+.1f} | {verdict(result, 100, 1)} |")
    lines += ["", f"Task-agnostic stage (`distilled`): {_distillation(stages.get('distilled'))}.", ""]
    if deploy:
        lines += [_deploy_table(deploy), ""]
    return "\n".join([*lines, _wall_time(summary)])


def seeds_scale_family(summary: dict[str, Any]) -> dict[tuple[str, str], Comparison]:
    """Each distilled arm of Study 6 against its fine-tuned peer, one family, at α/looks."""
    rows = {row["arm"]: row for row in summary["rows"]}
    present = [(first, second) for first, second in SEEDS_SCALE_PAIRS if first in rows and second in rows]
    results = family([(rows[first]["scores"], rows[second]["scores"]) for first, second in present],
                     looks=summary.get("looks", LOOKS["seeds-scale"]))
    return dict(zip(present, results, strict=True))


def seeds_scale_figures(record: dict[str, Any]) -> dict[str, str]:
    """Study 6's prose figures: the papers' (`paper:…`), each arm's F1, sd and share of the teacher (`f1:ARM`, …),
    each comparison (`A-B`, …), the teacher's lead, the deploy stage's int8 losses and speeds, the int8 records
    beside it (`seeds-scale-*.json`) and the wall times."""
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary, distilled = stages["study"]["summary"], stages["distilled"]["summary"]["result"]
    teacher = summary["teachers"]["ncbi_disease"]["test"]["f1"]
    rows = {row["arm"]: row for row in summary["rows"]}
    paper = PAPER_NCBI["DistilBioBERT (6 × 768)"] / PAPER_NCBI["BioBERT (12 × 768)"]
    figures = _wall_time_figures(summary) | _deploy_figures(stages["deploy"]["deploy"]) | _int8_way_figures() | {
        "paper-share": pct(paper), "paper:BioBERT": f"{PAPER_NCBI['BioBERT (12 × 768)']:.2f}",
        "paper:DistilBioBERT": f"{PAPER_NCBI['DistilBioBERT (6 × 768)']:.2f}", "teacher": num(teacher, 1, 100),
        "distilled-tokens": f"{distilled['tokens_seen'] / 1e6:.2f}",
        "distilled-minutes": f"{distilled['seconds'] / 60:.1f}",
        "ft-share-range": "-".join(f"{100 * rows[arm]['mean'] / teacher:.0f}"
                                   for arm in ("ft-6x768", "ft-6x768-distilled")) + "%"}
    for arm, row in rows.items():
        figures |= {f"f1:{arm}": num(row["mean"], 1, 100), f"sd:{arm}": num(row["sd"], 1, 100),
                    f"share:{arm}": _share(row["mean"], teacher), f"lead:{arm}": num(teacher - row["mean"], 1, 100)}
    for (first, second), result in seeds_scale_family(summary).items():
        figures |= comparison_figures(f"{first}-{second}", result)
    return figures


def _deploy_figures(deploy: dict[str, Any]) -> dict[str, str]:
    """Study 6's deploy stage: each model's int8 − PyTorch loss on test (`int8-loss:MODEL`), the 6 × 768 students'
    range of it, and the batch-1 latencies (ms) and speeds against the PyTorch teacher, fp32 and int8, per size."""
    cells = {cell["model"]: cell["test"]["f1"] for cell in deploy["results"]["cells"]}
    ms = {row["label"]: row["latency"]["128"]["median_ms"] for row in deploy["bench"]["models"]}
    losses = {model: cells[model] - cells[f"{model}-onnx-int8"] for model in cells if f"{model}-onnx-int8" in cells}
    figures = {f"int8-loss:{model}": num(-loss, 1, 100) for model, loss in losses.items()}
    six, three = ["ft-6x768", "kd-6x768", "ft-6x768-distilled"], ["ft-3x384", "kd-3x384"]
    figures["int8-loss-6x768"] = f"{100 * min(losses[m] for m in six):.2f}-{100 * max(losses[m] for m in six):.2f}"
    figures["teacher-ms"] = f"{ms['teacher']:.0f}"
    figures["teacher-parameters"] = next(f"{row['parameters'] / 1e6:.1f}" for row in deploy["bench"]["models"]
                                         if row["label"] == "teacher")
    for size, models in (("6x768", six), ("3x384", three)):
        fp32, int8 = [ms[m] for m in models], [ms[f"{m}-onnx-int8"] for m in models]
        digits = 0 if size == "6x768" else 1
        figures |= {f"ms:{size}": f"{min(fp32):.0f}-{max(fp32):.0f}",
                    f"int8-ms:{size}": f"{min(int8):.{digits}f}" + ("" if digits == 0 else f"-{max(int8):.1f}"),
                    f"speed:{size}": f"{ms['teacher'] / max(fp32):.1f}-{ms['teacher'] / min(fp32):.1f}",
                    f"int8-speed:{size}": f"{ms['teacher'] / max(int8):.1f}-{ms['teacher'] / min(int8):.1f}"}
    figures["int8-speed-3x384-round"] = f"{ms['teacher'] / statistics.fmean(ms[f'{m}-onnx-int8'] for m in three):.0f}"
    return figures


def _int8_way_figures() -> dict[str, str]:
    """The int8 records of Study 6's way to SmoothQuant: the blockwise scheme's speed against the teacher, the
    shares of PyTorch's entities with layers kept in fp32 and with smoothing."""
    blockwise = {row["label"]: row["latency"]["128"]["median_ms"] for row in load("seeds-scale-blockwise")["models"]}
    layers = {row["keep_fp32"]: row["share_of_pytorch"] for row in load("seeds-scale-int8-layers")["rows"]}
    kept = [share for keep, share in layers.items() if keep != "none"]
    smooth = {(row["scheme"], row["smooth"], row["smooth_inputs"]): row["share_of_pytorch"]
              for row in load("seeds-scale-int8-smooth")["rows"]}
    return {"blockwise-speed": f"{blockwise['teacher'] / blockwise['blockwise-int8']:.1f}",
            "kept-fp32": f"{100 * min(kept):.1f}-{100 * max(kept):.1f}%", "kept-none": pct(layers["none"]),
            "smooth-0.8": pct(smooth["per-channel", 0.8, "all"]), "no-smooth": pct(smooth["per-channel", None, None])}


def _mean_interval(scores: list[float] | list[list[float]]) -> str:
    """The 95% t-interval of a mean over seeds (or over a grid of starts × seeds, crossed:
    `biodistil.tasks.significance.mean_estimate`), in F1 points."""
    from scipy import stats

    estimate = mean_estimate(scores)
    if estimate.units < 2:
        return "n/a (one seed)"
    half = stats.t.ppf(0.975, estimate.dof) * math.sqrt(estimate.variance)
    return f"{100 * (estimate.mean - half):.1f} to {100 * (estimate.mean + half):.1f}"


def _deploy_table(deploy: dict[str, Any]) -> str:
    """Per deployed model (first seed): parameters, test F1 in PyTorch fp32 and ONNX int8, batch-1 latency and
    batch-32 throughput at 128 tokens, 1 thread, and the speed against the PyTorch teacher's batch-1 latency."""
    cells = {cell["model"]: cell for cell in deploy["results"]["cells"]}
    timed = {row["label"]: row for row in deploy["bench"]["models"]}
    length = str(deploy["bench"]["settings"]["lengths"][0]) if deploy["bench"].get("settings") else "128"
    teacher_ms = timed["teacher"]["latency"][length]["median_ms"]
    lines = [f"Deployed (first seed of each arm; test split; {length} tokens, 1 thread, one process):", "",
             "| model | parameters | F1 PyTorch fp32 | F1 ONNX int8 | batch 1 ms (fp32 → int8) | batch 32 seq/s "
             "(fp32 → int8) | int8 × the teacher's batch-1 speed |", "|---|---|---|---|---|---|---|"]
    for name in (label for label in timed if not label.endswith(("-onnx", "-onnx-int8"))):
        int8 = timed.get(f"{name}-onnx-int8")
        fp32 = timed[name]
        score = cells[name]["test"]["f1"]
        int8_score = cells[f"{name}-onnx-int8"]["test"]["f1"] if f"{name}-onnx-int8" in cells else None
        latency = f"{fp32['latency'][length]['median_ms']:.1f}"
        throughput = f"{fp32['throughput'][length]['sequences_per_s']:.0f}"
        speed = ""
        if int8:
            latency += f" → {int8['latency'][length]['median_ms']:.1f}"
            throughput += f" → {int8['throughput'][length]['sequences_per_s']:.0f}"
            speed = f"{teacher_ms / int8['latency'][length]['median_ms']:.1f}×"
        int8_cell = "" if int8_score is None else f"{100 * int8_score:.1f}"
        lines.append(f"| {name} | {fp32['parameters'] / 1e6:.1f} M | {100 * score:.1f} | {int8_cell} | {latency} | "
                     f"{throughput} | {speed} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ study 6, converged

# recipes/studies/seeds-scale-converged.yaml: its record replaces seeds-scale.json when whole; until then these
# functions are checked on a run of the recipe at test size (tests/test_pipeline_stages.py).
SEEDS_SCALE_STARTS = {"ft-6x768": "teacher layers 0, 2, …, 10", "kd-6x768": "teacher layers 0, 2, …, 10",
                      "ft-6x768-distilled": "each distillation run", "ft-3x384": "minilm-l6 layers 0, 2, 4",
                      "kd-3x384": "minilm-l6 layers 0, 2, 4"}
SEEDS_SCALE_TARGET = 0.98  # issue 56: does the distilled 6 × 768 student keep ≥ 98% of its teacher?


def seeds_scale_converged_tables(record: dict[str, Any]) -> str:
    """Study 6 at its claims' strength (the `pipeline.json` of recipes/studies/seeds-scale-converged.yaml): the
    teacher's seeds; every arm's F1 over its runs with its share of the teacher on test and dev (two-level bootstrap
    intervals); the runs; the comparisons, one family; the distillation runs; each int8 graph against its PyTorch
    model (paired bootstrap over the test sentences); the speed of each arm's first seed; the wall time."""
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary, deploy = stages["study"]["summary"], stages["deploy"]["deploy"]
    (task, teacher), = summary["teachers"].items()
    seeds = teacher["teacher_seeds"].values()
    papers = "; ".join(f"{name} {score:.2f}" for name, score in PAPER_NCBI.items())
    lines = [f"**{TASK_TITLES.get(task, task)}**, full training and test sets — teacher `mpnet-base` (a general-domain "
             f"sentence encoder, not a biomedical one) fine-tuned on the students' schedule ({teacher['steps']} steps, "
             f"the best dev checkpoint kept: steps {', '.join(str(seed['best_step']) for seed in seeds)}), seeds "
             f"{', '.join(teacher['teacher_seeds'])}: test F1 "
             f"{', '.join(num(seed['test']['f1'], 1, 100) for seed in seeds)} (T = {num(teacher['test']['f1'], 1, 100)}"
             f"); the papers: {papers}.", "",
             "| arm | start | F1 (mean ± sd) | 95% CI | P | R | distillation runs | share of the teacher, test | "
             "share, dev |", "|---|---|---|---|---|---|---|---|---|"]
    for row in summary["rows"]:
        group = [run["test"] for run in summary["runs"] if run["arm"] == row["arm"]]
        precision, recall = (statistics.fmean(test[key] for test in group) for key in ("precision", "recall"))
        flag = " (degenerate)" if row["degenerate_seeds"] else ""
        runs = ", ".join(f"{100 * s:.1f}" for s in row.get("start_scores", [])) or "—"
        lines.append(f"| {row['arm']} | {SEEDS_SCALE_STARTS.get(row['arm'], '')} | {pm(row['mean'], row['sd'])}{flag} "
                     f"| {_mean_interval(_units(row))} | {100 * precision:.1f} | {100 * recall:.1f} | {runs} | "
                     f"{_bootstrap_share(row['share'])} | {_bootstrap_share(row.get('share_dev'))} |")
    lines += ["", *_run_by_run(summary), "", "| comparison | difference (F1) | verdict |", "|---|---|---|"]
    for (first, second), result in seeds_scale_converged_family(summary).items():
        lines.append(f"| {first} − {second} | {100 * result.difference:+.1f} | {verdict(result, 100, 1)} |")
    lines += ["", f"Task-agnostic stage (`distilled-1`…): {_distillation_runs(stages, 'distilled')}.", "",
              _int8_table(deploy), "", _deploy_table(deploy), "", _study_pipeline_wall_time(record)]
    return "\n".join(lines)


def _run_by_run(summary: dict[str, Any]) -> list[str]:
    """Each arm's test F1 run by run: a distilled arm's by distillation run, its fine-tuning seeds within each."""
    lines = ["Run by run (test F1 ×100; a distilled arm's runs by distillation seed, fine-tuning seeds 1, 2, 3 within "
             "each):", "", "| model | F1 |", "|---|---|"]
    for row in summary["rows"]:
        runs = [run for run in summary["runs"] if run["arm"] == row["arm"]]
        starts = list(dict.fromkeys(run.get("start") for run in runs))
        lines.append(f"| {row['arm']} | " + "; ".join(
            ", ".join(f"{100 * run['test']['f1']:.1f}" for run in runs if run.get("start") == start)
            for start in starts) + " |")
    return lines


def seeds_scale_converged_family(summary: dict[str, Any]) -> dict[tuple[str, str], Comparison]:
    """Each arm of Study 6 against its fine-tuned peer, one family: Welch on the grid of distillation runs ×
    fine-tuning seeds of the distilled arm (crossed), on the seeds' scores of the others."""
    return _units_family(summary, SEEDS_SCALE_PAIRS)


def _int8_differences(deploy: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each exported model's int8 graph − the model in PyTorch fp32 on the test split (the deploy stage's paired
    bootstrap over test sentences), by the model's name."""
    return {difference["reference"]: difference for difference in deploy["results"]["differences"]
            if difference["model"] == f"{difference['reference']}-onnx-int8"}


def _int8_table(deploy: dict[str, Any]) -> str:
    """Every model's test F1 in PyTorch fp32 and as its ONNX int8 graph, with int8 − PyTorch and its interval."""
    cells = {cell["model"]: cell["test"]["f1"] for cell in deploy["results"]["cells"]}
    lines = ["int8 on every model (test split; int8 − PyTorch with its 95% interval, a paired bootstrap over the test "
             "sentences):", "", "| model | F1 PyTorch fp32 | F1 ONNX int8 | int8 − PyTorch | 95% CI |",
             "|---|---|---|---|---|"]
    for name, difference in _int8_differences(deploy).items():
        lines.append(f"| {name} | {100 * cells[name]:.1f} | {100 * cells[f'{name}-onnx-int8']:.1f} | "
                     f"{100 * difference['estimate']:+.2f} | {100 * difference['low']:+.2f} to "
                     f"{100 * difference['high']:+.2f} |")
    return "\n".join(lines)


def seeds_scale_converged_figures(record: dict[str, Any]) -> dict[str, str]:
    """Study 6's prose figures: the papers' (`paper:…`, `paper-share`); the teacher (`teacher`, `teacher-seeds`);
    each arm's F1, sd, runs' means and shares on test and dev (`f1:ARM`, …, `share-low:ARM`, `share-high:ARM`);
    whether the distilled arm's share reaches 98% (`target-98`); each comparison (`A-B`, …); the distillation's tokens
    and minutes per run; int8 − PyTorch per model (`int8:MODEL`, `int8-ci:MODEL`), its range and lowest bound over
    the students (`int8-range`, `int8-lowest`); the speeds; the wall time (`minutes`)."""
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary, deploy = stages["study"]["summary"], stages["deploy"]["deploy"]
    (_, teacher), = summary["teachers"].items()
    distilled = [stage for name, stage in stages.items() if name.startswith("distilled-")]
    paper = PAPER_NCBI["DistilBioBERT (6 × 768)"] / PAPER_NCBI["BioBERT (12 × 768)"]
    figures = {"paper-share": pct(paper), "paper:BioBERT": f"{PAPER_NCBI['BioBERT (12 × 768)']:.2f}",
               "paper:DistilBioBERT": f"{PAPER_NCBI['DistilBioBERT (6 × 768)']:.2f}",
               "teacher": num(teacher["test"]["f1"], 1, 100), "teacher-steps": str(teacher["steps"]),
               "teacher-seeds": ", ".join(num(seed["test"]["f1"], 1, 100)
                                          for seed in teacher["teacher_seeds"].values()),
               "distilled-runs": str(len(distilled)),
               "distilled-tokens": f"{distilled[0]['summary']['result']['tokens_seen'] / 1e6:.1f}",
               "distilled-minutes": f"{statistics.fmean(training_seconds(stage) for stage in distilled) / 60:.0f}",
               "minutes": f"{_study_pipeline_minutes(record):.0f}"}
    for row in summary["rows"]:
        arm, share = row["arm"], row["share"]
        figures |= {f"f1:{arm}": num(row["mean"], 1, 100), f"sd:{arm}": num(row["sd"], 1, 100),
                    f"runs:{arm}": ", ".join(num(score, 1, 100) for score in row.get("start_scores", [])),
                    f"share:{arm}": _bootstrap_share(share), f"share-dev:{arm}": _bootstrap_share(row.get("share_dev")),
                    f"share-low:{arm}": pct(share["low"]), f"share-high:{arm}": pct(share["high"]),
                    f"lead:{arm}": num(teacher["test"]["f1"] - row["mean"], 1, 100)}
        if arm == "ft-6x768-distilled":
            figures["target-98"] = ("reached" if share["low"] >= SEEDS_SCALE_TARGET else
                                    "not reached" if share["high"] < SEEDS_SCALE_TARGET else "not settled")
    for (first, second), result in seeds_scale_converged_family(summary).items():
        figures |= comparison_figures(f"{first}-{second}", result)
    int8 = _int8_differences(deploy)
    students = [difference for name, difference in int8.items() if not name.startswith("teacher")]
    for name, difference in int8.items():
        figures |= {f"int8:{name}": signed(difference["estimate"], 2, 100),
                    f"int8-ci:{name}": f"{signed(difference['low'], 2, 100)} to {signed(difference['high'], 2, 100)}"}
    if students:
        estimates = [difference["estimate"] for difference in students]
        figures |= {"int8-range": f"{signed(min(estimates), 2, 100)} to {signed(max(estimates), 2, 100)}",
                    "int8-lowest": signed(min(difference["low"] for difference in students), 2, 100)}
    return figures | _speed_figures(deploy)


def _speed_figures(deploy: dict[str, Any]) -> dict[str, str]:
    """Batch-1 latency (ms) of each timed model and its int8 graph (`ms:MODEL`, `int8-ms:MODEL`), and its speed
    against the PyTorch teacher's (`speed:MODEL`, `int8-speed:MODEL`)."""
    length = str(deploy["bench"]["settings"]["lengths"][0])
    ms = {row["label"]: row["latency"][length]["median_ms"] for row in deploy["bench"]["models"]}
    figures = {"teacher-ms": f"{ms['teacher']:.0f}"}
    for label in (label for label in ms if not label.endswith("-onnx-int8")):
        figures |= {f"ms:{label}": f"{ms[label]:.0f}", f"speed:{label}": f"{ms['teacher'] / ms[label]:.1f}"}
        if f"{label}-onnx-int8" in ms:
            int8 = ms[f"{label}-onnx-int8"]
            figures |= {f"int8-ms:{label}": f"{int8:.1f}", f"int8-speed:{label}": f"{ms['teacher'] / int8:.1f}"}
    return figures

# ------------------------------------------------------------------------------------------ study 7

PAPER_VEKD_GAIN = 0.7  # paper 004 (VE-KD), Table 1: VE-KD − Adapt-and-Distill, points on the average of its 12 tasks
VEKD_PAIRS = (("ft-vekd", "ft-adapt-distill"), ("ft-vekd", "ft-kd"))
VEKD_ARMS = {"ft-vekd": ("vekd",), "ft-kd": ("kd",), "ft-adapt-distill": ("ad-general", "ad-adapted", "ad-final")}
AVERAGE = "average"  # the comparisons on each distillation run's mean over the tasks


def vekd_tables(record: dict[str, Any]) -> str:
    """Study 7 (the `pipeline.json` of recipes/studies/vekd.yaml): each task's teachers, every arm's F1 over its
    distillation runs with its share of the teacher on test and dev (paired bootstrap intervals), VE-KD against
    Adapt-and-Distill and against plain KD per task and on the tasks' average (one family), and the stages."""
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary = stages["study"]["summary"]
    teachers = "; ".join(
        f"{TASK_TITLES.get(task, task)} {num(entry['test']['f1'], 1, 100)} (seeds "
        f"{', '.join(num(seed['test']['f1'], 1, 100) for seed in entry['teacher_seeds'].values())})"
        for task, entry in summary["teachers"].items())
    lines = [f"Teachers (T fine-tuned, the best dev checkpoint of the students' schedule; test F1, mean of its seeds): "
             f"{teachers}.", "",
             "| task | arm | F1 (mean ± sd) | 95% CI | distillation runs | share of the teacher, test | share, dev |",
             "|---|---|---|---|---|---|---|"]
    for row in summary["rows"]:
        flag = " (degenerate)" if row["degenerate_seeds"] else ""
        runs = ", ".join(f"{100 * s:.1f}" for s in row["start_scores"])
        lines.append(f"| {TASK_TITLES.get(row['task'], row['task'])} | {row['arm']} | "
                     f"{pm(row['mean'], row['sd'])}{flag} | {_mean_interval(_units(row))} | {runs} | "
                     f"{_bootstrap_share(row['share'])} | {_bootstrap_share(row.get('share_dev'))} |")
    lines += ["", "| comparison | on | difference (F1) | verdict |", "|---|---|---|---|"]
    for (first, second, on), result in vekd_family(summary).items():
        title = "mean of the tasks" if on == AVERAGE else TASK_TITLES.get(on, on)
        lines.append(f"| {first} − {second} | {title} | {100 * result.difference:+.1f} | {verdict(result, 100, 1)} |")
    lines += ["", "| arm | stages per distillation run | steps | tokens | minutes (mean of 3 runs) |",
              "|---|---|---|---|---|"]
    for arm, prefixes in VEKD_ARMS.items():
        runs = [[stages[f"{prefix}-{seed}"]["summary"]["result"] for prefix in prefixes] for seed in (1, 2, 3)]
        minutes = statistics.fmean(sum(part["seconds"] for part in run) for run in runs) / 60
        lines.append(f"| {arm} | {' → '.join(prefixes)} | {sum(part['steps'] for part in runs[0])} | "
                     f"{sum(part['tokens_seen'] for part in runs[0]):,} | {minutes:.1f} |")
    return "\n".join([*lines, "", _study_pipeline_wall_time(record)])


def vekd_family(summary: dict[str, Any]) -> dict[tuple[str, str, str], Comparison]:
    """VE-KD against each other arm on each task and on the tasks' mean, one family (Welch on the distillation runs'
    scores: each run is fine-tuned once per task, so a run's mean over the tasks is one unit)."""
    rows = {(row["task"], row["arm"]): row["start_scores"] for row in summary["rows"]}
    tasks = list(dict.fromkeys(task for task, _ in rows))
    runs = {arm: [statistics.fmean(values) for values in zip(*(rows[task, arm] for task in tasks), strict=True)]
            for _, arm in rows}
    keys = [(first, second, task) for task in tasks for first, second in VEKD_PAIRS]
    keys += [(first, second, AVERAGE) for first, second in VEKD_PAIRS]
    pairs = [(runs[first], runs[second]) if on == AVERAGE else (rows[on, first], rows[on, second])
             for first, second, on in keys]
    return dict(zip(keys, family(pairs, looks=summary.get("looks", 1)), strict=True))


def vekd_figures(record: dict[str, Any]) -> dict[str, str]:
    """Study 7's prose figures: the paper's gain (`paper-gain`), each arm's F1 per task (`f1:ARM:TASK`), each
    comparison (`A-B:ON`, ...), the wall time in minutes (`minutes`)."""
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary = stages["study"]["summary"]
    student = stages["vekd-1"]["summary"]["result"]
    figures = {"paper-gain": signed(PAPER_VEKD_GAIN), "minutes": f"{_study_pipeline_minutes(record):.0f}",
               "student-tokens": f"{student['tokens_seen']:,}"}
    for name in ("teacher-mlm", "teacher-adapted"):
        loss = stages[name]["summary"]["result"]["final_eval"].get("loss")
        figures[f"mlm-loss:{name}"] = "n/a" if loss is None else f"{loss:.2f}"
    for task, entry in summary["teachers"].items():
        figures[f"teacher:{task}"] = num(entry["test"]["f1"], 1, 100)
    for row in summary["rows"]:
        figures[f"f1:{row['arm']}:{row['task']}"] = num(row["mean"], 1, 100)
        figures[f"share:{row['arm']}:{row['task']}"] = _bootstrap_share(row["share"])
    for (first, second, on), result in vekd_family(summary).items():
        figures |= comparison_figures(f"{first}-{second}:{on}", result)
        figures[f"{first}-{second}:{on}:verdict"] = result.verdict
        if result.low is not None:  # where the paper's gain falls against this interval
            gain = PAPER_VEKD_GAIN / 100
            figures[f"{first}-{second}:{on}:paper"] = ("inside" if result.low <= gain <= result.high else
                                                       "above" if gain > result.high else "below")
    return figures


def _bootstrap_share(share: dict[str, Any] | None) -> str:
    """A share of the teacher with its bootstrap interval: "96.1% (93.0–99.2%)"."""
    if not share or share.get("estimate") is None:
        return "n/a"
    return f"{pct(share['estimate'])} ({100 * share['low']:.1f}–{100 * share['high']:.1f}%)"


# ------------------------------------------------------------------------------------------ bf16


def precision_tables(record: dict[str, Any]) -> str:
    """bf16 autocast against float32, each check paired by seed (same seed, same data order): the difference with its
    95% interval and Holm-adjusted p (the three checks one family), and the 90% interval, whose bounds are what two
    one-sided tests at 5% rule out (an equivalence statement: no difference beyond them)."""
    rows = precision_rows(record)
    results = family([(bf16, fp32) for _, fp32, bf16, _, _ in rows], paired=True)
    lines = ["| check | float32, per seed | bf16 autocast, per seed | bf16 − float32 (paired) | verdict | "
             "ruled out at 5% (90% interval) |", "|---|---|---|---:|---|---|"]
    for (name, fp32, bf16, scale, digits), result in zip(rows, results, strict=True):
        low, high = _interval([b - f for b, f in zip(bf16, fp32, strict=True)], 0.90)
        bound = scale * max(abs(low), abs(high))
        seeds = [", ".join(f"{scale * v:.{digits}f}" for v in values) for values in (fp32, bf16)]
        lines.append(f"| {name} | {seeds[0]} | {seeds[1]} | {scale * result.difference:+.{digits}f} | "
                     f"{verdict(result, scale, digits)} | a difference beyond ±{bound:.{digits}f} "
                     f"({scale * low:+.{digits}f} to {scale * high:+.{digits}f}) |")
    return "\n".join(lines)


def precision_rows(record: dict[str, Any]) -> list[tuple[str, list[float], list[float], float, int]]:
    """The bf16 checks: (name, float32 per seed, bf16 per seed, scale, digits)."""
    checks = record["study"]["checks"]
    return [("distill: held-out MLM loss", [r["held_out_mlm"] for r in record["distill"]["runs"]["fp32"]],
             [r["held_out_mlm"] for r in record["distill"]["runs"]["bf16"]], 1.0, 4),
            ("fine-tune: test F1", checks["finetune"]["fp32"], checks["finetune"]["bf16"], 100.0, 2),
            ("task KD: test F1", checks["kd"]["fp32"], checks["kd"]["bf16"], 100.0, 2)]


def precision_figures(record: dict[str, Any]) -> dict[str, str]:
    """The bf16 section's prose figures: the teacher's F1, each check's equivalence bound (`bound:…`, the 90%
    interval's farther end) and the float32 seeds' sd (`sd:…`), the wall times of the runs."""
    figures = {"teacher": f"{record['study']['teacher']['ncbi_disease']['test']['f1']:.3f}"}
    for (_, fp32, bf16, scale, digits), key in zip(precision_rows(record), ("loss", "finetune", "kd"), strict=True):
        low, high = _interval([b - f for b, f in zip(bf16, fp32, strict=True)], 0.90)
        figures |= {f"bound:{key}": f"{scale * max(abs(low), abs(high)):.{digits}f}",
                    f"sd:{key}": f"{scale * statistics.stdev(fp32):.{2 if key == 'loss' else 1}f}"}
    figures["bound:f1"] = max(figures["bound:finetune"], figures["bound:kd"], key=float)
    for precision in ("bf16", "fp32"):
        seconds = [run["train_seconds"] for run in record["distill"]["runs"][precision]]
        figures[f"distill-seconds:{precision}"] = f"{min(seconds):.0f}–{max(seconds):.0f}"
    figures |= {f"seconds:{arm}": f"{seconds:.1f}" for arm, seconds in record["study"]["wall_seconds_per_arm"].items()}
    return figures


def _interval(values: list[float], level: float) -> tuple[float, float]:
    """The t-interval of the mean of `values` at `level`."""
    from scipy import stats

    half = stats.t.ppf((1 + level) / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return statistics.fmean(values) - half, statistics.fmean(values) + half


def demo_tables(report: dict[str, Any]) -> str:
    """The demo's table and what it shows, as its report renders them (`biodistil.demo.results_block`)."""
    from biodistil.demo import results_block

    return results_block(report)


def demo_figures(report: dict[str, Any]) -> dict[str, str]:
    """The demo's figures other sections quote: its teacher's F1, what KD adds over fine-tuning on the budget, the
    teacher's and the student's parameters (M); its training minutes (in all, the teacher's, the student runs'
    elapsed), their seeds and the CPU's flags."""
    f1 = {model["arm"]: model["f1_mean"] for model in report["models"]}
    size = {model["arm"]: model["parameters"] for model in report["models"]}
    teacher = next(stage for stage in report["stages"] if stage["stage"] == "teacher fine-tuning")
    return {"teacher": num(f1[None], 1, 100), "kd-gain": signed(f1["distilled"] - f1["fine-tuned"], 0, 100),
            "teacher-parameters": f"{size[None] / 1e6:.1f}", "student-parameters": f"{size['fine-tuned'] / 1e6:.1f}",
            "training-minutes": f"{report['demo_minutes']:.1f}", "teacher-minutes": f"{teacher['seconds'] / 60:.1f}",
            "runs-minutes": f"{report['side_by_side']['elapsed_seconds'] / 60:.1f}",
            "runs": str(report["side_by_side"]["runs"]), "seeds": str(len(report["plan"]["seeds"])),
            "cpu": f"{report['machine']['cpu']} ({' '.join(report['machine']['flags'])})"}


VERDICT = re.compile(r"(?:^\| .+ \| |\()(?:finding|inconclusive)\b", re.M)  # a comparison's verdict in a table


def page_figures(_: dict[str, Any]) -> dict[str, str]:
    """docs/results.md as a whole: how many comparisons its tables make (each a row with a verdict)."""
    blocks = [STUDIES[name](load(name)) for name in STUDIES if page(name).name == "results.md"]
    return {"comparisons": str(sum(len(VERDICT.findall(block)) for block in blocks))}


STUDIES = {"task-agnostic": task_agnostic_seeds_tables, "transfer-data": transfer_tables, "meta-kd": meta_tables,
           "cross-tokenizer": cross_tokenizer_tables, "users-setting": users_setting_tables,
           "multi-teacher": multi_teacher_tables, "seeds-scale": seeds_scale_tables, "vekd": vekd_tables,
           "precision": precision_tables, "demo": demo_tables}
PAGES = {"demo": "demo.md"}  # the page of each block; docs/results.md for the others
FIGURES: dict[str, Callable[[dict[str, Any]], dict[str, str]]] = {  # each study's named prose figures (above)
    "task-agnostic": task_agnostic_seeds_figures, "transfer-data": transfer_figures, "meta-kd": meta_figures,
    "users-setting": users_setting_figures, "multi-teacher": multi_teacher_figures,
    "seeds-scale": seeds_scale_figures, "vekd": vekd_figures, "precision": precision_figures,
    "cross-tokenizer": cross_tokenizer_figures, "demo": demo_figures,
    "page": page_figures}  # "page": no record of its own
FIGURE = re.compile(r"<!-- fig: (?P<study>[\w-]+)/(?P<name>[^ ]+) -->(?P<quoted>.*?)<!-- /fig -->", re.S)


def page(name: str) -> Path:
    return HERE.parent / PAGES.get(name, "results.md")


def block(name: str) -> str:
    """The marked region of a page (docs/results.md, docs/demo.md) that holds a record's tables."""
    return f"<!-- tables: {name} -->\n{STUDIES[name](load(name))}\n<!-- end: {name} -->"


@functools.cache
def figures(study: str) -> dict[str, str]:
    """The named figures of a study's record, as the prose writes them (formed once per run)."""
    return FIGURES[study](load(study) if (HERE / f"{study}.json").is_file() else {})


def quoted_figures(text: str) -> list[tuple[str, str, str]]:
    """Every figure marker of a page: (STUDY/NAME, the figure it quotes, the figure its record gives)."""
    found = []
    for match in FIGURE.finditer(text):
        study, name = match["study"], match["name"]
        if study not in FIGURES or name not in figures(study):
            raise KeyError(f"no figure {study}/{name} in docs/results/tables.py FIGURES")
        found.append((f"{study}/{name}", match["quoted"], figures(study)[name]))
    return found


def fill(text: str) -> str:
    """A page with each figure marker holding the figure its record gives."""
    return FIGURE.sub(lambda m: f"<!-- fig: {m['study']}/{m['name']} -->{figures(m['study'])[m['name']]}<!-- /fig -->",
                      text)


def write() -> None:
    for doc in sorted({page(name) for name in STUDIES}):
        text = doc.read_text(encoding="utf-8")
        for name in (name for name in STUDIES if page(name) == doc):
            start, end = f"<!-- tables: {name} -->", f"<!-- end: {name} -->"
            if (HERE / f"{name}.json").is_file() and start in text:
                before, rest = text.split(start, 1)
                text = before + block(name) + rest.split(end, 1)[1]
        doc.write_text(fill(text), encoding="utf-8")


def main(args: list[str]) -> None:
    if args == ["--write"]:
        write()
        return
    if args == ["--figures"]:
        for study in FIGURES:
            print("\n".join(f"{study}/{name}: {value}" for name, value in figures(study).items()))
        return
    for name in args or list(STUDIES):
        if (HERE / f"{name}.json").is_file():
            print(block(name) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
