"""`biodistil report RUN...`: Markdown + HTML report and plots from evaluation run folders (and bench files).

The table has models as rows and tasks as columns (headline metric ×100, mean ± std over seeds), the
BLURB-style macro average (the mean of the family means: NER, PICO, relation extraction, document
classification, question answering; each family present weighs the same) and each model's share of the
reference model's average (computed over the tasks both have). Figures (PNG, matplotlib Agg): average score
against parameters and against latency (from `bench.json`).
"""

from __future__ import annotations

import html
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError
from biodistil.evaluation.recipe import FAMILIES, FAMILY_TITLES
from biodistil.evaluation.runner import RESULTS_FORMAT
from biodistil.io import atomic_write_text, read_json

Block = tuple[str, Any]  # ("h1" | "h2" | "p" | "ul" | "table" | "img", content)


@dataclass
class ModelResults:
    """One model's summaries, merged over the run folders that evaluated it."""

    label: str
    path: str
    parameters: dict[str, int] | None
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ReportData:
    """Everything the report shows, merged over run folders and bench files."""

    models: list[ModelResults]
    tasks: dict[str, dict[str, Any]]
    reference: str
    bench: dict[str, dict[str, Any]]
    bench_info: list[dict[str, Any]]
    notes: list[str]

    @property
    def families(self) -> dict[str, str]:
        return {name: task["family"] for name, task in self.tasks.items()}


# ------------------------------------------------------------------------------------------ loading


def _read_results(run: Path) -> dict[str, Any]:
    path = run / "results.json"
    if not path.is_file():
        raise BiodistilError(f"{run}: no results.json; expected the output folder of `biodistil evaluate`")
    results = read_json(path)
    if not isinstance(results, dict) or results.get("format") != RESULTS_FORMAT:
        raise BiodistilError(f"{path}: not a biodistil evaluation result (expected format {RESULTS_FORMAT})")
    return results


def _merge_run(data: ReportData, run: Path, results: dict[str, Any]) -> None:
    by_label = {m.label: m for m in data.models}
    for task in results["tasks"]:
        known = data.tasks.setdefault(task["name"], task)
        if known is not task and known != task:
            data.notes.append(f"Task {task['name']} was run with other settings in {run}; the settings table "
                              "shows the first run's. Compare its scores with care.")
    for entry in results["models"]:
        model = by_label.get(entry["label"])
        if model is None:
            model = ModelResults(entry["label"], entry["path"], entry.get("parameters"))
            data.models.append(model)
            by_label[model.label] = model
        for task, summary in results["summary"].get(entry["label"], {}).items():
            if task in model.tasks:
                data.notes.append(f"{model.label} / {task}: also in {run}; the first run's result is shown.")
                continue
            model.tasks[task] = summary
        model.parameters = model.parameters or entry.get("parameters")
    if not results.get("complete", True):
        data.notes.append(f"{run} is not finished (cells are missing); its table shows the cells done so far.")
    data.notes += [f"{run}: {note}" for note in results.get("notes", [])]
    for skipped in results.get("skipped_tasks", []):
        data.notes.append(f"Task {skipped['task']} skipped in {run}: {skipped['reason']}.")


def _merge_bench(data: ReportData, path: Path) -> None:
    bench = read_json(path)
    if not isinstance(bench, dict) or "models" not in bench:
        raise BiodistilError(f"{path}: not a biodistil bench result (expected the JSON that `biodistil bench` "
                             "writes)")
    data.bench_info.append({"path": str(path), **{k: bench.get(k) for k in ("device", "memory_method",
                                                                              "settings", "torch", "dtype")}})
    for row in bench["models"]:
        if row["label"] in data.bench:
            data.notes.append(f"Benchmark of {row['label']} also in {path}; the first one is shown.")
            continue
        data.bench[row["label"]] = {**row, "device": bench.get("device")}


def load_report_data(runs: list[Path], bench_files: list[Path] = (), reference: str | None = None) -> ReportData:
    """Merge evaluation run folders (and their bench.json) and extra bench files."""
    if not runs:
        raise BiodistilError("report: give at least one evaluation run folder")
    data = ReportData([], {}, "", {}, [], [])
    first_reference = None
    for run in map(Path, runs):
        results = _read_results(run)
        first_reference = first_reference or results.get("reference")
        _merge_run(data, run, results)
        if (run / "bench.json").is_file():
            _merge_bench(data, run / "bench.json")
    for path in map(Path, bench_files):
        if not path.is_file():
            raise BiodistilError(f"report: bench file {path} not found (expected the JSON of `biodistil bench`)")
        _merge_bench(data, path)
    labels = [m.label for m in data.models]
    data.reference = reference or first_reference or labels[0]
    if data.reference not in labels:
        raise BiodistilError(f"report: reference model '{data.reference}' is not among the models {labels}")
    order = {family: index for index, family in enumerate(FAMILIES)}
    data.tasks = dict(sorted(data.tasks.items(), key=lambda item: order.get(item[1]["family"], len(order))))
    if len({info["device"] for info in data.bench_info}) > 1:
        data.notes.append("The benchmarks come from different devices; compare latencies only within a device.")
    return data


# ------------------------------------------------------------------------------------------ numbers


def family_average(scores: dict[str, float], families: dict[str, str]) -> tuple[float | None, dict[str, float]]:
    """BLURB-style macro average: the mean of the family means (each family present weighs the same)."""
    grouped: dict[str, list[float]] = defaultdict(list)
    for task, value in scores.items():
        grouped[families[task]].append(value)
    means = {family: statistics.fmean(grouped[family]) for family in [*FAMILIES, *sorted(grouped)]
             if family in grouped}
    return (statistics.fmean(means.values()) if means else None), means


def model_scores(model: ModelResults, statistic: str = "mean") -> dict[str, float]:
    """Task → headline score (the mean or the median over seeds)."""
    return {task: summary[statistic] for task, summary in model.tasks.items()}


def share_of_reference(model: ModelResults, reference: ModelResults, families: dict[str, str],
                       statistic: str = "mean") -> float | None:
    """The model's macro average over the tasks it shares with the reference, divided by the reference's."""
    mine, theirs = model_scores(model, statistic), model_scores(reference, statistic)
    common = sorted(set(mine) & set(theirs))
    if not common:
        return None
    own, _ = family_average({t: mine[t] for t in common}, families)
    ref, _ = family_average({t: theirs[t] for t in common}, families)
    return own / ref if ref else None


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


def _parameters(data: ReportData, model: ModelResults) -> int | None:
    if model.label in data.bench:
        return data.bench[model.label]["parameters"]
    return (model.parameters or {}).get("total")


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
        rows.append([model.label, _millions(_parameters(data, model)), *cells,
                     _pct(average) + (f" ({len(model.tasks)}/{len(data.tasks)} tasks)" if missing else ""),
                     _pct(share)])
    return rows


def _score_cell(summary: dict[str, Any] | None, statistic: str) -> str:
    if summary is None:
        return "–"
    if statistic == "median" or summary["n"] < 2:
        return _pct(summary[statistic])
    return f"{_pct(summary['mean'])} ± {_pct(summary['std'])}"


def family_table(data: ReportData) -> list[list[str]]:
    """Rows: model, one column per family present, the macro average (means over seeds)."""
    present = [f for f in FAMILIES if f in set(data.families.values())]
    rows = [["model", *[FAMILY_TITLES[f] for f in present], "macro average"]]
    for model in data.models:
        average, means = family_average(model_scores(model), data.families)
        rows.append([model.label, *[_pct(means.get(f)) for f in present], _pct(average)])
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


# ------------------------------------------------------------------------------------------ figures


def _points(data: ReportData, x_of: Any) -> list[tuple[str, float, float]]:
    points = []
    for model in data.models:
        average, _ = family_average(model_scores(model), data.families)
        x = x_of(model)
        if average is not None and x is not None:
            points.append((model.label, float(x), 100 * average))
    return points


def plot_points(points: list[tuple[str, float, float]], reference: str, xlabel: str, title: str,
                path: Path) -> Path:
    """A scatter plot with each point named, the reference's score as a dashed line, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.8), dpi=120)
    xs = [p[1] for p in points]
    for label, x, y in points:
        is_ref = label == reference
        axes.scatter([x], [y], s=70 if is_ref else 50, marker="*" if is_ref else "o", zorder=3,
                     color="tab:red" if is_ref else "tab:blue")
        axes.annotate(label, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=9)
    ref = [p for p in points if p[0] == reference]
    if ref:
        axes.axhline(ref[0][2], color="tab:red", linestyle="--", linewidth=1, label=f"{reference} (reference)")
        axes.legend(loc="best", fontsize=8)
    if xs and min(xs) > 0 and max(xs) / min(xs) > 20:
        axes.set_xscale("log")
    axes.margins(x=0.25, y=0.25)
    low, high = axes.get_ylim()
    if high - low < 2:  # differences of a fraction of a point should not look large
        middle = (low + high) / 2
        axes.set_ylim(middle - 1, middle + 1)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("macro-average test score (0–100, families equal)")
    axes.set_title(title, fontsize=11)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(tmp)
    plt.close(figure)
    tmp.replace(path)
    return path


def _latency_setting(data: ReportData) -> tuple[str, int] | None:
    """(length, batch) of the latency plot: the first length that every benchmarked model ran."""
    if not data.bench_info:
        return None
    settings = data.bench_info[0]["settings"]
    for length in map(str, settings["lengths"]):
        if all("median_ms" in row["latency"].get(length, {}) for row in data.bench.values()):
            return length, settings["latency_batch"]
    return None


def make_figures(data: ReportData, out: Path) -> list[tuple[Path, str]]:
    """The PNG figures (path, caption) that can be drawn from the data."""
    task_list = ", ".join(data.tasks)
    figures = []
    points = _points(data, lambda m: (_parameters(data, m) or 0) / 1e6 or None)
    if points:
        title = f"Score against model size\n(tasks: {task_list})"
        path = plot_points(points, data.reference, "parameters (millions, encoder)", title,
                           out / "score_vs_parameters.png")
        figures.append((path, "Macro-average score against parameters."))
    setting = _latency_setting(data)
    if setting:
        length, batch = setting
        device = data.bench_info[0]["device"]
        points = _points(data, lambda m: data.bench.get(m.label, {}).get("latency", {}).get(length, {})
                         .get("median_ms"))
        if points:
            title = f"Score against latency ({device})\n(batch {batch}, length {length}; tasks: {task_list})"
            path = plot_points(points, data.reference, f"latency per batch of {batch} × {length} tokens "
                               "(ms, median)", title, out / "score_vs_latency.png")
            figures.append((path, f"Macro-average score against latency (batch {batch}, length {length})."))
    return figures


# ------------------------------------------------------------------------------------------ rendering


def _blocks(data: ReportData, figures: list[tuple[Path, str]]) -> list[Block]:
    blocks: list[Block] = [
        ("h1", "biodistil evaluation report"),
        ("p", f"Test-set scores (headline metric of each task ×100; mean ± std over seeds). The macro average "
              f"is BLURB-style: the mean of the family means. Reference model: {data.reference}; the last column "
              "is each model's macro average as a share of the reference's, over the tasks both have."),
        ("table", scores_table(data)),
        ("h2", "Task families"), ("table", family_table(data)),
        ("h2", "Medians over seeds"), ("table", scores_table(data, "median")),
    ]
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
