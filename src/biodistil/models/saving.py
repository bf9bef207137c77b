"""Writing a trained model as a Hugging Face folder: config, safetensors weights and tokenizer."""

from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.io import atomic_directory


def export_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> Path:
    """Save `model` (only the model: projections and other training parts live elsewhere) and its tokenizer."""

    def fill(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)

    atomic_directory(Path(target), fill)
    return Path(target)
