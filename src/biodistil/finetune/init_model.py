"""The model a task-side run starts from: a model as given, a shallower copy made of some of its layers, or the
same architecture with fresh weights (written once into the run folder). Used by `finetune`, `kd`, studies,
`evaluate` and the demo."""

from pathlib import Path

import torch
from transformers import PreTrainedModel


def init_model_path(name_or_path: str, layers: list[int] | None, run_dir: Path, reinitialise: bool = False,
                    seed: int = 0) -> str:
    """The model a run starts from: `name_or_path`, or with `layers` a shallower copy of its encoder made of those
    layers (0-based; e.g. a student from a teacher's alternate pre-trained layers), and with `reinitialise` the same
    architecture with freshly drawn weights (seeded; a no-pre-training baseline), written once to
    `<run>/init_model` with the tokenizer."""
    if layers is None and not reinitialise:
        return str(name_or_path)
    from biodistil.models.loading import load_encoder, load_tokenizer
    from biodistil.models.saving import export_model
    from biodistil.models.student import student_from_teacher_layers

    target = run_dir / "init_model"
    if not (target / "config.json").is_file():
        with torch.random.fork_rng(devices=[]):  # weights the model lacks (a masked LM's pooler) drawn from `seed`
            torch.manual_seed(seed)
            encoder = load_encoder(name_or_path)
        if layers is not None:
            encoder = student_from_teacher_layers(encoder, layers)
        if reinitialise:
            encoder = _fresh_weights(encoder, seed)
        export_model(encoder, load_tokenizer(name_or_path), target)
    return str(target)


def _fresh_weights(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """The same architecture with the weights its model class draws at initialisation, from `seed`."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    return AutoModel.from_config(model.config)


