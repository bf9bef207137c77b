"""`biodistil report`: family macro average, share of the reference, tables and figures from result files."""

import json
from pathlib import Path

import pytest

from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.evaluation.aggregate import family_average, load_report_data
from biodistil.evaluation.report import build_report, family_table, scores_table
from biodistil.evaluation.results import RESULTS_FORMAT

PNG = b"\x89PNG\r\n\x1a\n"
FAMILIES = {"ncbi_disease": "ner", "bc2gm": "ner", "gad": "relation_extraction", "hoc": "document_classification"}


def test_family_average_weighs_families_equally():
    average, means = family_average({"ncbi_disease": 0.8, "bc2gm": 0.6, "gad": 0.9, "hoc": 0.4}, FAMILIES)
    assert means == pytest.approx({"ner": 0.7, "relation_extraction": 0.9, "document_classification": 0.4})
    assert average == pytest.approx(2.0 / 3)  # (0.7 + 0.9 + 0.4) / 3; the mean over tasks would be 0.675
    average, _ = family_average({"ncbi_disease": 0.8, "bc2gm": 0.6, "gad": 0.2}, FAMILIES)
    assert average == pytest.approx(0.45)  # the mean over tasks would be 0.533
    assert family_average({}, FAMILIES) == (None, {})


def _summary(scores: list[float], family: str, truncated: int = 0) -> dict:
    mean = sum(scores) / len(scores)
    return {"family": family, "metric": "m", "headline": "f1", "mean": mean, "median": sorted(scores)[0],
            "std": 0.01 if len(scores) > 1 else 0.0, "n": float(len(scores)),
            "seeds": {str(i): s for i, s in enumerate(scores)}, "truncated_examples": {"test": truncated},
            "unpredicted_words": 0}


def _task(name: str, family: str, metric: str = "entity_f1") -> dict:
    return {"name": name, "family": family, "metric": metric, "headline": "f1", "learning_rate": 5e-5,
            "batch_size": 32, "epochs": 3, "early_stopping_patience": None, "max_examples": None,
            "label_policy": "first", "truncation": "split", "max_length": 128, "n_folds": None}


def write_run(folder: Path, summary: dict, models: list[str], complete: bool = True) -> Path:
    folder.mkdir(parents=True)
    results = {"format": RESULTS_FORMAT, "complete": complete, "reference": models[0], "seeds": [1, 2],
               "models": [{"label": m, "path": f"runs/{m}/model", "parameters": {"total": p, "non_embedding": p // 2}}
                          for m, p in zip(models, [110_000_000, 66_000_000, 20_000_000], strict=False)],
               "tasks": [_task("ncbi_disease", "ner"), _task("gad", "relation_extraction", "binary_prf")],
               "skipped_tasks": [{"task": "pico", "reason": "data absent (pico/train.json)"}],
               "summary": summary, "cells": []}
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def write_bench(path: Path, labels: list[str]) -> Path:
    rows = []
    for index, label in enumerate(labels):
        ms = 10.0 / (index + 1)
        timing = {"median_ms": ms, "q1_ms": ms * 0.9, "q3_ms": ms * 1.1, "sequences_per_s": 100.0 * (index + 1),
                  "peak_memory_bytes": 2**20 * 5}
        rows.append({"label": label, "path": f"runs/{label}", "parameters": 10**8 // (index + 1),
                     "parameters_without_embeddings": 10**7, "disk_bytes": 2**20 * 400, "max_length": 512,
                     "latency": {"128": timing}, "throughput": {"128": timing},
                     "speedup": {"latency_128": index + 1.0, "throughput_128": index + 1.0}})
    bench = {"format": "biodistil-bench/1", "device": "cpu (test)", "torch": "x", "dtype": "float32",
             "memory_method": "CPU: peak RSS increase", "reference": labels[0],
             "settings": {"lengths": [128], "latency_batch": 1, "throughput_batch": 32, "warmup": 1, "repeats": 3},
             "models": rows}
    path.write_text(json.dumps(bench))
    return path


@pytest.fixture()
def runs(tmp_path) -> tuple[Path, Path]:
    first = write_run(tmp_path / "run1", {
        "teacher": {"ncbi_disease": _summary([0.80, 0.82], "ner"), "gad": _summary([0.90], "relation_extraction")},
        "student": {"ncbi_disease": _summary([0.76, 0.78], "ner", truncated=3)},
    }, ["teacher", "student"])
    write_bench(first / "bench.json", ["teacher", "student"])
    second = write_run(tmp_path / "run2", {"baseline": {"ncbi_disease": _summary([0.5], "ner"),
                                                        "gad": _summary([0.45], "relation_extraction")}},
                       ["baseline"], complete=False)
    return first, second


def test_table_rows_share_of_reference_and_incomplete_models(runs):
    data = load_report_data(list(runs))
    assert [m.label for m in data.models] == ["teacher", "student", "baseline"] and data.reference == "teacher"
    header, teacher, student, baseline = scores_table(data)
    assert header[2:4] == ["ncbi_disease (f1)", "gad (f1)"] and header[-1] == "% of teacher"
    assert teacher[2] == "81.0 ± 1.0" and teacher[3] == "90.0" and teacher[-2] == "85.5"  # (81 + 90) / 2
    assert student[3] == "–" and student[-2] == "77.0 (1/2 tasks)"
    assert student[-1] == "95.1"  # 77 / 81 over the one shared task
    assert baseline[-1] == f"{100 * 0.475 / 0.855:.1f}"
    assert any("not finished" in note for note in data.notes) and any("pico" in note for note in data.notes)


def test_report_files_tables_and_figures(runs, tmp_path):
    out = tmp_path / "report"
    path = build_report(list(runs), out)
    text = path.read_text()
    assert "| teacher | 100.0 | 81.0 ± 1.0 | 90.0 | 85.5 | 100.0 |" in text
    assert "## Efficiency" in text and "10.00 [9.00–11.00]" in text and "×2.00 / ×2.00" in text
    assert "| student | ncbi_disease | split | 0 / 0 / 3 | 0 |" in text  # long inputs are reported
    for name in ("score_vs_parameters.png", "score_vs_latency.png"):
        assert (out / name).read_bytes()[:8] == PNG and f"]({name})" in text
    html = (out / "report.html").read_text()
    assert "<table>" in html and "score_vs_latency.png" in html and "<th>% of teacher</th>" in html


def test_report_cli_with_bench_file_and_reference(runs, tmp_path):
    first, _ = runs
    (first / "bench.json").unlink()
    extra = write_bench(tmp_path / "b.json", ["student", "teacher"])
    code = main(["report", str(first), "--bench", str(extra), "--reference", "student", "--out", str(tmp_path / "r")])
    assert code == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert "% of student" in text and "Speedups are against student" in text


def test_report_needs_results(tmp_path):
    with pytest.raises(BiodistilError, match=r"no results\.json"):
        build_report([tmp_path])
    write_run(tmp_path / "run", {"a": {}}, ["a"])
    with pytest.raises(BiodistilError, match="reference model 'zz'"):
        build_report([tmp_path / "run"], reference="zz")


def test_a_degenerate_score_is_marked_beside_it():
    from biodistil.evaluation.report import _score_cell

    summary = {"n": 2, "mean": 0.846, "std": 0.0, "median": 0.846, "degenerate": ["every example predicted 'yes'"]}
    assert _score_cell(summary, "mean").endswith("(degenerate)")
    plain = _score_cell({**summary, "degenerate": []}, "median")
    assert _score_cell(summary, "median") == f"{plain} (degenerate)"


def test_an_average_or_share_that_takes_in_a_degenerate_score_is_marked(tmp_path):
    degenerate = {**_summary([0.45], "relation_extraction"), "degenerate": ["every example predicted '0'"]}
    run = write_run(tmp_path / "run", {
        "teacher": {"ncbi_disease": _summary([0.80], "ner"), "gad": _summary([0.90], "relation_extraction")},
        "student": {"ncbi_disease": _summary([0.76], "ner"), "gad": degenerate},
        "baseline": {"ncbi_disease": _summary([0.70], "ner")},
    }, ["teacher", "student", "baseline"])
    data = load_report_data([run])
    _, teacher, student, baseline = scores_table(data)
    assert not teacher[-2].endswith("(includes degenerate)") and not teacher[-1].endswith("(includes degenerate)")
    assert student[-2].endswith("(includes degenerate)") and student[-1].endswith("(includes degenerate)")
    assert not baseline[-1].endswith("(includes degenerate)"), "its share is over ncbi_disease only"
    families = family_table(data)
    assert families[2][-1].endswith("(includes degenerate)") and not families[1][-1].endswith("degenerate)")


def test_differences_from_the_reference_are_paired_over_shared_seeds_with_their_interval(runs, tmp_path):
    """student − teacher on NCBI-disease, seeds (0.76, 0.78) vs (0.80, 0.82): per-seed differences −4 and −4 points,
    no spread: no test; baseline (one seed) shares seed 0 only. With spread: (0.76, 0.79) vs (0.80, 0.82): d = (−4,
    −3), mean −3.5, s_d = 0.707, se = 0.5, ν = 1: 95% CI −3.5 ± 12.706·0.5 = −9.9 to +2.9; t = 7, p = 1 −
    2·atan(7)/π = 0.090; at 3 seeds t_{0.975,2}·√(0.5/3) = 4.303·0.408 = 1.76 < 3.5, so about 3 seeds."""
    from biodistil.evaluation.report import differences_table

    data = load_report_data(list(runs))
    header, student, baseline = differences_table(data)
    assert header == ["model", "ncbi_disease", "gad"]
    assert student[1].startswith("-4.0 (no seed spread") and student[2] == "–"
    assert "one seed" in baseline[1]
    data.models[1].tasks["ncbi_disease"]["seeds"] = {"0": 0.76, "1": 0.79}
    assert differences_table(data)[1][1] == \
        "-3.5 (95% CI -9.9 to +2.9, paired t-test, p = 0.09): inconclusive — would need about 3 seeds per arm"
    assert "## Differences from teacher" in build_report(list(runs), tmp_path / "report").read_text()
