"""The CUDA paths, checked where no GPU is (issue 34): device choice and its errors, the precision and compile
decisions a GPU gets, and `bench/gpu_check.py` run on the CPU with tiny shapes so that it cannot rot. The same script
on a GPU gave docs/results/gpu/ (docs/gpu.md)."""

import json
from pathlib import Path

import pytest
import torch

from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.training import compiling
from biodistil.training import machine as hardware

REPO = Path(__file__).resolve().parents[1]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without a GPU")


@no_gpu
def test_train_device_cuda_without_a_gpu_is_an_error_that_says_why(tmp_path, teacher_dir, capsys):
    with pytest.raises(BiodistilError, match=r"train.device=cuda: no CUDA GPU is visible .*use train.device=auto"):
        hardware.training_device("cuda")
    assert hardware.training_device("auto") == hardware.training_device("cpu") == torch.device("cpu")
    code = main(["finetune", str(REPO / "recipes" / "finetune-bioasq.yaml"), f"model.name_or_path={teacher_dir}",
                 "train.device=cuda", "--out", str(tmp_path / "run")])
    assert code == 2 and "train.device=cuda: no CUDA GPU is visible" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists(), "refused before anything ran"


@no_gpu
def test_evaluate_finetuned_on_cuda_without_a_gpu_is_an_error(tmp_path, kd_models, capsys):
    from kd_fixtures import write_pair_task

    teacher, _ = kd_models
    task = write_pair_task(tmp_path / "task")
    code = main(["evaluate", "--finetuned", str(teacher), "--task", str(task), "--device", "cuda",
                 "--out", str(tmp_path / "scored")])
    assert code == 2 and "no CUDA GPU is visible" in capsys.readouterr().err


def test_auto_precision_on_a_gpu_is_bf16_where_it_has_bf16_else_fp16_with_loss_scaling(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(hardware, "bf16_fast", lambda device: True)
    assert hardware.resolve_precision("auto", cuda) == ("bf16", "bf16 autocast (auto: GPU with bf16)")
    monkeypatch.setattr(hardware, "bf16_fast", lambda device: False)
    chosen, why = hardware.resolve_precision("auto", cuda)
    assert chosen == "fp16" and "without bf16" in why and "loss scaling" in why
    assert hardware.resolve_precision("no", cuda)[0] == "no", "an explicit setting is kept"


def test_train_compile_on_a_gpu_auto_keeps_the_eager_rows_and_true_compiles_them(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(compiling, "triton_available", lambda: True)
    chosen = compiling.apply_compile("auto", torch.nn.Module(), cuda)
    assert chosen.note.startswith("auto: nothing on a GPU") and chosen.kl_rows is None
    monkeypatch.setattr(compiling, "compile_encoders", lambda module: "BertForMaskedLM")
    chosen = compiling.apply_compile(True, torch.nn.Module(), cuda)
    assert chosen.note == "true: the encoders of BertForMaskedLM and the vocabulary KL's row kernel"
    assert chosen.kl_rows is not None
    monkeypatch.setattr(compiling, "triton_available", lambda: False)
    chosen = compiling.apply_compile(True, torch.nn.Module(), cuda)
    assert chosen.note.startswith("true: nothing, Triton is not installed") and chosen.kl_rows is None


@pytest.fixture
def gpu_check(bench_script):
    return bench_script("gpu_check")


@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_with_tiny_shapes(tmp_path, gpu_check, capsys):
    """`bench/gpu_check.py --device cpu --tiny --in-process`: every section runs and its records hold what docs/gpu.md
    reads (in one process: on a GPU each section gets a child of its own, which a CPU does not need)."""
    out = tmp_path / "check.jsonl"
    code = gpu_check.main(["--device", "cpu", "--tiny", "--in-process", "--out", str(out), "--workdir",
                           str(tmp_path / "work")])
    printed = capsys.readouterr().out
    assert code == 0, printed[-3000:]
    records = {f"{r['section']}/{r['name']}": r for r in map(json.loads, out.read_text().splitlines())}
    assert all(record["ok"] for record in records.values())
    assert {name.split("/")[0] for name in records} == {"env", "distill", "commands", "modernbert"}
    mlm, live = records["distill/seq64-bf16/mlm"], records["distill/seq64-bf16/live-all"]
    assert mlm["ratio_to_mlm"] == 1.0 and mlm["tokens_per_s"] > 0 and 0 < mlm["mfu"] < 1
    assert mlm["mfu"] <= mlm["device_mfu"], "the device phases are a part of the step"
    assert mlm["datasheet_tflops"] is None and mlm["mfu_datasheet"] is None and mlm["device_mfu_datasheet"] is None, \
        "a CPU has no datasheet peak"
    assert records["env/machine"]["datasheet_tflops"] is None
    assert mlm["kl_chunk_elements"] == 1 << 22, "the CPU's own chunk"
    for mode in ("live-all", "live-masked", "cache-head"):  # the KL in the other device's chunk, measured beside
        other = records[f"distill/seq64-bf16-other-kl-chunk/{mode}"]
        assert other["kl_chunk_elements"] == 1 << 26 and other["tokens_per_s"] > 0, mode
    assert records["commands/distill"]["loader"] == "auto: in the training process on a CPU"
    assert live["ratio_to_mlm"] > 0 and live["tokens_per_s"] > 0  # timings only: tiny shapes on a shared CPU
    for command in ("distill", "distill --resume", "finetune", "kd", "evaluate --finetuned", "export --int8"):
        assert f"commands/{command}" in records, command
    resume = records["commands/resume equals uninterrupted"]
    assert resume["bit_identical"] and resume["max_abs_diff"] == 0.0
    assert records["commands/finetune"]["steps"] > 0 and "f1" in records["commands/kd"]["test"]
    assert records["commands/export --int8"]["export"]["checks"]["fp32"]["max_abs_diff"] < 1e-3
    agreement = records["commands/predict agreement"]  # `predict` in PyTorch (fp32, bf16) and as the int8 graph
    assert agreement["records"] == 300 and 0 <= agreement["int8_share_of_pytorch"] <= 1
    assert 0 <= agreement["bf16_share_of_pytorch"] <= 1 and "commands/predict pytorch-bf16" in records
    assert min(agreement[f"{r}_records_per_s"] for r in ("pytorch", "bf16", "int8")) > 0
    assert "| commands | resume equals uninterrupted | yes |" in printed, "the summary table"
    for mode in ("live-all", "live-masked", "cache-head", "cache-top-k"):  # two teachers against one
        assert records[f"distill/seq64-bf16-two-teachers/{mode}-x2"]["tokens_per_s"] > 0, mode
        assert records[f"distill/seq64-bf16-two-teachers/{mode}-x2 cost"]["two_over_one"] > 0, mode
    assert records["distill/seq64-bf16-two-teachers/live-all-x2 cost"]["two_over_one_plus_forward"] > 0


def test_mfu_is_reported_against_the_measured_and_the_datasheet_peak(gpu_check):
    assert gpu_check.datasheet_tflops("NVIDIA H100 80GB HBM3") == gpu_check.datasheet_tflops("NVIDIA H200") == 989.5
    assert gpu_check.datasheet_tflops("NVIDIA H100 PCIe") == 756.5
    assert gpu_check.datasheet_tflops("NVIDIA H100 NVL") == gpu_check.datasheet_tflops("NVIDIA H200 NVL") == 835.5
    assert gpu_check.datasheet_tflops("NVIDIA A100-SXM4-80GB") == gpu_check.datasheet_tflops("NVIDIA A100 80GB PCIe")
    assert gpu_check.datasheet_tflops("NVIDIA A100-PCIE-40GB") == 312.0
    assert gpu_check.datasheet_tflops("Tesla T4") is None and gpu_check.datasheet_tflops(None) is None
    # 160 TFLOP/s achieved over a 40 ms step of which 32 ms on the device; peaks 800 measured, 1000 on the datasheet
    assert gpu_check.mfu_figures(160.0, 800.0, 1000.0, 40.0, 32.0) == {
        "mfu": 0.2, "device_mfu": 0.25, "mfu_datasheet": 0.16, "device_mfu_datasheet": 0.2}
    assert gpu_check.mfu_figures(160.0, 800.0, None, 40.0, 32.0)["device_mfu_datasheet"] is None
