"""`biodistil report RUN...`: Markdown + HTML report and plots from evaluation run folders (and bench files).

The table has models as rows and tasks as columns (headline metric ×100, mean ± std over seeds), the
BLURB-style macro average and each model's share of the reference model's average (see
`biodistil.evaluation.aggregate`), the efficiency table from `bench.json` and the figures
(`biodistil.evaluation.plots`). This module renders: tables as rows of strings, then Markdown and HTML.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from biodistil.evaluation.aggregate import (
    ReportData,
    family_average,
    load_report_data,
    model_parameters,
    model_scores,
    share_of_reference,
)
from biodistil.evaluation.plots import make_figures
from biodistil.evaluation.recipe import FAMILIES, FAMILY_TITLES
from biodistil.io import atomic_write_text
from biodistil.tasks.significance import Comparison, compare_scores, holm

Block = tuple[str, Any]  # ("h1" | "h2" | "p" | "ul" | "table" | "img", content)


# ------------------------------------------------------------------------------------------ tables


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _millions(value: int | None) -> str:
    """Millions, one decimal from 10M up, three significant digits below (tiny test models stay readable)."""
    if value is None:
        return "–"
    return f"{value / 1e6:,.1f}" if value >= 10_000_000 else f"{value / 1e6:.3g}"


def _task_header(name: str, task: dict[str, Any]) -> str:
    return f"{name} ({task['headline']})"


def scores_table(data: ReportData, statistic: str = "mean") -> list[list[str]]:
    """Rows of the main table: model, parameters, one column per task, macro average, share of reference."""
    reference = next(m for m in data.models if m.label == data.reference)
    header = ["model", "parameters (M)", *[_task_header(n, t) for n, t in data.tasks.items()],
              "macro average", f"% of {data.reference}"]
    rows = [header]
    for model in data.models:
        cells = [_score_cell(model.tasks.get(task), statistic) for task in data.tasks]
        average, _ = family_average(model_scores(model, statistic), data.families)
        missing = len(data.tasks) - len(model.tasks)
        share = share_of_reference(model, reference, data.families, statistic)
        common = set(model.tasks) & set(reference.tasks)
        rows.append([model.label, _millions(model_parameters(data, model)), *cells,
                     _pct(average) + (f" ({len(model.tasks)}/{len(data.tasks)} tasks)" if missing else "")
                     + _degenerate_mark(model, model.tasks),
                     _pct(share) + _degenerate_mark(model, common, reference)])
    return rows


def differences_table(data: ReportData) -> list[list[str]]:
    """Rows: model, then per task its difference from the reference and the verdict, on the seeds both ran; the
    table's comparisons are one family (Holm)."""
    reference = next(m for m in data.models if m.label == data.reference)
    others = [model for model in data.models if model is not reference]
    tested = {(model.label, task): result for model in others for task in data.tasks
              if (result := _against(model, reference, task)) is not None}
    tested = dict(zip(tested, holm(list(tested.values())), strict=True))
    rows = [["model", *data.tasks]]
    for model in others:
        rows.append([model.label, *(tested[model.label, task].describe(digits=1) if (model.label, task) in tested
                                    else "–" for task in data.tasks)])
    return rows


def _against(model: Any, reference: Any, task: str) -> Comparison | None:
    """`model` − `reference` on `task` over the seeds both ran (paired: same seeds, same data order), or None."""
    mine, theirs = (model.tasks.get(task) or {}).get("seeds", {}), (reference.tasks.get(task) or {}).get("seeds", {})
    shared = [seed for seed in mine if seed in theirs and None not in (mine[seed], theirs[seed])]
    if not shared:
        return None
    return compare_scores([100 * mine[s] for s in shared], [100 * theirs[s] for s in shared], paired=True)


def _degenerate_mark(model: Any, tasks: Any, *others: Any) -> str:
    """' (includes degenerate)' when an average takes in a score of a model that predicted one class."""
    found = any((m.tasks.get(task) or {}).get("degenerate") for m in (model, *others) for task in tasks)
    return " (includes degenerate)" if found else ""


def _score_cell(summary: dict[str, Any] | None, statistic: str) -> str:
    if summary is None:
        return "–"
    flag = " (degenerate)" if summary.get("degenerate") else ""
    if statistic == "median" or summary["n"] < 2:
        return _pct(summary[statistic]) + flag
    return f"{_pct(summary['mean'])} ± {_pct(summary['std'])}{flag}"


def family_table(data: ReportData) -> list[list[str]]:
    """Rows: model, one column per family present, the macro average (means over seeds)."""
    present = [f for f in FAMILIES if f in set(data.families.values())]
    rows = [["model", *[FAMILY_TITLES[f] for f in present], "macro average"]]
    for model in data.models:
        average, means = family_average(model_scores(model), data.families)
        rows.append([model.label, *[_pct(means.get(f)) for f in present],
                     _pct(average) + _degenerate_mark(model, model.tasks)])
    return rows


def _setting(value: Any) -> str:
    """A fine-tuning setting; '–' where none applies (models scored without training)."""
    return "–" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def settings_table(data: ReportData) -> list[list[str]]:
    rows = [["task", "family", "metric (headline)", "learning rate", "batch", "epochs", "patience", "label policy",
             "long inputs", "folds", "max examples"]]
    for name, task in data.tasks.items():
        trained = task["learning_rate"] is not None
        rows.append([name, FAMILY_TITLES.get(task["family"], task["family"]),
                     f"{task['metric']} ({task['headline']})", _setting(task["learning_rate"]),
                     _setting(task["batch_size"]), _setting(task["epochs"]),
                     str(task["early_stopping_patience"] or "off") if trained else "–",
                     task["label_policy"] if task["metric"] in ("entity_f1", "token_macro_f1") else "–",
                     f"{task['truncation']} at {task['max_length']}", str(task["n_folds"] or "–"),
                     str(task["max_examples"] or "all")])
    return rows


def truncation_rows(data: ReportData) -> list[list[str]]:
    """Cells whose inputs were longer than the task's max_length (split into windows or truncated)."""
    rows = [["model", "task", "policy", "long examples train / dev / test (all seeds and folds)",
             "test words without prediction (scored as O)"]]
    for model in data.models:
        for task, summary in model.tasks.items():
            counts = summary.get("truncated_examples", {})
            if any(counts.values()) or summary.get("unpredicted_words"):
                rows.append([model.label, task, data.tasks[task]["truncation"],
                             " / ".join(str(counts.get(s, 0)) for s in ("train", "dev", "test")),
                             str(summary.get("unpredicted_words", 0))])
    return rows


def _timing(entry: dict[str, Any] | None, kind: str) -> str:
    if not entry or "median_ms" not in entry:
        return "–"
    if kind == "latency":
        return f"{entry['median_ms']:.2f} [{entry['q1_ms']:.2f}–{entry['q3_ms']:.2f}]"
    return f"{entry['sequences_per_s']:,.1f}"


def _memory(entry: dict[str, Any] | None) -> str:
    value = (entry or {}).get("peak_memory_bytes")
    return "–" if value is None else f"{value / 2**20:,.1f}"


def bench_table(data: ReportData) -> list[list[str]]:
    """Rows of the efficiency table (models that were benchmarked)."""
    settings = data.bench_info[0]["settings"]
    lengths = [str(n) for n in settings["lengths"]]
    lat, thr = settings["latency_batch"], settings["throughput_batch"]
    header = ["model", "runtime", "parameters (M)", "without embeddings (M)", "weights on disk (MB)"]
    for n in lengths:
        header += [f"latency ms, batch {lat}, length {n} [quartiles]", f"seq/s, batch {thr}, length {n}",
                   f"peak memory MB, batch {thr}, length {n}", f"speedup latency / throughput, length {n}"]
    rows = [header]
    for label, row in data.bench.items():
        cells = [label, row.get("runtime", "PyTorch"), _millions(row["parameters"]),
                 _millions(row["parameters_without_embeddings"]),
                 "–" if row["disk_bytes"] is None else f"{row['disk_bytes'] / 2**20:,.1f}"]
        for n in lengths:
            speed = row.get("speedup", {})
            cells += [_timing(row["latency"].get(n), "latency"), _timing(row["throughput"].get(n), "throughput"),
                      _memory(row["throughput"].get(n)),
                      " / ".join(f"×{speed[k]:.2f}" if k in speed else "–"
                                 for k in (f"latency_{n}", f"throughput_{n}"))]
        rows.append(cells)
    return rows


# ------------------------------------------------------------------------------------------ rendering


def _blocks(data: ReportData, figures: list[tuple[Path, str]]) -> list[Block]:
    blocks: list[Block] = [
        ("h1", "biodistil evaluation report"),
        ("p", f"Test-set scores (headline metric of each task ×100; mean ± std over seeds). The macro average "
              f"is BLURB-style: the mean of the family means. Reference model: {data.reference}; the last column "
              "is each model's macro average as a share of the reference's, over the tasks both have."),
        ("table", scores_table(data)),
        ("h2", "Task families"), ("table", family_table(data)),
    ]
    if any(summary.get("n", 1) > 1 for model in data.models for summary in model.tasks.values()):
        blocks += [("h2", "Medians over seeds"), ("table", scores_table(data, "median"))]  # one seed: the same table
        blocks += [("h2", f"Differences from {data.reference}"),
                   ("p", "Per task, each model's headline score minus the reference's (×100) with the 95% confidence "
                         "interval of a paired t-test over the seeds both ran (a seed fine-tunes both models with the "
                         "same data order): a finding only when the interval excludes 0, else inconclusive, with "
                         "about the seeds the observed spread would need (`biodistil.tasks.significance`)."),
                   ("table", differences_table(data))]
    if data.bench:
        info = data.bench_info[0]
        blocks += [("h2", "Efficiency"),
                   ("p", f"PyTorch: bare encoders (no head), {info['dtype']}; ONNX Runtime (exports): the graph "
                         f"with its head. On {info['device']}; torch {info['torch']}. "
                         f"Medians of {info['settings']['repeats']} timed runs after {info['settings']['warmup']} "
                         f"warm-up runs, models measured in turn in one process. Speedups are against "
                         f"{next(iter(data.bench))} (>1 = faster). Peak memory: {info['memory_method']}."),
                   ("table", bench_table(data))]
    else:
        blocks += [("h2", "Efficiency"), ("p", "No bench.json: run `biodistil bench` (or set bench.enabled) and "
                                                "pass it with --bench for latency and throughput.")]
    blocks += [("h2", "Figures")] + [("img", (path.name, caption)) for path, caption in figures]
    blocks += [("h2", "Settings"), ("table", settings_table(data)), ("h2", "Long inputs")]
    long_rows = truncation_rows(data)
    blocks.append(("table", long_rows) if len(long_rows) > 1 else ("p", "No input was longer than its task's "
                                                                        "max_length."))
    capped = [name for name, task in data.tasks.items() if task.get("max_examples")]
    notes = list(data.notes)
    for model in data.models:
        for task, summary in model.tasks.items():
            if summary.get("degenerate"):
                notes.append(f"{model.label} on {task} is marked (degenerate): {'; '.join(summary['degenerate'])} "
                             "in at least one seed; the score does not reflect a trained model.")
            if any(summary.get("markers_cut", {}).values()):
                notes.append(f"{model.label} on {task}: relation examples whose entity markers did not all fit in "
                             f"max_length (the window keeps the first): {summary['markers_cut']}.")
    if capped:
        notes.insert(0, f"Examples capped ({', '.join(capped)}): a smoke run, not comparable to published scores.")
    if notes:
        blocks += [("h2", "Notes"), ("ul", notes)]
    return blocks


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(blocks: list[Block]) -> str:
    lines: list[str] = []
    for kind, content in blocks:
        if kind in ("h1", "h2"):
            lines += [("# " if kind == "h1" else "## ") + content, ""]
        elif kind == "p":
            lines += [content, ""]
        elif kind == "ul":
            lines += [f"* {item}" for item in content] + [""]
        elif kind == "img":
            lines += [f"![{content[1]}]({content[0]})", ""]
        elif kind == "table":
            header, *rows = content
            lines.append("| " + " | ".join(map(_md_cell, header)) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


_CSS = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
        "text-align:right}td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}"
        "img{max-width:100%}")


def render_html(blocks: list[Block]) -> str:
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'><title>biodistil evaluation report</title>",
             f"<style>{_CSS}</style></head><body>"]
    esc = html.escape
    for kind, content in blocks:
        if kind in ("h1", "h2", "p"):
            parts.append(f"<{kind}>{esc(content)}</{kind}>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{esc(item)}</li>" for item in content) + "</ul>")
        elif kind == "img":
            parts.append(f"<figure><img src='{esc(content[0])}' alt='{esc(content[1])}'>"
                         f"<figcaption>{esc(content[1])}</figcaption></figure>")
        elif kind == "table":
            header, *rows = content
            parts.append("<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in header) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def build_report(runs: list[Path], out: Path | None = None, bench_files: list[Path] = (),
                 reference: str | None = None) -> Path:
    """Write report.md, report.html and the figures into `out` (default: the first run folder)."""
    data = load_report_data([Path(r) for r in runs], [Path(b) for b in bench_files], reference)
    out = Path(out) if out is not None else Path(runs[0])
    figures = make_figures(data, out)
    blocks = _blocks(data, figures)
    atomic_write_text(out / "report.md", render_markdown(blocks))
    atomic_write_text(out / "report.html", render_html(blocks))
    return out / "report.md"
