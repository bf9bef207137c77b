"""Model size: parameter counts with and without embeddings."""

from torch import nn


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total parameters (shared tensors counted once) and those outside embedding tables."""
    seen: set[int] = set()
    total = embeddings = 0
    embedding_params = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel()
        if id(param) in embedding_params:
            embeddings += param.numel()
    return {"total": total, "non_embedding": total - embeddings}
