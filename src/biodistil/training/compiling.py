"""`train.compile`: the models a stage runs, compiled with torch.compile (TorchInductor) in place.

The encoders are compiled (`nn.Module.compile`, so parameter names, checkpoints and exported weights do not change),
and the row function of the vocabulary KL (`losses.distillation.compile_kl_rows`: its log-softmaxes, KL and gradient
fused into one kernel); the rest of the losses, with their hand-written fused gradients, stay eager. Inductor needs
a C++ compiler on the CPU: without one, or where a graph cannot be compiled, the stage says so and runs uncompiled
(dynamo falls back to eager per graph: `suppress_errors`).
"""

import os
import shutil

import torch
from torch import nn
from transformers import PreTrainedModel

from biodistil.losses.distillation import compile_kl_rows
from biodistil.models.families import encoder_of


def compile_models(module: nn.Module, device: torch.device) -> str:
    """Compile the encoders of the pre-trained models `module` holds (its student, a trainable teacher) and of the
    teacher it runs online (`module.teacher`); returns what was done, for the run's log."""
    if device.type == "cpu" and not _cpp_compiler():
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


def compile_kernels(device: torch.device) -> str | None:
    """`train.compile: auto`: the vocabulary KL's row kernel compiled where TorchInductor can compile (a C++ compiler
    on the CPU); what was done, or None where nothing could be."""
    if device.type == "cpu" and not _cpp_compiler():
        return None
    compile_kl_rows()
    return "train.compile auto: the vocabulary KL's row kernel is compiled (TorchInductor; the first steps include it)"


def _cpp_compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")
