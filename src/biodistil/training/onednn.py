"""oneDNN's caches, bounded before the process builds its first primitive.

On a CPU with AMX or avx512_bf16, PyTorch runs bf16 matmuls (and float32 ones too) through oneDNN, which keeps a
compiled primitive with its scratch memory for every shape it has run, up to 1,024 of them, and PyTorch's ideep
layer keeps a second such cache. A distillation step has shapes that change every step (the rows of the masked
positions), so a run's memory grew with every new shape: at BERT-base shapes on a Xeon with AMX (2 cores, 8 x 128
tokens), +530 to +580 MB from step 20 to step ~120 with the default caches, +57 MB with both bounded to 16 entries,
at the same steps per second (docs/methods.md, "Memory over a long run"; docs/results/rss-soak-amx.json). oneDNN
reads the capacity once, when it builds its first primitive, so the bound is set at the start of every command
(`cli.main`) and of every training stage (`training.engine.make_accelerator`, for library use); a value the user
has set is kept. Importing this module does not import torch.
"""

import os

CACHE_CAPACITY = 16
CACHE_SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's own; PyTorch's ideep layer's


def bound_caches() -> dict[str, str]:
    """Set both caches' capacity to CACHE_CAPACITY where the environment does not set it; returns the settings in
    effect. It acts only before oneDNN builds its first primitive in this process."""
    for name in CACHE_SETTINGS:
        os.environ.setdefault(name, str(CACHE_CAPACITY))
    return {name: os.environ[name] for name in CACHE_SETTINGS}
