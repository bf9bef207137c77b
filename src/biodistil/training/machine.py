"""The machine record: what this machine is and computes fast, measured once per process (`this_machine()`), and
the decisions biodistil makes from it — bf16 native, the student's precision and the teacher's dtype, the device and
a training stage's process-wide settings, what can be compiled, how a stage loads its batches (each function says
how; docs/architecture.md has the table). torch's CPU threads are decided in `training.threads` from the record's
`usable_cores`. Provenance, reports, studies and the benches read the record (`describe_machine`, `cpu_line`).
"""

import contextlib
import functools
import os
import platform
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from biodistil.errors import BiodistilError
from biodistil.training.onednn import CACHE_SETTINGS

BF16_FAST = 1.3  # a bf16 matmul at least this much faster than float32: the CPU computes bf16 natively
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of native bf16 matrix instructions (Linux /proc/cpuinfo)
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # the flags that decide speed choices
_PRECISION_NAMES = {"no": "float32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}


@dataclass(frozen=True)
class Machine:
    """What this machine is: CPU model and the speed flags it has (`flags` None: unreadable), the cores this process
    may use, whether the CPU computes bf16 natively and why, the C++ compiler TorchInductor would use, the GPU."""

    cpu: str
    flags: tuple[str, ...] | None
    usable_cores: int
    bf16_native: bool
    bf16_why: str
    cpp_compiler: str | None
    gpu: str | None
    torch: str
    python: str


@functools.cache
def this_machine() -> Machine:
    """The machine record, computed once per process."""
    model, flags = cpu_info()
    native, why = cpu_bf16_fast()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return Machine(cpu=model or platform.processor() or platform.machine(),
                   flags=None if flags is None else tuple(flag for flag in SPEED_FLAGS if flag in flags),
                   usable_cores=usable_cores(), bf16_native=native, bf16_why=why, cpp_compiler=cpp_compiler(),
                   gpu=gpu, torch=torch.__version__, python=platform.python_version())


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a container's cgroup CPU quota."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            usable = max(1, min(usable, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return usable


def cpu_info() -> tuple[str | None, list[str] | None]:
    """The CPU's model name and flags from /proc/cpuinfo (Linux); None for what cannot be read."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None, None
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), None)
    return model, flags


def cpu_line() -> str:
    """The CPU's model and the flags of SPEED_FLAGS it has, for a speed figure's heading."""
    record = this_machine()
    return cpu_text(record.cpu, record.flags)


def cpu_text(cpu: str | None, flags: Sequence[str] | None) -> str:
    """A CPU's model and speed flags as `cpu_line` writes them (also from a recorded machine)."""
    return f"{cpu or '?'}; flags: {' '.join(flags or ()) or 'none of avx2/avx512/amx'}"


def describe_machine() -> dict[str, Any]:
    """What a timing or a result was measured on: the machine record and the torch threads in use now."""
    record = asdict(this_machine())
    record["flags"] = None if record["flags"] is None else list(record["flags"])
    return {**record, "torch_threads": torch.get_num_threads(),
            "onednn_caches": {name: os.environ.get(name) for name in CACHE_SETTINGS}}


def bf16_fast(device: torch.device) -> bool:
    """Whether `device` computes bf16 natively: a GPU that supports it, or a CPU per `cpu_bf16_fast`."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_bf16_fast()[0]


@functools.cache
def cpu_bf16_fast() -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively, and why: its flags, or (flags unreadable) a short measurement."""
    flags = cpu_info()[1]
    if flags is not None:
        found = [flag for flag in BF16_FLAGS if flag in flags]
        return bool(found), f"CPU flags {' '.join(found)}" if found else f"CPU flags without {' or '.join(BF16_FLAGS)}"
    speedup = cpu_bf16_speedup()
    return speedup >= BF16_FAST, f"a bf16 matmul ran {speedup:.2f}× as fast as float32 (bf16 from {BF16_FAST}×)"


@functools.cache
def cpu_bf16_speedup(size: int = 1024, repeats: int = 3) -> float:
    """How many times faster a [size × size] bf16 matmul runs than a float32 one on this CPU, with this process's
    threads (measured once per process, about 0.1 s): above 1 where the CPU has bf16 instructions, below where
    bf16 is emulated."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)

    def fastest(x: torch.Tensor, y: torch.Tensor) -> float:
        x @ y  # warm-up: kernels chosen, memory touched
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - began)
        return min(times)

    return fastest(a, b) / fastest(a.bfloat16(), b.bfloat16())


def resolve_precision(setting: str, device: torch.device) -> tuple[str, str]:
    """`train.precision` as accelerate takes it ("no", "bf16", "fp16") and a line saying why: "auto" is bf16 autocast
    where `bf16_fast(device)` (a student trained so matched float32's held-out MLM loss and fine-tuned F1 within the
    seed spread at equal steps: docs/results.md); on a GPU without bf16 (before Ampere) fp16 autocast, whose loss
    scaling accelerate adds; float32 on a CPU without native bf16."""
    if setting != "auto":
        resolved = setting, f"{_PRECISION_NAMES.get(setting, setting)} (train.precision)"
    elif device.type == "cuda":
        chosen = "bf16" if bf16_fast(device) else "fp16"
        why = "GPU with bf16" if chosen == "bf16" else "GPU without bf16, fp16 with loss scaling"
        resolved = chosen, f"{_PRECISION_NAMES[chosen]} (auto: {why})"
    else:
        fast, why = cpu_bf16_fast()
        resolved = ("bf16" if fast else "no"), f"{_PRECISION_NAMES['bf16' if fast else 'no']} (auto: {why})"
    return resolved


def training_device(setting: str = "auto", option: str = "train.device") -> torch.device:
    """The device `train.device` (or another `option`) names: "auto" is the CUDA GPU when one is visible, else the
    CPU; "cuda" without a visible GPU is an error that says why (a CPU build of PyTorch, or no GPU / driver)."""
    if setting == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if setting == "cuda":
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise BiodistilError(f"{option}=cuda: no CUDA GPU is visible to PyTorch {torch.__version__} ({build}; "
                             f"check nvidia-smi and CUDA_VISIBLE_DEVICES); use {option}=auto or cpu")
    return torch.device("cpu")


def prepare_device(device: torch.device) -> None:
    """On CUDA, float32 matmuls and convolutions may use TF32 (process-wide: a stage sets it by `stage_settings`)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True


@contextlib.contextmanager
def stage_settings(device: torch.device) -> Iterator[None]:
    """The process-wide settings of a training stage on `device`, put back when it ends, so that a stage never
    changes the next one's: on CUDA, float32 matmuls and convolutions may use TF32
    (`torch.set_float32_matmul_precision("high")`, ~8x the float32 rate on Ampere or newer; autocast's bf16 is
    unaffected); dynamo's `suppress_errors`, which `train.compile: true` sets (`training.compiling`)."""
    import torch._dynamo

    matmul, tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    suppress = torch._dynamo.config.suppress_errors
    prepare_device(device)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = tf32
        torch._dynamo.config.suppress_errors = suppress


CUDA_LOADER_WORKERS = 4  # loader processes a CUDA stage starts at most (collation of a 32 x 512 batch: ~9 ms)
PREFETCHED_BATCHES = 4  # batches each loader worker keeps ready (PyTorch's default is 2)


@dataclass(frozen=True)
class LoaderPlan:
    """How a training stage loads its batches: `workers` processes (0: in the training process), each keeping
    `prefetch` batches ready; `pin` pages the batches in pinned memory, for copies that do not block the host."""

    workers: int
    pin: bool
    prefetch: int | None
    note: str


def loader_plan(setting: int | str, device: torch.device, processes: int = 1,
                cores: int | None = None) -> LoaderPlan:
    """`train.num_workers` on `device`: a number is taken as asked; `auto` is 0 on a CPU (a worker would take a core
    from the training's threads) and, on CUDA, one worker per usable core of this process but one, at most
    `CUDA_LOADER_WORKERS` — the host collates the next batches while the GPU computes. On CUDA batches are pinned."""
    cuda = device.type == "cuda"
    if setting != "auto":
        workers, why = int(setting), f"{setting} (as asked)"
    elif not cuda:
        workers, why = 0, "auto: in the training process on a CPU"
    else:
        spare = (cores if cores is not None else this_machine().usable_cores) // max(1, processes) - 1
        workers = max(0, min(CUDA_LOADER_WORKERS, spare))
        why = f"auto: {workers} on CUDA ({spare + 1} usable cores per process, at most {CUDA_LOADER_WORKERS})"
    prefetch = PREFETCHED_BATCHES if workers else None
    extras = [part for part, on in (("pinned", cuda), (f"{prefetch} batches prefetched each", workers)) if on]
    return LoaderPlan(workers, cuda, prefetch, why + (f"; {', '.join(extras)}" if extras else ""))


def teacher_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The teacher's dtype for `teacher.dtype`: "auto" is bfloat16 where the hardware computes it fast
    (`bf16_fast`: a GPU with bf16, a CPU with native bf16 instructions), else float32. `dtype_note` says which and
    why."""
    if setting == "auto":
        setting = "bfloat16" if bf16_fast(device) else "float32"
    return torch.bfloat16 if setting == "bfloat16" else torch.float32


def dtype_note(setting: str, dtype: torch.dtype, device: torch.device) -> str:
    """A line for the run's report: the teacher's dtype and, for `auto`, what decided it."""
    name = str(dtype).removeprefix("torch.")
    if setting != "auto":
        return f"Teacher dtype: {name} (teacher.dtype)."
    if device.type != "cpu":
        return f"Teacher dtype: {name} (auto: {device.type} {'with' if name == 'bfloat16' else 'without'} fast bf16)."
    return f"Teacher dtype: {name} (auto: {cpu_bf16_fast()[1]})."


def triton_available() -> bool:
    from torch.utils._triton import has_triton

    return has_triton()


def cpp_compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")
