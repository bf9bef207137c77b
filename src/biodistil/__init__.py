"""biodistil: knowledge distillation of biomedical language models.

The package's front stands above every layer (`docs/architecture.md`): it exposes `Predictor` (`export.predict`),
imported when first asked for so that `import biodistil` does not import torch, and no module of the package imports
it (`tests/test_layering.py`).
"""

from biodistil.version import __version__

__all__ = ["Predictor", "__version__"]


def __getattr__(name: str):
    if name == "Predictor":
        from biodistil.export.predict import Predictor

        return Predictor
    raise AttributeError(f"module 'biodistil' has no attribute {name!r}")
