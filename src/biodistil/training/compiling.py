"""`train.compile`: what a stage compiles with torch.compile (TorchInductor), decided once per stage (`apply_compile`).

`auto` (the default) compiles, on a CPU, the row function of the vocabulary KL
(`losses.distillation.compiled_kl_rows`: its log-softmaxes, KL and gradient fused into one kernel, which wins on every
CPU measured; the kernel is handed to the stage's objective, `Objective.kl_rows`, which passes it to the losses — they
default to eager rows; not for a KL over narrow rows — task KD's few classes, a toy vocabulary —, where eager rows are
as fast: `KERNEL_MIN_COLUMNS`)
and nothing on a GPU (on an H100 the eager rows were 5-15% faster than Triton's fused kernel: docs/gpu.md); `true`
also compiles the encoders in place (`nn.Module.compile`, so parameter names, checkpoints and exported weights do not
change; no gain on CPUs measured); `false` nothing. The rest of the losses, with their hand-written fused gradients,
stay eager. Inductor needs a C++ compiler on the CPU and Triton on a GPU: without them the stage runs uncompiled (and
`true` says so); a graph that cannot be compiled falls back to eager (dynamo's `suppress_errors`). The run's report
says what was compiled.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.losses.distillation import KLRows, compiled_kl_rows
from biodistil.models.families import encoder_of
from biodistil.training.machine import cpp_compiler, triton_available

# the compiled KL rows against eager ones, 1,280 rows, 2 threads (Intel Xeon with AMX, 2026-11-27): 3 columns 150 vs
# 128 µs, 64: 301 vs 179, 512: 1.61 vs 1.51 ms, 4,096: 9.3 vs 18.2 ms; the compile itself takes ~11 s. A task's classes
# are far below the crossing, a real vocabulary far above it (a test's vocabulary of a few hundred is below).
KERNEL_MIN_COLUMNS = 2048


@dataclass(frozen=True)
class CompileChoice:
    """What `train.compile` did for a stage: the note its report shows, and the KL row kernel (None: eager rows)."""

    note: str
    kl_rows: KLRows | None = None


def apply_compile(setting: bool | str, module: nn.Module, device: torch.device) -> CompileChoice:
    """Apply `train.compile` to the stage about to train `module`: `auto` compiles the vocabulary KL's row kernel
    on a CPU where TorchInductor can (a C++ compiler) and nothing on a GPU (measured slower there), `true` the
    encoders (`compile_encoders`) and the row kernel on either, `false` nothing. A stage whose module says it has no
    KL term (`uses_kl_rows = False`: fine-tuning, MLM alone), or a KL over rows narrower than `KERNEL_MIN_COLUMNS`
    (`kl_columns`: task KD's classes, a distillation's vocabulary), compiles nothing under `auto`. Returns what was
    done and the kernel, which the engine hands to the module's objective."""
    if setting is not False and device.type == "cpu" and not cpp_compiler():
        return CompileChoice(f"{_SETTING_NAMES[setting]}: nothing, no C++ compiler found (install g++ or set CXX)")
    if setting is not False and device.type == "cuda" and not triton_available():
        return CompileChoice(f"{_SETTING_NAMES[setting]}: nothing, Triton is not installed (TorchInductor's GPU code "
                             "generator)")
    if setting is False:
        return CompileChoice("false: nothing")
    if setting == "auto" and not getattr(module, "uses_kl_rows", True):
        return CompileChoice("auto: nothing (no KL term in this stage)")
    columns = getattr(module, "kl_columns", None)
    if setting == "auto" and columns is not None and columns < KERNEL_MIN_COLUMNS:
        return CompileChoice(f"auto: nothing (the KL's rows are {columns:,} columns wide; the compiled kernel wins "
                             f"from {KERNEL_MIN_COLUMNS:,})")
    if setting == "auto" and device.type == "cuda":
        return CompileChoice("auto: nothing on a GPU (the eager KL rows ran faster than Triton's kernel on an H100, "
                             "docs/gpu.md)")
    if setting is True:
        return CompileChoice(f"true: the encoders of {compile_encoders(module)} and the vocabulary KL's row kernel",
                             compiled_kl_rows())
    return CompileChoice("auto: the vocabulary KL's row kernel (TorchInductor)", compiled_kl_rows())


def compile_encoders(module: nn.Module) -> str:
    """Compile in place the encoders of the pre-trained models `module` holds (its student, a trainable teacher) and
    of the teachers it runs online (`module.signals`); returns their class names."""
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # a graph that cannot compile runs eagerly, with a warning
    models = [child for child in module.children() if isinstance(child, PreTrainedModel)]
    for signal in getattr(module, "signals", ()):
        teacher = getattr(signal, "model", None)
        if isinstance(teacher, PreTrainedModel) and all(teacher is not model for model in models):
            models.append(teacher)
    for model in models:
        encoder_of(model).compile()
    return ", ".join(type(model).__name__ for model in models)


_SETTING_NAMES = {True: "true", "auto": "auto"}
