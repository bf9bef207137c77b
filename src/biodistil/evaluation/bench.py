"""`biodistil bench`: size, latency, throughput and peak memory of encoders, measured side by side.

Every model is loaded as its bare encoder (`AutoModel`, no MLM or task head) in one process; a `.onnx` graph
of a `biodistil export` (fp32 or int8) runs in ONNX Runtime's CPU provider with as many intra-op threads as
torch has (`OnnxModel`, as deployed: memory arena on, large batches in slices) and includes its head (a
classifier's head costs next to nothing; a masked LM's does). For each sequence length, latency is timed at
`latency_batch` (default 1) and throughput at `throughput_batch` (default 32) on random token ids: after `warmup`
untimed runs per model, the `repeats` timed runs go round robin over the models (model A, B, A, B, ...), so that a
slow patch of a shared machine hits every model alike. Reported: the median and the quartiles. Speedups are against
the first model.

Peak memory on the CPU (`memory: isolated`, the default): each model and shape in a fresh Python process that loads
the model, then runs it twice at that shape; the figure is the increase of the process's resident set (RSS) over its
value once the model is loaded (activations, workspace, ONNX Runtime's arena: everything the runs add; weights
excluded), measured with the Linux peak-RSS counter reset (`/proc/self/clear_refs`), else by sampling the RSS every
millisecond, freed heap memory handed back first (glibc `malloc_trim`). One process per measurement, because an
allocator keeps what a run freed (ONNX Runtime's arena, glibc's heap) and would hide the next model's or shape's
needs in one shared process; these processes run once a shape's timing is done, as many at a time as there are
usable cores (each reads its own counter). The process's whole peak RSS (weights and libraries included) is reported
beside it.
`in-process` measures the same increase around one run in the timing process (quicker, less clean); on CUDA,
`torch.cuda.max_memory_allocated` during one run (weights included). The output says which method was used.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any

import torch

from biodistil.errors import BiodistilError
from biodistil.evaluation.recipe import BenchConfig
from biodistil.export.runtime import OnnxModel
from biodistil.io import atomic_write_json
from biodistil.models.families import position_limit
from biodistil.training.machine import usable_cores
from biodistil.training.threads import StageThreads

BENCH_FORMAT = "biodistil-bench/1"
ISOLATED_RUNS = 2  # runs at one shape in the fresh process of an isolated memory measurement
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


# ------------------------------------------------------------------------------------------ models


def load_benched(path: str, threads: int) -> torch.nn.Module | OnnxModel:
    """The bare encoder of a model folder or Hub id, or an exported ONNX graph (a `.onnx` file of an export)."""
    if path.endswith(".onnx"):
        return OnnxModel(path, threads=threads)
    from biodistil.models.loading import check_model, load_encoder

    check_model(path, "bench")
    return load_encoder(path).eval()  # heads are not part of the benchmark


def disk_bytes(path: str) -> int | None:
    """Bytes of the weight files (safetensors / PyTorch bin) of a local folder or a cached Hub model, or of a
    .onnx graph."""
    folder = Path(path).expanduser()
    if folder.is_file():
        return folder.stat().st_size
    if not folder.is_dir():
        folder = _cached_snapshot(path)
        if folder is None:
            return None
    files = [f for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern)]
    return sum(f.stat().st_size for f in files) if files else None


def _cached_snapshot(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        return None


def max_length(model: torch.nn.Module | OnnxModel) -> int:
    """Longest sequence the model's position embeddings allow (`position_limit`)."""
    return position_limit(model.config)


def random_batch(model: torch.nn.Module | OnnxModel, batch: int, length: int,
                 device: torch.device) -> dict[str, torch.Tensor]:
    """Token ids drawn from the model's vocabulary (fixed seed), no padding."""
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(batch * 100_003 + length)
    ids = torch.randint(min(5, vocab - 1), vocab, (batch, length), generator=generator)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids, device=device)}


# ------------------------------------------------------------------------------------------ timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(model: torch.nn.Module | OnnxModel, batch: dict[str, torch.Tensor], device: torch.device) -> float:
    """Seconds of one forward pass."""
    _sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        model(**batch)
    _sync(device)
    return time.perf_counter() - start


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min and max of repeated measurements."""
    ordered = sorted(values)
    if len(ordered) > 1:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {"median": statistics.median(ordered), "q1": q1, "q3": q3, "min": ordered[0], "max": ordered[-1]}


def round_robin(runs: dict[str, Callable[[], float]], warmup: int, repeats: int) -> dict[str, list[float]]:
    """Warm every run up, then time them in turn `repeats` times; seconds per run, per key."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            times[key].append(run())
    return times


# ------------------------------------------------------------------------------------------ memory


def _status_kib(field: str, pid: int | None = None) -> int | None:
    try:
        for line in (_STATUS if pid is None else Path(f"/proc/{pid}/status")).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _can_reset_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def memory_method(device: torch.device, memory: str = "isolated") -> str:
    if device.type == "cuda":
        return "CUDA max allocated during one run (torch.cuda.max_memory_allocated; weights included)"
    if memory == "off":
        return "not measured"
    counter = ("Linux VmHWM reset via /proc/self/clear_refs" if _can_reset_peak() else "RSS sampled every 1 ms")
    if memory == "isolated":
        return (f"CPU, each model and shape in a fresh process: peak RSS increase over the loaded model's RSS during "
                f"{ISOLATED_RUNS} runs ({counter}, freed heap returned first with malloc_trim; activations, workspace "
                "and allocator arenas, weights excluded); the process's whole peak RSS beside it")
    return (f"CPU, in the timing process: peak RSS increase over the RSS before one run ({counter}, freed heap "
            "returned first with malloc_trim; activations and workspace, weights excluded)")


def current_rss(pid: int | None = None) -> int:
    """The resident set size in bytes of this process, or of process `pid`."""
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        kib = _status_kib("VmRSS", pid)
        if kib is None:
            raise BiodistilError("bench: cannot read a process's memory on this system") from None
        return kib * 1024


@functools.cache
def matmul_flops(dtype: torch.dtype, device: torch.device, size: int = 2048, repeats: int = 10,
                 quick_s: float = 0.05) -> tuple[float, int]:
    """The chip's own dense ceiling: (FLOP/s of a square matmul in `dtype`, best of `repeats` after 3 warm-ups; its
    side). The side doubles from 256 up to `size` while one product takes under `quick_s`: a dtype the CPU only
    emulates (bf16 without AVX-512 BF16 or AMX, ~1 GFLOP/s) is measured at a side that takes seconds, not minutes.
    Measured once per process for the same arguments: every figure of a process is then set against one ceiling."""
    side = 256
    while True:
        a, b = (torch.randn(side, side, device=device).to(dtype) for _ in range(2))
        for _ in range(3):
            a @ b
        best = math.inf
        for _ in range(repeats):
            _sync(device)
            began = time.perf_counter()
            a @ b
            _sync(device)
            best = min(best, time.perf_counter() - began)
        if side >= size or best > quick_s:
            return 2 * side**3 / best, side
        side *= 2


class PeakRSS:
    """The largest resident set size a background thread sees (sampled every `every` seconds) while `watching`: from
    `start` to `stop`, or from one `take` to the next (a phase's peak); `close` ends the thread."""

    def __init__(self, every: float = 0.001):
        self.peak, self.watching, self.every = 0, False, every
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            if self.watching:
                self.peak = max(self.peak, current_rss())
            time.sleep(self.every)

    def start(self) -> None:
        self.peak, self.watching = current_rss(), True

    def stop(self) -> int:
        self.watching = False
        return max(self.peak, current_rss())

    def take(self) -> int:
        """The peak since the last `take` (or `start`), then start again from now."""
        now = current_rss()
        peak, self.peak = max(self.peak, now), now
        return peak

    def close(self) -> None:
        self._done.set()
        self._thread.join()


@contextmanager
def _sampled_peak() -> Iterator[dict[str, int]]:
    """Peak RSS by sampling in a background thread (where the kernel's peak counter cannot be reset)."""
    sampler = PeakRSS()
    sampler.start()
    found = {"peak": sampler.peak}
    try:
        yield found
    finally:
        found["peak"] = sampler.stop()
        sampler.close()


def _release_free_memory() -> None:
    """Collect garbage and hand freed heap memory back to the system (glibc), so that reused memory counts."""
    gc.collect()
    with suppress(OSError, AttributeError):  # not glibc: nothing to hand back
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_memory_bytes(run: Callable[[], float], device: torch.device) -> int | None:
    """Peak memory of one run, as `memory_method(device)` describes."""
    _release_free_memory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        return int(torch.cuda.max_memory_allocated(device))
    if _can_reset_peak():
        before = _status_kib("VmRSS") or 0
        run()
        return max(0, ((_status_kib("VmHWM") or 0) - before) * 1024)
    before = current_rss()
    with _sampled_peak() as found:
        run()
    return max(0, found["peak"] - before)


def isolated_peak_memory(path: str, threads: int, batch: int, length: int) -> dict[str, int]:
    """Peak memory of one model at one shape, measured in a fresh Python process (see the module docstring):
    `peak_memory_bytes` (the increase over the loaded model) and `peak_rss_bytes` (the process's peak)."""
    code = ("import sys; from biodistil.evaluation.bench import measure_in_this_process; "
            "measure_in_this_process(sys.argv[1:])")
    argv = [sys.executable, "-c", code, path, str(threads), str(batch), str(length)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        cause = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise BiodistilError(f"bench: measuring the memory of {path} (batch {batch}, length {length}) in a fresh "
                             f"process failed: {cause}")
    return json.loads(lines[-1])


def measure_in_this_process(argv: Sequence[str]) -> None:
    """The fresh process of `isolated_peak_memory`: load the model, run it ISOLATED_RUNS times at the shape, print
    the figures as JSON."""
    path, threads, batch, length = argv[0], *map(int, argv[1:4])
    torch.set_num_threads(threads)
    cpu = torch.device("cpu")
    model = load_benched(path, threads)
    inputs = random_batch(model, batch, length, cpu)
    increase = peak_memory_bytes(lambda: sum(time_once(model, inputs, cpu) for _ in range(ISOLATED_RUNS)), cpu)
    print(json.dumps({"peak_memory_bytes": increase, "peak_rss_bytes": (_status_kib("VmHWM") or 0) * 1024}))


# ------------------------------------------------------------------------------------------ the bench


def _device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise BiodistilError("bench: --device cuda asked for, but no CUDA GPU is available")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads)"


def _measure(models: dict[str, torch.nn.Module | OnnxModel], paths: dict[str, str], batch: int, length: int,
             cfg: BenchConfig, device: torch.device) -> dict[str, dict[str, Any]]:
    """Times and peak memory of every model at one (batch, length); models too short for it are skipped."""
    results: dict[str, dict[str, Any]] = {}
    runs: dict[str, Callable[[], float]] = {}
    for label, model in models.items():
        if length > max_length(model):
            results[label] = {"skipped": f"longer than the model's {max_length(model)} positions"}
            continue
        inputs = random_batch(model, batch, length, device)
        runs[label] = lambda model=model, inputs=inputs: time_once(model, inputs, device)
    timed = round_robin(runs, cfg.warmup, cfg.repeats)
    memory = _memory(runs, paths, batch, length, cfg, device)
    for label, seconds in timed.items():
        ms = spread([s * 1000 for s in seconds])
        results[label] = {
            "batch": batch, "length": length, "runs": len(seconds),
            **{f"{key}_ms": value for key, value in ms.items()},
            "sequences_per_s": batch / (ms["median"] / 1000),
            "tokens_per_s": batch * length / (ms["median"] / 1000),
            **memory[label],
        }
    return results


def _memory(runs: dict[str, Callable[[], float]], paths: dict[str, str], batch: int, length: int, cfg: BenchConfig,
            device: torch.device) -> dict[str, dict[str, int | None]]:
    """The peak-memory fields of every model at one shape, as `cfg.memory` asks (CUDA: always in this process).
    Isolated measurements start once the shape's timing is done, as many fresh processes at a time as the machine has
    usable cores: each reads its own peak counter, so neighbours do not change it (one at a time, the demo's eight
    took 43 of its bench's 72 seconds)."""
    if device.type == "cuda" or cfg.memory == "in-process":
        return {label: {"peak_memory_bytes": peak_memory_bytes(run, device)} for label, run in runs.items()}
    if cfg.memory == "off":
        return {label: {"peak_memory_bytes": None} for label in runs}
    threads = torch.get_num_threads()
    with ThreadPoolExecutor(max(1, min(len(runs), usable_cores()))) as pool:
        measured = {label: pool.submit(isolated_peak_memory, paths[label], threads, batch, length) for label in runs}
        return {label: future.result() for label, future in measured.items()}


def _speedups(rows: list[dict[str, Any]], lengths: Sequence[int]) -> None:
    """Each model's latency and throughput speedup against the first model (>1 = faster), in place."""
    first = rows[0]
    for row in rows:
        row["speedup"] = {}
        for length in map(str, lengths):
            for kind in ("latency", "throughput"):
                mine, ref = row[kind].get(length, {}), first[kind].get(length, {})
                if "median_ms" in mine and "median_ms" in ref:
                    row["speedup"][f"{kind}_{length}"] = ref["median_ms"] / mine["median_ms"]


def run_bench(models: Sequence[tuple[str, str]], cfg: BenchConfig) -> dict[str, Any]:
    """Benchmark (label, path) models side by side; the result is what `bench.json` holds. `cfg.threads` holds for the
    bench and is put back after it (`StageThreads`); without it the command's count is used."""
    if not models:
        raise BiodistilError("bench: give at least one model")
    with StageThreads(cfg.threads) if cfg.threads is not None else nullcontext():
        return _bench(models, cfg)


def _bench(models: Sequence[tuple[str, str]], cfg: BenchConfig) -> dict[str, Any]:
    device = _device(cfg.device)
    loaded = {label: load_benched(path, torch.get_num_threads()).to(device) for label, path in models}
    rows: list[dict[str, Any]] = []
    from biodistil.models.size import count_parameters

    for label, path in models:
        model = loaded[label]
        sizes = model.parameters_count if isinstance(model, OnnxModel) else count_parameters(model)
        rows.append({"label": label, "path": path, "runtime": _runtime(model), "parameters": sizes["total"],
                     "parameters_without_embeddings": sizes["non_embedding"], "disk_bytes": disk_bytes(path),
                     "max_length": max_length(loaded[label]), "latency": {}, "throughput": {}})
    for length in cfg.lengths:
        print(f"bench: sequence length {length}: latency (batch {cfg.latency_batch}), throughput "
              f"(batch {cfg.throughput_batch}); {cfg.warmup} warm-up + {cfg.repeats} timed runs each", flush=True)
        latency = _measure(loaded, dict(models), cfg.latency_batch, length, cfg, device)
        throughput = _measure(loaded, dict(models), cfg.throughput_batch, length, cfg, device)
        for row in rows:
            row["latency"][str(length)] = latency[row["label"]]
            row["throughput"][str(length)] = throughput[row["label"]]
    _speedups(rows, cfg.lengths)
    torch_models = [m for m in loaded.values() if isinstance(m, torch.nn.Module)]
    return {"format": BENCH_FORMAT, "device": _device_name(device), "torch": torch.__version__,
            "dtype": str(torch_models[0].dtype if torch_models else torch.float32).replace("torch.", ""),
            "memory_method": memory_method(device, cfg.memory), "reference": rows[0]["label"],
            "settings": cfg.model_dump(mode="json", exclude={"enabled"}), "models": rows}


def _runtime(model: torch.nn.Module | OnnxModel) -> str:
    if isinstance(model, OnnxModel):
        return model.runtime
    threads, dtype = torch.get_num_threads(), str(model.dtype).replace("torch.", "")
    return f"PyTorch {torch.__version__} ({dtype}, {threads} thread{'s' * (threads != 1)})"


def write_bench(result: dict[str, Any], path: Path) -> Path:
    atomic_write_json(Path(path), result)
    return Path(path)


# ------------------------------------------------------------------------------------------ printing


def _mb(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.1f} MB"


def _peak(entry: dict[str, Any]) -> str:
    whole = f" (process {_mb(entry['peak_rss_bytes'])})" if entry.get("peak_rss_bytes") else ""
    return f"peak {_mb(entry['peak_memory_bytes'])}{whole}"


def _timing(entry: dict[str, Any], kind: str) -> str:
    if "median_ms" not in entry:
        return f"n/a ({entry.get('skipped', 'not measured')})"
    spread_ms = f"[{entry['q1_ms']:.2f}–{entry['q3_ms']:.2f}]"
    if kind == "latency":
        return f"{entry['median_ms']:.2f} ms {spread_ms}, {_peak(entry)}"
    return (f"{entry['sequences_per_s']:,.1f} seq/s ({entry['median_ms']:.1f} ms {spread_ms} per batch), "
            f"{_peak(entry)}")


def format_bench(result: dict[str, Any]) -> str:
    """A plain-text summary of a bench result, for the terminal: each model, then the side-by-side table."""
    settings = result["settings"]
    lines = [f"Device: {result['device']}; torch {result['torch']}; {result['dtype']}; medians of "
             f"{settings['repeats']} runs after {settings['warmup']} warm-up runs, [quartiles].",
             f"Peak memory: {result['memory_method']}.", ""]
    for row in result["models"]:
        lines.append(f"{row['label']} ({row['path']}; {row.get('runtime', 'PyTorch')}): "
                     f"{row['parameters']:,} parameters "
                     f"({row['parameters_without_embeddings']:,} without embeddings), weights on disk "
                     f"{_mb(row['disk_bytes'])}, max length {row['max_length']}")
        for length in map(str, settings["lengths"]):
            lines.append(f"  length {length}: latency (batch {settings['latency_batch']}) "
                         f"{_timing(row['latency'][length], 'latency')}")
            lines.append(f"  length {length}: throughput (batch {settings['throughput_batch']}) "
                         f"{_timing(row['throughput'][length], 'throughput')}")
        speed = ", ".join(f"{key} ×{value:.2f}" for key, value in row["speedup"].items() if math.isfinite(value))
        lines.append(f"  speedup vs {result['reference']}: {speed or 'n/a'}")
    return "\n".join([*lines, "", *side_by_side(result, result["reference"])])


def side_by_side(result: dict[str, Any], reference: str, labels: Sequence[str] | None = None) -> list[str]:
    """A Markdown table of every model (or `labels`) at every length: latency, throughput and peak memory at the
    throughput batch, each with its ratio to `reference` (× > 1: faster, or more memory)."""
    settings = result["settings"]
    rows = {row["label"]: row for row in result["models"]}
    lat, thr = settings["latency_batch"], settings["throughput_batch"]
    lines = [f"| model | runtime | length | batch-{lat} latency ms | × {reference} | batch-{thr} seq/s | × | "
             f"peak MB at batch {thr} | × |", "|---|---|---|---|---|---|---|---|---|"]
    for label in labels or list(rows):
        row = rows[label]
        for length in map(str, settings["lengths"]):
            mine = (row["latency"][length], row["throughput"][length])
            ref = (rows[reference]["latency"][length], rows[reference]["throughput"][length])
            cells = [_cell(mine[0], ref[0], "median_ms", inverse=True), _cell(mine[1], ref[1], "sequences_per_s"),
                     _cell(mine[1], ref[1], "peak_memory_bytes")]
            lines.append(f"| {label} | {row.get('runtime', 'PyTorch')} | {length} | {' | '.join(cells)} |")
    return lines


def _cell(mine: dict[str, Any], ref: dict[str, Any], key: str, inverse: bool = False) -> str:
    """A value and its ratio to the reference's, as two table cells."""
    value, base = mine.get(key), ref.get(key)
    if value is None:
        return "n/a | –"
    shown = f"{value / 2**20:,.0f}" if key.endswith("bytes") else f"{value:,.1f}" if value >= 100 else f"{value:.2f}"
    if not base or not value:
        return f"{shown} | –"
    return f"{shown} | {(base / value if inverse else value / base):.2f}"
