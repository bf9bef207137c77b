"""`train.compile`: what a stage compiles with torch.compile (TorchInductor), decided once per stage (`apply_compile`).

`auto` (the default) compiles the row function of the vocabulary KL (`losses.distillation.compile_kl_rows`: its
log-softmaxes, KL and gradient fused into one kernel, which wins on every CPU measured); `true` also compiles the
encoders in place (`nn.Module.compile`, so parameter names, checkpoints and exported weights do not change; no gain on
CPUs measured); `false` nothing. The rest of the losses, with their hand-written fused gradients, stay eager.
Inductor needs a C++ compiler on the CPU: without one the stage runs uncompiled (and `true` says so); a graph that
cannot be compiled falls back to eager (dynamo's `suppress_errors`). The run's report says what was compiled.
"""

import os
import shutil

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.losses.distillation import compile_kl_rows
from biodistil.models.families import encoder_of


def apply_compile(setting: bool | str, module: nn.Module, device: torch.device) -> str:
    """Apply `train.compile` to the stage about to train `module`: `auto` compiles the vocabulary KL's row kernel
    where TorchInductor can (a C++ compiler on the CPU), `true` also the encoders (`compile_models`), `false`
    nothing. Returns what was done, which the run's report shows (`compile_note`)."""
    if setting is True:
        printed = compile_models(module, device)
        _last["compile"] = "true: " + printed.removeprefix("train.compile: ")
        return printed
    if setting == "auto" and (device.type != "cpu" or cpp_compiler()):
        compile_kl_rows()
        note = "auto: the vocabulary KL's row kernel (TorchInductor)"
    else:
        compile_kl_rows(on=False)
        note = "auto: nothing (no C++ compiler found)" if setting == "auto" else "false: nothing"
    _last["compile"] = note
    return note


def compile_note() -> str | None:
    """What this process last compiled for a stage (`apply_compile`), for a run's report; None before any."""
    return _last.get("compile")


def compile_models(module: nn.Module, device: torch.device) -> str:
    """Compile the encoders of the pre-trained models `module` holds (its student, a trainable teacher) and of the
    teacher it runs online (`module.teacher`), and the KL's row kernel; returns what was done, for the run's log."""
    if device.type == "cpu" and not cpp_compiler():
        compile_kl_rows(on=False)
        return ("train.compile: no C++ compiler found (install g++ or set CXX); TorchInductor cannot compile on the "
                "CPU, so the models run uncompiled")
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # a graph that cannot compile runs eagerly, with a warning
    models = [child for child in module.children() if isinstance(child, PreTrainedModel)]
    teacher = getattr(module, "teacher", None)
    if isinstance(teacher, PreTrainedModel) and all(teacher is not model for model in models):
        models.append(teacher)
    for model in models:
        encoder_of(model).compile()
    compile_kl_rows()
    names = ", ".join(type(model).__name__ for model in models)
    return (f"train.compile: compiled the encoders of {names} and the vocabulary KL's row kernel (the first steps "
            "include the compile)")


_last: dict[str, str] = {}


def cpp_compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")
