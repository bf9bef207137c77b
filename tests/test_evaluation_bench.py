"""`biodistil bench` on two tiny models with tiny lengths (no assertion on timings); peak memory of a run that
allocates a known amount."""

import json
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM

from biodistil.cli.eval_commands import parse_model_spec
from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.evaluation.bench import (
    format_bench,
    isolated_peak_memory,
    peak_memory_bytes,
    round_robin,
    run_bench,
    spread,
)
from biodistil.evaluation.recipe import BenchConfig
from biodistil.models.student import student_from_teacher_layers


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory, teacher_dir, tokenizer) -> Path:
    student = student_from_teacher_layers(AutoModelForMaskedLM.from_pretrained(teacher_dir), [1])
    folder = tmp_path_factory.mktemp("small")
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_spread_and_round_robin_order():
    assert spread([4.0, 1.0, 3.0, 2.0, 5.0]) == {"median": 3.0, "q1": 2.0, "q3": 4.0, "min": 1.0, "max": 5.0}
    assert spread([2.0])["q1"] == 2.0
    calls: list[str] = []
    times = round_robin({"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0},
                        warmup=1, repeats=2)
    assert calls == ["a", "b", "a", "b", "a", "b"] and times == {"a": [1.0, 1.0], "b": [2.0, 2.0]}


def test_model_specs():
    assert parse_model_spec("runs/x/model") == (None, "runs/x/model")
    assert parse_model_spec("small=runs/x/model") == ("small", "runs/x/model")
    with pytest.raises(BiodistilError, match="NAME=PATH"):
        parse_model_spec("=runs/x")


def test_bench_two_tiny_models(teacher_dir, small_dir):
    cfg = BenchConfig(lengths=[8, 100], latency_batch=1, throughput_batch=4, warmup=1, repeats=2, memory="in-process")
    result = run_bench([("teacher", str(teacher_dir)), ("small", str(small_dir))], cfg)
    teacher, small = result["models"]
    assert teacher["parameters"] > small["parameters"] and small["parameters_without_embeddings"] > 0
    assert teacher["disk_bytes"] > small["disk_bytes"] > 0 and teacher["max_length"] == 64
    entry = small["throughput"]["8"]
    assert entry["runs"] == 2 and entry["q1_ms"] <= entry["median_ms"] <= entry["q3_ms"]
    assert entry["sequences_per_s"] == pytest.approx(4 / (entry["median_ms"] / 1000))  # batch 4 per median run
    assert entry["tokens_per_s"] == pytest.approx(8 * entry["sequences_per_s"])  # length 8
    assert isinstance(entry["peak_memory_bytes"], int)  # its size: test_peak_memory_counts_what_a_run_allocates
    assert "skipped" in small["latency"]["100"]  # longer than the 64 positions of the tiny models
    assert teacher["speedup"] == {"latency_8": 1.0, "throughput_8": 1.0} and set(small["speedup"]) == {
        "latency_8", "throughput_8"}
    assert "CPU" in result["memory_method"] or "CUDA" in result["memory_method"]
    text = format_bench(result)
    assert "speedup vs teacher" in text and "n/a (longer than the model's 64 positions)" in text
    table = text.split("\n\n")[-1].splitlines()
    assert table[0].startswith("| model | runtime | length | batch-1 latency ms | × teacher | batch-4 seq/s")
    assert table[2].startswith("| teacher | PyTorch") and "| 8 |" in table[2] and table[2].endswith("| 1.00 |")
    assert table[5].startswith("| small |") and "| 100 | n/a | – |" in table[5]


def test_peak_memory_counts_what_a_run_allocates():
    # a run that holds 64 MiB of float32 (every page written) for 50 ms — long enough for the 1 ms sampler used
    # where the kernel's peak counter cannot be reset — raises the peak by about that much; a run that
    # allocates nothing by far less
    size = 64 * 2**20

    def allocate() -> float:
        block = torch.ones(size // 4)
        time.sleep(0.05)
        return float(block[-1])

    cpu = torch.device("cpu")
    assert 0.9 * size <= peak_memory_bytes(allocate, cpu) < 2 * size
    assert peak_memory_bytes(lambda: 0.0, cpu) < size / 4


@pytest.mark.slow
def test_isolated_memory_is_measured_in_a_fresh_process_per_model_and_shape(teacher_dir):
    # the model's weights are loaded in the fresh process before its baseline: the increase is what the runs add, and
    # the process's peak (libraries, weights, runs) is larger; a longer batch needs more
    small, large = (isolated_peak_memory(str(teacher_dir), 1, batch, 64) for batch in (1, 64))
    assert 0 <= small["peak_memory_bytes"] < large["peak_memory_bytes"] < large["peak_rss_bytes"]
    # 64 × 64 tokens × 32 wide × 4 layers: at least the hidden states and attention scores of one layer
    assert large["peak_memory_bytes"] > 64 * 64 * (32 + 2 * 64) * 4


def test_bench_cli_writes_json(teacher_dir, small_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["bench", str(teacher_dir), f"small={small_dir}", "--lengths", "8", "--throughput-batch", "2",
                 "--warmup", "0", "--repeats", "1", "--memory", "off", "--out", str(out)])
    assert code == 0 and "Wrote" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [m["label"] for m in result["models"]] == [Path(teacher_dir).name, "small"]
    assert result["settings"]["lengths"] == [8] and result["reference"] == Path(teacher_dir).name
    assert result["memory_method"] == "not measured"
    assert result["models"][0]["throughput"]["8"]["peak_memory_bytes"] is None
    assert main(["bench", str(teacher_dir), "--lengths", "1", "--out", str(out)]) == 2  # bad option: an error
