"""What the hardware computes fast: whether bf16 is native here, decided once per process and the same in every
process of a run (from the CPU's flags where they can be read).

The teacher's dtype (`teacher.dtype: auto`) and the student's precision (`train.precision: auto`) both follow it:
bf16 on a GPU with bf16 and on a CPU with native bf16 instructions (AMX, AVX-512 BF16), float32 elsewhere.
"""

import functools
import time

import torch

from biodistil.errors import BiodistilError
from biodistil.training.provenance import cpu_info

BF16_FAST = 1.3  # a bf16 matmul at least this much faster than float32: the CPU computes bf16 natively
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of native bf16 matrix instructions (Linux /proc/cpuinfo)
_PRECISION_NAMES = {"no": "float32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}


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


def training_device(setting: str = "auto") -> torch.device:
    """The device `train.device` names: "auto" is the CUDA GPU when one is visible, else the CPU; "cuda" without a
    visible GPU is an error that says why (a CPU build of PyTorch, or no GPU / driver)."""
    if setting == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if setting == "cuda":
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise BiodistilError(f"train.device=cuda: no CUDA GPU is visible to PyTorch {torch.__version__} ({build}; "
                             "check nvidia-smi and CUDA_VISIBLE_DEVICES); use train.device=auto or cpu")
    return torch.device("cpu")


def prepare_device(device: torch.device) -> None:
    """Process-wide settings for training on `device`: on CUDA, float32 matmuls and convolutions may use TF32
    (`torch.set_float32_matmul_precision("high")`, ~8x the float32 rate on Ampere or newer; autocast's bf16 is
    unaffected)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
