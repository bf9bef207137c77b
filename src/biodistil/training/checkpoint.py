"""Checkpoints that hold everything needed to continue a run exactly, written atomically as safetensors + JSON.

Layout of `checkpoints/step-000100/`: trainable.safetensors (student and extra trainable modules such as
projections), optimizer.safetensors + optimizer.json (and optimizer-NAME.* for each extra optimizer, such as a
pre-step's), scheduler.json, rng.safetensors (torch CPU/CUDA states
of every process), trainer_state.json (step, data position, Python/NumPy RNG). Nothing is unpickled.
"""

import json
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class TrainerState:
    """Where the run is: optimizer steps done and the position in the data stream."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    micro_step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0  # the training time of every segment up to this checkpoint (resumes add theirs)
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step:07d}"


class DamagedCheckpoint(BiodistilError):
    """A checkpoint whose files cannot be read (truncated, corrupted): an older one may still serve."""


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of a run folder, newest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    complete = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "trainer_state.json").is_file()]
    return sorted(complete, key=lambda p: int(_STEP_DIR.match(p.name).group(1)), reverse=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    return next(iter(complete_checkpoints(run_dir)), None)


def save_checkpoint(target: Path, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    state: TrainerState, rng_states: list[dict[str, torch.Tensor]],
                    extra_optimizers: dict[str, torch.optim.Optimizer] | None = None) -> None:
    """Write one checkpoint folder atomically (main process only); `extra_optimizers` go to optimizer-NAME.*."""

    def fill(folder: Path) -> None:
        save_model(module, str(folder / "trainable.safetensors"))
        _save_optimizer(optimizer, folder)
        for name, extra in (extra_optimizers or {}).items():
            _save_optimizer(extra, folder, f"optimizer-{name}")
        (folder / "scheduler.json").write_text(json.dumps(scheduler.state_dict()))
        tensors = {f"rank{r}.{k}": v.contiguous() for r, states in enumerate(rng_states) for k, v in states.items()}
        save_file(tensors, str(folder / "rng.safetensors"))
        host_rng = {"python": _jsonable(random.getstate()), "numpy": _jsonable(np.random.get_state())}
        payload = {"state": asdict(state), "host_rng": host_rng}
        (folder / "trainer_state.json").write_text(json.dumps(payload))

    atomic_directory(target, fill)


def load_checkpoint(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int,
                    extra_optimizers: dict[str, torch.optim.Optimizer] | None = None) -> TrainerState:
    """Restore module, optimizers, scheduler and this process's RNG states; return the trainer state. A file that
    cannot be read is a `DamagedCheckpoint` (every part is loaded again from an older checkpoint, if one serves)."""
    try:
        return _load_checkpoint(folder, module, optimizer, scheduler, rank, extra_optimizers)
    except (OSError, ValueError, KeyError, SafetensorError) as err:  # json.JSONDecodeError is a ValueError
        raise DamagedCheckpoint(f"Checkpoint {folder} cannot be read ({type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''})") from None


def _load_checkpoint(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int,
                     extra_optimizers: dict[str, torch.optim.Optimizer] | None) -> TrainerState:
    missing, unexpected = load_model(module, str(folder / "trainable.safetensors"), strict=False)
    if missing or unexpected:
        raise BiodistilError(f"Checkpoint {folder} does not match this run's modules (missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}); was the recipe changed since it was written?")
    _load_optimizer(optimizer, folder)
    for name, extra in (extra_optimizers or {}).items():
        _load_optimizer(extra, folder, f"optimizer-{name}")
    scheduler.load_state_dict(json.loads((folder / "scheduler.json").read_text()))
    payload = json.loads((folder / "trainer_state.json").read_text())
    random.setstate(_tuples(payload["host_rng"]["python"]))
    numpy_state = payload["host_rng"]["numpy"]
    np.random.set_state((numpy_state[0], np.array(numpy_state[1], dtype=np.uint32), *numpy_state[2:]))
    _restore_torch_rng(load_file(str(folder / "rng.safetensors")), rank)
    return TrainerState(**payload["state"])


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    root = Path(run_dir) / "checkpoints"
    steps = sorted((p for p in root.iterdir() if _STEP_DIR.match(p.name)), key=lambda p: p.name)
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def capture_torch_rng() -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _restore_torch_rng(tensors: dict[str, torch.Tensor], rank: int) -> None:
    prefix = f"rank{rank}."
    if prefix + "cpu" not in tensors:
        raise BiodistilError(f"Checkpoint has no RNG state for process {rank}; resume with the same process count")
    torch.set_rng_state(tensors[prefix + "cpu"])
    if prefix + "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors[prefix + "cuda"])


def _save_optimizer(optimizer: torch.optim.Optimizer, folder: Path, stem: str = "optimizer") -> None:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, per_param in state["state"].items():
        for name, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value.contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    save_file(tensors, str(folder / f"{stem}.safetensors"))
    (folder / f"{stem}.json").write_text(json.dumps({"param_groups": state["param_groups"], "scalars": scalars}))


def _load_optimizer(optimizer: torch.optim.Optimizer, folder: Path, stem: str = "optimizer") -> None:
    if not (folder / f"{stem}.json").is_file():
        raise BiodistilError(f"Checkpoint {folder} has no {stem}.json; was the recipe changed since it was written?")
    meta = json.loads((folder / f"{stem}.json").read_text())
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in load_file(str(folder / f"{stem}.safetensors")).items():
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": per_param, "param_groups": meta["param_groups"]})


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
