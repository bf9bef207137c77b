"""The GPU check: every biodistil command on CUDA, and the distillation figures where the papers trained.

    python bench/gpu_check.py                       # on a GPU: about 6 minutes on one H100
    python bench/gpu_check.py --device cpu --tiny   # the same script on a CPU, tiny shapes, under a minute
    python bench/gpu_check.py --device cpu --tiny --in-process   # the CPU test's setting: no child processes

Needs nothing but PyTorch, transformers, tokenizers, safetensors, accelerate, numpy (and biodistil's own dependencies)
from the machine; downloads nothing. Models are random weights of the real shapes: a BERT-base teacher (12 × 768,
vocabulary 30,522), its 6 × 768 student (alternate layers) and a 3 × 384 student; the corpus and the NER task are
synthetic. Sections, each run in a child process (a failure in one never hides the others):

  env        the device, driver, PyTorch build and the chip's dense peak, measured by a large matmul (bf16; on a
             CPU the faster of bf16 and float32);
  distill    `bench/throughput.py`'s step (plain MLM; live KL at masked positions and everywhere; from the head and
             top-k caches) at sequence 512 and 128: tokens/s, ratio to plain MLM, MFU (model FLOPs per second over the
             measured bf16 peak and over the datasheet's, `DATASHEET_BF16_TFLOPS`; of the whole step and of its
             device phases), peak memory; bf16 vs float32 student; the compiled KL rows (Triton) vs eager; the
             KL in the other device's chunk of rows (`-other-kl-chunk`: on CUDA the CPU's 2^22 values); two teachers
             of the teacher's shape against one (`--teachers 2`: each teacher mode's `-x2` twin);
  commands   the CLI as a user runs it: `distill` (on CUDA also with `train.num_workers=0`, against the loader workers
             `auto` starts; `--stop-after` + `--resume` against an uninterrupted run, weights compared), `finetune`
             of the teacher and `kd` into the 3 × 384 student (a few hundred steps), `evaluate --finetuned`,
             `export --int8 --task` of the GPU-trained student (ONNX Runtime on the CPU, with its parity and dev-split
             checks), then `predict` of it on 2,000 corpus lines in PyTorch on the device and as the int8 graph
             (records/s, the share of PyTorch's entities the int8 graph gives alike);
  modernbert a tiny ModernBERT (local and global attention, byte-level BPE) through `distill`.

Prints one JSON line per measurement (`{"section", "name", "ok", ...}`), then a summary table with the targets of
docs/gpu.md; `--out FILE` also writes the JSON lines there. Exit status 0 when every measurement ran.
"""

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from importlib import metadata
from itertools import islice
from pathlib import Path
from unittest.mock import patch

BENCH = Path(__file__).resolve().parent
SECTIONS = ("env", "distill", "commands", "modernbert")
PREDICT_DOCUMENTS = 2000  # corpus lines `predict` reads (the tiny corpus has 300)
MARK = "GPUCHECK "
# NVIDIA's datasheet bf16 dense peaks (TFLOP/s, tensor cores, no sparsity), by what the CUDA device name contains: the
# first match counts, so the specific names come first (H100 80GB HBM3 = SXM5). Other devices: None
DATASHEET_BF16_TFLOPS = (("H100 NVL", 835.5), ("H100 PCIe", 756.5), ("H100", 989.5), ("H200 NVL", 835.5),
                         ("H200", 989.5), ("A100", 312.0))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and few steps (the CPU test's setting)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--out", help="also write the JSON lines to this file")
    parser.add_argument("--workdir", help="folder for the synthetic data and run folders (default: a temporary one)")
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)  # a child process runs one section
    parser.add_argument("--section-timeout", type=int, default=420, help="seconds a section may take (420)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the sections in this process, not one child each (CPU only: the CPU test's setting)")
    return parser.parse_args(argv)


class Shapes:
    """The real shapes (BERT-base teacher, 6 × 768 and 3 × 384 students) or, with --tiny, toy ones."""

    def __init__(self, tiny: bool):
        self.tiny = tiny
        self.vocab = 1000 if tiny else 30522
        self.teacher = (2, 64, 2) if tiny else (12, 768, 12)  # layers, width, heads
        self.small_student = (1, 32, 2) if tiny else (3, 384, 12)
        self.seqs = ((64, 4),) if tiny else ((512, 32), (128, 128))  # (sequence, batch) of the distill figures
        self.rounds = (1, 2) if tiny else (2, 8)  # warm-up, measured
        self.block = 32 if tiny else 128
        self.distill_steps = 6 if tiny else 60
        self.distill_batch = 4 if tiny else 32
        self.task_sizes = {"train": 32, "dev": 8, "test": 16} if tiny else {"train": 1600, "dev": 200, "test": 400}
        self.task_batch = 8 if tiny else 16
        self.task_epochs = 1 if tiny else 2
        self.corpus_lines = 300 if tiny else 6000


def emit(section: str, name: str, ok: bool = True, **figures) -> None:
    """One measurement: printed as a marked JSON line that the parent process collects."""
    print(MARK + json.dumps({"section": section, "name": name, "ok": ok, **figures}, default=str), flush=True)


def failure(section: str, name: str, began: float) -> None:
    emit(section, name, ok=False, seconds=round(time.perf_counter() - began, 1), error=traceback.format_exc()[-3000:])


def peak_tflops(device, size: int) -> tuple[float, str]:
    """The chip's dense ceiling, measured, and its dtype: on a GPU the bf16 one; on a CPU the faster of bf16 and
    float32 (a CPU without AVX-512 BF16 or AMX emulates bf16 far below its float32 rate, and a bf16 step's matmuls
    may run in float32 there: an MFU against the emulated rate alone exceeds 1)."""
    import torch

    from biodistil.evaluation.bench import matmul_flops

    dtypes = [torch.bfloat16] if device.type == "cuda" else [torch.bfloat16, torch.float32]
    rates = {str(dtype).removeprefix("torch."): matmul_flops(dtype, device, size)[0] / 1e12 for dtype in dtypes}
    best = max(rates, key=rates.__getitem__)
    return rates[best], best


def datasheet_tflops(name: str | None) -> float | None:
    """The datasheet's bf16 dense peak of the CUDA device `name` (`torch.cuda.get_device_name`), None when unknown."""
    return next((peak for part, peak in DATASHEET_BF16_TFLOPS if name and part in name), None)


def mfu_figures(tflops: float, measured: float, datasheet: float | None, step_ms: float,
                device_ms: float) -> dict[str, float | None]:
    """MFU = achieved model TFLOP/s over the peak, against the measured and the datasheet peak, over the whole step
    and over its device phases (the step's FLOPs in `device_ms` of its `step_ms`: what loader workers that keep up
    leave)."""
    device_share = step_ms / device_ms

    def share(peak: float | None, scale: float = 1.0) -> float | None:
        return None if peak is None else round(tflops / peak * scale, 3)

    return {"mfu": share(measured), "device_mfu": share(measured, device_share),
            "mfu_datasheet": share(datasheet), "device_mfu_datasheet": share(datasheet, device_share)}


# ------------------------------------------------------------------------------------------ sections


def section_env(args, shapes: Shapes) -> None:
    import numpy
    import torch
    import transformers

    device = torch.device(args.device)
    facts = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "transformers": transformers.__version__,
             "numpy": numpy.__version__, "python": sys.version.split()[0], "threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(gpu=props.name, capability=f"{props.major}.{props.minor}", memory_gib=round(
            props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
            bf16=torch.cuda.is_bf16_supported(), driver=_driver(), triton=None)
        with contextlib.suppress(metadata.PackageNotFoundError):
            facts["triton"] = metadata.version("triton")
    else:
        from biodistil.training.machine import cpu_line

        facts["cpu"] = cpu_line()
    peak, facts["peak_dtype"] = peak_tflops(device, 512 if shapes.tiny else 8192)
    facts["peak_tflops"] = round(peak, 3)
    facts["datasheet_tflops"] = datasheet_tflops(facts.get("gpu"))
    emit("env", "machine", **facts)


def _driver() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip() or None
    return None


def section_distill(args, shapes: Shapes) -> None:
    """`bench/throughput.py`'s measurement in this process, per (sequence, precision, KL rows)."""
    import torch

    sys.path.insert(0, str(BENCH))
    import throughput

    from biodistil.losses import distillation
    from biodistil.training.machine import prepare_device

    device = torch.device(args.device)
    prepare_device(device)  # as a run does: TF32 for float32 matmuls on a GPU
    own_chunk = distillation.kl_chunk_elements(device)
    other_chunk = distillation.kl_chunk_elements(torch.device("cpu" if device.type == "cuda" else "cuda"))
    peak, peak_dtype = peak_tflops(device, 512 if shapes.tiny else 8192)
    datasheet = datasheet_tflops(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    layers, width, heads = shapes.teacher
    warmup, repeats = shapes.rounds
    gpu = device.type == "cuda"
    modes, short = list(throughput.MODES), ["mlm", "live-all", "live-masked", "cache-head"]
    seq, batch = shapes.seqs[0]
    auto = "auto" if gpu or not shapes.tiny else "false"
    variants = [(f"seq{seq}-bf16", seq, batch, "bf16", auto, modes, 1)]
    if gpu:  # the KL's row kernel compiled by Triton (what `auto` does on a CPU), and the encoders compiled too
        variants.append((f"seq{seq}-bf16-kl-rows-compiled", seq, batch, "bf16", "rows", short, 1))
    variants += [(f"seq{s}-bf16", s, b, "bf16", "auto", modes, 1) for s, b in shapes.seqs[1:]]
    variants.append((f"seq{seq}-fp32", seq, batch, "no", auto, ["mlm", "live-masked", "cache-head"], 1))
    if gpu:
        variants.append((f"seq{seq}-bf16-compiled", seq, batch, "bf16", "true", ["mlm", "live-masked", "cache-head"],
                         1))
    # two teachers of the teacher's shape (docs/methods.md, several teachers): each teacher mode and its `-x2` twin
    variants.append((f"seq{seq}-bf16-two-teachers", seq, batch, "bf16", auto, modes, 2))
    variants = [(*variant, own_chunk) for variant in variants]
    # the vocabulary KL in the other device's chunk (on CUDA the CPU's 2^22 values): what the device's chunk gains
    variants.append((f"seq{seq}-bf16-other-kl-chunk", seq, batch, "bf16", auto, short, 1, other_chunk))
    for name, seq, batch, precision, compile_setting, chosen, teachers, chunk in variants:
        began = time.perf_counter()
        try:
            argv = ["--device", args.device, "--teacher-layers", str(layers), "--hidden", str(width), "--heads",
                    str(heads), "--vocab", str(shapes.vocab), "--seq", str(seq), "--batch", str(batch),
                    "--warmup", str(warmup), "--repeats", str(repeats), "--student-precision", precision,
                    "--compile", compile_setting, "--teachers", str(teachers), "--modes", *chosen]
            with patch.object(distillation, "kl_chunk_elements", lambda device, chunk=chunk: chunk):
                result = throughput.measure(throughput.parse(argv))
            for twin, cost in result.get("two_teachers", {}).items():
                emit("distill", f"{name}/{twin} cost", **cost)
            device_ms = {mode: sum(ms for phase, ms in phases.items() if phase != "data")
                         for mode, phases in result["phase_ms"].items()}
            for mode, rate in result["tokens_per_s"].items():
                step_ms, tflops = sum(result["phase_ms"][mode].values()), result["gflops"][mode] / 1000
                emit("distill", f"{name}/{mode}", tokens_per_s=rate, ratio_to_mlm=result["ratio_to_mlm"].get(mode),
                     tflops=round(tflops, 2), peak_memory_mib=result["peak_memory_mb"][mode],
                     # device: without the batch's reading and collation, which a run's loader workers overlap
                     **mfu_figures(tflops, peak, datasheet, step_ms, device_ms[mode]),
                     device_ratio_to_mlm=round(device_ms["mlm"] / device_ms[mode], 3),
                     batch=result["batch"], teacher=result["teacher"], student_layers=result["student_layers"],
                     student_precision="float32" if mode == "mlm-fp32" else result["student_precision"],
                     compile=result["compile"], phase_ms=result["phase_ms"][mode], peak_tflops=round(peak, 3),
                     peak_dtype=peak_dtype, datasheet_tflops=datasheet, kl_chunk_elements=chunk)
        except Exception:
            failure("distill", name, began)
        finally:
            if gpu:
                torch.cuda.empty_cache()


def section_commands(args, shapes: Shapes) -> None:
    """The CLI on synthetic data and random models of the real shapes, each command timed and checked: `distill`
    (also stopped halfway and resumed, against the uninterrupted run), `finetune` of the teacher, `kd` into the
    student, `evaluate --finetuned` and `export --int8 --task` of the KD student, `predict` of it."""
    work = Path(args.workdir)
    files, runs = synthetic_world(work, shapes), work / "runs"
    device_overrides = [f"train.device={args.device}", "train.progress_bar=false", "train.tensorboard=false"]
    if args.device == "cpu" and shapes.tiny:
        device_overrides.append("train.compile=false")  # seconds of C++ compile the tiny check need not spend
    distill = [str(files["distill_recipe"]), *device_overrides]
    _command("distill", ["distill", *distill, "--out", str(runs / "distill")], runs / "distill")
    if args.device == "cuda":  # the loader workers `train.num_workers: auto` starts on CUDA, against none
        _command("distill, loader in the training process", ["distill", *distill, "train.num_workers=0", "--out",
                                                             str(runs / "distill-no-workers")],
                 runs / "distill-no-workers")
    half = shapes.distill_steps // 2
    if _command("distill --stop-after", ["distill", *distill, "--out", str(runs / "resumed"), "--stop-after",
                                         str(half)], None):
        _command("distill --resume", ["distill", *distill, "--out", str(runs / "resumed"), "--resume"],
                 runs / "resumed")
        compare_weights(runs / "distill" / "model", runs / "resumed" / "model")
    finetune = ["finetune", str(files["finetune_recipe"]), *device_overrides, "--out", str(runs / "teacher-ner")]
    if _command("finetune", finetune, runs / "teacher-ner"):
        kd = ["kd", str(files["kd_recipe"]), *device_overrides, "--out", str(runs / "student-ner")]
        if _command("kd", kd, runs / "student-ner"):
            model = runs / "student-ner" / "model"
            _command("evaluate --finetuned", ["evaluate", "--finetuned", str(model), "--task", str(files["task"]),
                                              "--out", str(runs / "scored"), "--device", args.device], None,
                     results=runs / "scored" / "results.json")
            if _command("export --int8", ["export", str(model), "--out", str(runs / "student-onnx"), "--int8",
                                          "--task", str(files["task"]), "--split", "dev"], None,
                        export=runs / "student-onnx" / "export.json"):
                predict_commands(args, model, runs / "student-onnx", files["corpus"], runs)


def predict_commands(args, model: Path, onnx: Path, corpus: Path, runs: Path) -> None:
    """`predict` of the KD student on the corpus's first documents, in PyTorch on `--device` (float32, then bf16
    autocast) and as the int8 graph (ONNX Runtime on the CPU): records/s of each and the share of float32 PyTorch's
    entities the bf16 and int8 runs give alike."""
    documents = runs / "documents.txt"
    with corpus.open(encoding="utf-8") as lines:
        documents.write_text("".join(islice(lines, PREDICT_DOCUMENTS)), encoding="utf-8")
    outputs = {runtime: runs / f"predicted-{runtime}.jsonl" for runtime in ("pytorch", "pytorch-bf16", "onnx-int8")}
    seconds = {}
    for runtime, out in outputs.items():
        device = ["--device", args.device] if runtime.startswith("pytorch") else []
        began = time.perf_counter()
        if not _command(f"predict {runtime}", ["predict", str(onnx if runtime == "onnx-int8" else model),
                                               str(documents), "--runtime", runtime, *device, "--out", str(out),
                                               "--quiet"], None):
            return
        seconds[runtime] = time.perf_counter() - began
    began = time.perf_counter()
    try:
        found = {runtime: [json.loads(line) for line in out.read_text().splitlines()]
                 for runtime, out in outputs.items()}
        entities = {runtime: {(r["id"], e["start"], e["end"], e["label"]) for r in records for e in r["entities"]}
                    for runtime, records in found.items()}
        records, reference = len(found["pytorch"]), entities["pytorch"]

        def share(runtime: str) -> float:
            return round(len(reference & entities[runtime]) / max(len(reference), 1), 4)

        emit("commands", "predict agreement", records=records, entities=len(reference),
             bf16_share_of_pytorch=share("pytorch-bf16"), int8_share_of_pytorch=share("onnx-int8"),
             int8_entities=len(entities["onnx-int8"]), pytorch_records_per_s=round(records / seconds["pytorch"], 1),
             bf16_records_per_s=round(records / seconds["pytorch-bf16"], 1),
             int8_records_per_s=round(records / seconds["onnx-int8"], 1), timed="the whole command, loading included")
    except Exception:
        failure("commands", "predict agreement", began)


def _command(name: str, argv: list[str], run_dir: Path | None, results: Path | None = None,
             export: Path | None = None, section: str = "commands") -> bool:
    """Run one `biodistil` command in this process (--debug: a failure keeps its traceback); emit its figures."""
    from biodistil.cli.main import main

    began = time.perf_counter()
    try:
        code = main(["--debug", *argv])
        if code != 0:
            raise RuntimeError(f"biodistil {' '.join(argv)} exited with {code}")
        figures: dict = {"seconds": round(time.perf_counter() - began, 1)}
        summary = run_dir / "summary.json" if run_dir else None
        if summary is not None and summary.is_file():
            figures.update(_summary_figures(json.loads(summary.read_text())))
        if results is not None:
            found = json.loads(results.read_text())
            figures["scores"] = {label: {task: round(cell.get("mean", float("nan")), 4) for task, cell in tasks.items()}
                                 for label, tasks in found.get("summary", {}).items()}
        if export is not None:
            figures["export"] = _export_figures(json.loads(export.read_text()))
        emit(section, name, **figures)
        return True
    except BaseException:
        failure(section, name, began)
        return False


def _summary_figures(summary: dict) -> dict:
    result = summary.get("result", summary.get("train", {})) or {}
    wanted = ("steps", "tokens_per_second", "peak_gpu_memory_mb", "best_step", "best_score", "loader")
    figures = {key: result[key] for key in wanted if isinstance(result, dict) and key in result}
    for key in ("test", "dev", "test_scores"):
        if isinstance(summary.get(key), dict):
            figures[key] = {k: round(v, 4) for k, v in summary[key].items() if isinstance(v, float)}
    return figures


def _export_figures(record: dict) -> dict:
    keep = ("parity", "max_abs_diff", "int8", "int8_scheme", "scores", "fused", "notes", "checks", "quantization")
    return {key: record[key] for key in keep if key in record} or {"keys": sorted(record)}


def compare_weights(first: Path, second: Path) -> None:
    """An uninterrupted run and one stopped and resumed: their final weights, tensor by tensor."""
    import torch
    from safetensors.torch import load_file

    began = time.perf_counter()
    try:
        a, b = load_file(str(first / "model.safetensors")), load_file(str(second / "model.safetensors"))
        if sorted(a) != sorted(b):
            raise RuntimeError(f"different tensors: {sorted(set(a) ^ set(b))[:5]}")
        diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
        identical = all(torch.equal(a[k], b[k]) for k in a)
        emit("commands", "resume equals uninterrupted", ok=diff < 1e-4, bit_identical=identical, max_abs_diff=diff,
             tensors=len(a))
    except Exception:
        failure("commands", "resume equals uninterrupted", began)


def section_modernbert(args, shapes: Shapes) -> None:
    """A tiny ModernBERT teacher (global every 3rd layer, local window 8, byte-level BPE) distilled into its
    alternate layers on the device."""
    work = Path(args.workdir)
    began = time.perf_counter()
    try:
        import torch

        from biodistil.config import ArchitectureConfig
        from biodistil.data.synthetic import biomedical_corpus, train_bpe
        from biodistil.models.student import model_from_architecture

        corpus = work / "modernbert-corpus.txt"
        corpus.write_text(biomedical_corpus(400, seed=5), encoding="utf-8")
        tokenizer = train_bpe(corpus.read_text().splitlines(), 600, work / "modernbert-tokenizer")
        torch.manual_seed(0)
        arch = ArchitectureConfig(model_type="modernbert", num_layers=4, hidden_size=64, num_heads=4,
                                  intermediate_size=128, max_position_embeddings=128, dropout=0.0,
                                  global_attention_every=3, local_attention=8)
        teacher = work / "modernbert-teacher"
        model_from_architecture(arch, tokenizer).save_pretrained(teacher)
        tokenizer.save_pretrained(teacher)
        recipe = work / "modernbert-distil.yaml"
        recipe.write_text(json.dumps({
            "run": {"output_dir": str(work / "runs" / "modernbert"), "seed": 1},
            "teacher": {"name_or_path": str(teacher)}, "student": {"init": "teacher_layers"},
            "data": {"train": [str(corpus)], "block_size": 64, "cache_dir": str(work / "cache"), "eval_fraction": 0},
            "objective": {"temperature": 2.0, "terms": [{"loss": "mlm", "weight": 2.0},
                                                        {"loss": "logit_kl", "weight": 5.0, "positions": "masked"},
                                                        {"loss": "hidden_cosine"}]},
            "train": {"max_steps": 8, "batch_size": 8, "warmup_steps": 0, "eval_every": 0, "save_every": 0,
                      "log_every": 2, "device": args.device, "progress_bar": False, "tensorboard": False,
                      **({"compile": False} if args.device == "cpu" else {})}}), encoding="utf-8")
    except Exception:
        failure("modernbert", "setup", began)
        return
    _command("distill (ModernBERT, local + global attention)", ["distill", str(recipe)], work / "runs" / "modernbert",
             section="modernbert")


# ------------------------------------------------------------------------------------------ synthetic world

def synthetic_world(work: Path, shapes: Shapes) -> dict[str, Path]:
    """Tokenizer, corpus, NER task, a BERT teacher of BERT-base's shape and a 3 × 384 student (random weights), and
    the recipes: the teacher distilled into its alternate layers with DistilBERT's triple loss, fine-tuned on the
    task, KD into the 3 × 384 student."""
    from biodistil.data.synthetic import (
        ENTITIES,
        WORDS,
        biomedical_corpus,
        random_encoder,
        wordpiece_tokenizer,
        write_ner_task,
    )

    work.mkdir(parents=True, exist_ok=True)
    tokenizer = wordpiece_tokenizer(work / "tokenizer", shapes.vocab)
    corpus = work / "corpus.txt"
    corpus.write_text(biomedical_corpus(shapes.corpus_lines, seed=1), encoding="utf-8")
    teacher = random_encoder("bert", shapes.teacher, tokenizer, 0, work / "teacher")
    student = random_encoder("bert", shapes.small_student, tokenizer, 1, work / "student-3x")
    terms = [{"loss": "mlm", "weight": 2.0}, {"loss": "logit_kl", "weight": 5.0, "positions": "masked"},
             {"loss": "hidden_cosine"}]
    task_folder = work / "ner"
    task = write_ner_task(task_folder, "synthetic_ner", ENTITIES, WORDS, shapes.task_sizes, length=(8, 40),
                          max_length=128)
    train = {"batch_size": shapes.distill_batch, "warmup_steps": 0, "eval_every": 0, "log_every": 5}
    recipes = {
        "distill_recipe": {
            "run": {"output_dir": str(work / "runs" / "distill"), "seed": 7},
            "teacher": {"name_or_path": str(teacher)}, "student": {"init": "teacher_layers"},
            "data": {"train": [str(corpus)], "block_size": shapes.block, "cache_dir": str(work / "cache"),
                     "eval_fraction": 0},
            "objective": {"temperature": 2.0, "terms": terms},
            "train": {**train, "max_steps": shapes.distill_steps, "save_every": shapes.distill_steps // 2,
                      "learning_rate": 5e-4}},
        "finetune_recipe": {
            "run": {"output_dir": str(work / "runs" / "teacher-ner"), "seed": 1},
            "model": {"name_or_path": str(teacher)}, "task": {"name": str(task)},
            "finetune": {"epochs": shapes.task_epochs},
            "train": {**train, "batch_size": shapes.task_batch, "learning_rate": 5e-5, "warmup_ratio": 0.1,
                      "save_every": 0}},
        "kd_recipe": {
            "run": {"output_dir": str(work / "runs" / "student-ner"), "seed": 1},
            "teacher": {"name_or_path": str(work / "runs" / "teacher-ner" / "model")},
            "student": {"name_or_path": str(student)}, "task": {"name": str(task)},
            "transfer": {"source": {"kind": "in_domain"}, "keep_labels": True},
            "kd": {"soft_loss": "hinton", "alpha": 0.5, "beta": 0.5, "temperature": 2.0,
                   "epochs": shapes.task_epochs, "cache_dir": str(work / "teacher-store")},
            "train": {**train, "batch_size": shapes.task_batch, "learning_rate": 1e-4, "warmup_ratio": 0.1,
                      "save_every": 0}},
    }
    paths = {"task": task, "corpus": corpus, **{name: work / f"{name}.yaml" for name in recipes}}
    for name, raw in recipes.items():
        paths[name].write_text(json.dumps(raw, indent=1), encoding="utf-8")
    return paths


# ------------------------------------------------------------------------------------------ the parent


SECTION_RUNS = {"env": section_env, "distill": section_distill, "commands": section_commands,
                "modernbert": section_modernbert}


def run_section(args, section: str, workdir: Path) -> list[dict]:
    """One section in a child process (its own CUDA context) or, `--in-process`, in this one (a CPU has no CUDA
    context to keep apart); its marked lines are the records."""
    began, records, tail = time.perf_counter(), [], []
    try:
        for line in section_lines(args, section, workdir):
            if line.startswith(MARK):
                records.append(json.loads(line[len(MARK):]))
                print(line[len(MARK):].rstrip(), flush=True)
            else:
                tail = [*tail[-40:], line.rstrip()]
    except Exception:
        error = traceback.format_exc()[-3000:] + "last output:\n" + "\n".join(tail[-25:])
        records.append({"section": section, "name": "process", "ok": False, "error": error})
        print(json.dumps(records[-1]), flush=True)
    print(f"# section {section}: {time.perf_counter() - began:.0f} s", flush=True)
    return records


def section_lines(args, section: str, workdir: Path) -> Iterator[str]:
    """The section's output lines; raises when it fails, runs past `--section-timeout` or exits other than 0."""
    if args.in_process:
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                SECTION_RUNS[section](argparse.Namespace(**{**vars(args), "workdir": str(workdir)}), Shapes(args.tiny))
        finally:
            yield from printed.getvalue().splitlines()
        return
    command = [sys.executable, str(Path(__file__).resolve()), "--section", section, "--device", args.device,
               "--workdir", str(workdir), *(["--tiny"] if args.tiny else [])]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if section == "commands":  # deterministic cuBLAS workspaces: resume compared bit for bit on one GPU
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    deadline = time.perf_counter() + args.section_timeout
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in child.stdout:
        yield line
        if time.perf_counter() > deadline:
            child.kill()
            raise TimeoutError(f"section {section} ran past {args.section_timeout} s")
    if (code := child.wait()) != 0:
        raise RuntimeError(f"section {section}: exit {code}")


SHOWN = ("gpu", "capability", "driver", "torch", "cuda_build", "transformers", "triton", "cpu", "peak_tflops",
         "peak_dtype", "datasheet_tflops", "tokens_per_s", "ratio_to_mlm", "mfu", "device_ratio_to_mlm", "device_mfu",
         "mfu_datasheet", "device_mfu_datasheet", "peak_memory_mib", "seconds", "steps", "tokens_per_second",
         "peak_gpu_memory_mb", "bit_identical", "max_abs_diff", "best_score", "two_over_one",
         "two_over_one_plus_forward", "records", "entities", "int8_share_of_pytorch", "pytorch_records_per_s",
         "int8_records_per_s")


def summary_table(records: list[dict]) -> str:
    lines = ["| section | measurement | ok | figures |", "|---|---|---|---|"]
    for record in records:
        figures = {k: v for k, v in record.items() if k in SHOWN}
        text = ", ".join(f"{k} {v}" for k, v in figures.items() if not isinstance(v, dict | list))
        if not record["ok"]:
            text = (record.get("error") or "").strip().splitlines()[-1][:160] if record.get("error") else "failed"
        lines.append(f"| {record['section']} | {record['name']} | {'yes' if record['ok'] else 'NO'} | {text} |")
    return "\n".join(lines)


SEQ = "distill/seq512-bf16"
TARGETS = (  # (the records a line reads, as a and b; the line): a line is printed where its records hold its figures
    ((f"{SEQ}/mlm",), "plain MLM, 6 x 768, bf16, seq 512: MFU {a[mfu]:.1%}, {a[device_mfu]:.1%} without the batch's "
     "collation (target >= 40% of the measured peak)"),
    ((f"{SEQ}/mlm",), "the same against the datasheet's {a[datasheet_tflops]} TFLOP/s: MFU {a[mfu_datasheet]:.1%}, "
     "{a[device_mfu_datasheet]:.1%} without the collation (target >= 32%)"),
    ((f"{SEQ}-compiled/mlm",), "the same, encoders compiled (train.compile: true): MFU {a[mfu]:.1%}, "
     "{a[device_mfu]:.1%} without the collation"),
    *(((f"{SEQ}/{mode}",), f"{mode}: {{a[ratio_to_mlm]:.2f}} x plain MLM, {{a[device_ratio_to_mlm]:.2f}} without the "
       f"collation (target >= {goal})") for mode, goal in (("live-masked", 0.72), ("cache-head", 0.9))),
    *(((f"{SEQ}-two-teachers/{mode}-x2 cost",), f"two cached teachers ({mode}): {{a[two_over_one]:.3f}} x one's step "
       "(target <= 1.1)") for mode in ("cache-head", "cache-top-k")),
    *(((f"{SEQ}-two-teachers/{mode}-x2 cost",), f"two live teachers ({mode}): {{a[two_over_one_plus_forward]:.3f}} x "
       "(one-teacher step + the second's forward) (target <= 1.15)") for mode in ("live-all", "live-masked")),
    *(((f"{SEQ}/{mode}", f"{SEQ}-other-kl-chunk/{mode}"), f"{mode}, the KL in chunks of {{a[kl_chunk_elements]:,}} "
       "values: {a[tokens_per_s]:,.0f} tokens/s; in chunks of {b[kl_chunk_elements]:,}: {b[tokens_per_s]:,.0f}")
      for mode in ("live-all", "live-masked", "cache-head")),
    (("commands/distill", "commands/distill, loader in the training process"), "distill command, {a[loader]}: "
     "{a[tokens_per_second]:,.0f} tokens/s; loader in the training process: {b[tokens_per_second]:,.0f}"),
    (("commands/resume equals uninterrupted",), "resume: bit-identical {a[bit_identical]} (max |diff| "
     "{a[max_abs_diff]:.2e})"),
)


def targets(records: list[dict]) -> list[str]:
    """The issue's GPU targets, read off the records (only where the records hold them)."""
    found = {f"{r['section']}/{r['name']}": r for r in records if r["ok"]}
    lines = []
    for keys, line in TARGETS:
        with contextlib.suppress(KeyError, TypeError):  # a record or a figure missing (None: a CPU's datasheet)
            lines.append(line.format_map({name: found[key] for name, key in zip("ab", keys, strict=False)}))
    failed = [f"{r['section']}/{r['name']}" for r in records if not r["ok"]]
    lines.append(f"every measurement ran: {'yes' if not failed else 'NO, failed: ' + ', '.join(failed)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    shapes = Shapes(args.tiny)
    if args.section:  # a child: one section
        if args.section == "commands" and args.device == "cuda":
            import torch

            torch.use_deterministic_algorithms(True, warn_only=True)  # resume compared bit for bit
        SECTION_RUNS[args.section](args, shapes)
        return 0
    if args.in_process and args.device != "cpu":
        print("--in-process is for --device cpu: on a GPU each section needs its own CUDA context", file=sys.stderr)
        return 2
    import tempfile

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        workdir = Path(args.workdir or scratch)
        records = [record for section in args.sections for record in run_section(args, section, workdir)]
    print()
    print(summary_table(records))
    print()
    for line in targets(records):
        print(f"- {line}")
    print(f"- whole check: {time.perf_counter() - began:.0f} s on {args.device}{' (tiny)' if args.tiny else ''}")
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return 0 if all(record["ok"] for record in records) else 1


if __name__ == "__main__":
    sys.exit(main())
