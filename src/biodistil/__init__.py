"""biodistil: knowledge distillation of biomedical language models."""

__version__ = "0.1.0"
