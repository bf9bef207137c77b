"""The report's figures (PNG, matplotlib Agg): macro-average score against parameters and against latency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from biodistil.evaluation.aggregate import ReportData, family_average, model_parameters, model_scores


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
    points = _points(data, lambda m: (model_parameters(data, m) or 0) / 1e6 or None)
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
