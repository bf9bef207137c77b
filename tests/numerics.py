"""Helpers (no tests) for comparing computations that differ in shape, kernel or thread count.

Two computations of the same quantity through different kernels (SDPA vs eager attention, a padded vs a
longer batch, logits at chosen positions vs at every position, 1 vs 2 threads) agree only up to float32
rounding, about 1e-7 relative. So the suite compares them with `CLOSE` (relative and absolute tolerance),
never bit for bit, and only on values far above rounding noise: a student made of its teacher's own
layers gives losses of 1e-6..1e-10, which are rounding noise themselves; `perturbed` moves it away.
"""

import torch

# relative tolerance for rounding differences, absolute floor for values that are legitimately near zero
CLOSE = {"rel": 1e-4, "abs": 1e-6}


def perturbed(model: torch.nn.Module, seed: int, scale: float = 0.2) -> torch.nn.Module:
    """`model` with every parameter moved by scale·N(0, 1) noise from a seeded generator (in place).

    Random tiny BERTs have near-uniform attention and students made of teacher layers nearly match their
    teacher; after this the student differs clearly, so distillation losses are O(0.01..1).
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return model


def free_port() -> int:
    """A TCP port nobody listens on now: each multi-process test gets its own rendezvous port, so that one run's
    port lingering in TIME_WAIT cannot fail the next (torchrun's default is always 29500)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
