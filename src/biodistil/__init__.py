"""biodistil: knowledge distillation of biomedical language models."""

__version__ = "0.1.0"


def __getattr__(name: str):  # `from biodistil import Predictor` without importing torch for `import biodistil`
    if name == "Predictor":
        from biodistil.export.predict import Predictor

        return Predictor
    raise AttributeError(f"module 'biodistil' has no attribute {name!r}")
