"""The order in which an epoch visits the training examples."""

from collections.abc import Sequence

import torch


def length_grouped_order(lengths: Sequence[int], batch: int, generator: torch.Generator,
                         megabatch: int = 50) -> torch.Tensor:
    """A permutation of the examples whose consecutive runs of `batch` have similar lengths.

    A random permutation is cut into mega-batches of `megabatch`·batch examples; each is sorted by length
    (longest first) and cut into batches; the full batches are shuffled, any partial ones go last (the engine
    drops an epoch's incomplete final batch). Batches stay random in content and order, but pad little: on
    sentence-level tasks such as NCBI-disease, padding falls from about 55% of a batch of 32 to about 5%. The
    order is a function of `generator` alone, so a resumed run sees the same batches.
    """
    sizes = torch.as_tensor(list(lengths))
    permutation = torch.randperm(len(sizes), generator=generator)
    batches: list[torch.Tensor] = []
    for chunk in permutation.split(batch * megabatch):
        ranked = chunk[torch.argsort(sizes[chunk], descending=True, stable=True)]
        batches.extend(ranked.split(batch))
    full = [b for b in batches if len(b) == batch]
    partial = [b for b in batches if len(b) < batch]
    shuffled = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
    return torch.cat(shuffled + partial) if batches else permutation
