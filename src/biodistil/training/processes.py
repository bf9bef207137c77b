"""The processes of one launch (`accelerate launch`, `torchrun`) and the two ways a command uses them.

* **Together (DDP)**: `pretrain`, `distill`, `kd`, `finetune`. Every process trains the same model on its slice of
  each global batch through the engine (Accelerate's process group: gloo on CPU, NCCL on GPUs); what must happen
  once (`finetune`'s and `kd`'s dev selection and test scores) runs on the main process and its result is handed to
  the others (`computed_on_main`), so every process holds the same outcome.
* **Cells**: `evaluate` and `study`. Their runs are independent: `Launch.share` assigns each to one process (a static
  assignment by expected cost, `assign`), which trains it alone on its own device. `Launch.current()` takes the
  process out of the launch for the rest of its life: no process group is made, and the environment then describes
  a launch of one process on this process's device (`ACCELERATE_TORCH_DEVICE`), so Accelerate, the engine and
  Hugging Face (whose `save_pretrained` writes nothing on a rank other than 0 of a process group) all see one
  process, as in a run of its own. The processes meet only in the launch's rendezvous store (`Launch.wait`,
  `Launch.from_main`), which waits as long as other processes' cells take (up to WAIT_TIMEOUT) without holding a
  GPU. Each cell's folder is written by its owner alone; what collects them, by the main process after a wait.

Outside a launch (`WORLD_SIZE` unset or 1) everything here runs in the one process.
"""

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch

from biodistil.errors import BiodistilError

T = TypeVar("T")

WAIT_TIMEOUT = timedelta(days=7)  # how long a process waits for the others' cells
_PREFIX = "biodistil/cells/"  # of the keys in the launch's store (torchrun's agent keeps its own there)
# What a process taken out of its launch reads in its environment: a launch of one (None: unset).
_ONE_PROCESS_ENV: dict[str, str | None] = {
    "WORLD_SIZE": "1", "RANK": "0", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": None, "PMI_SIZE": None,
    "OMPI_COMM_WORLD_SIZE": None, "MV2_COMM_WORLD_SIZE": None, "ACCELERATE_USE_DEEPSPEED": None,
    "ACCELERATE_USE_FSDP": None,
}
_CURRENT: list["Launch"] = []  # this process's launch, once taken out of it


def launched_processes() -> int:
    """How many processes the launch that started this one has (1 outside `accelerate launch` / `torchrun`, and in
    a process that `Launch.current` took out of its launch)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


@dataclass
class Launch:
    """This process's place in its launch, `index` of `count` processes (0 of 1 outside a launch), and the store
    the processes meet in."""

    index: int = 0
    count: int = 1
    store: Any = None
    _meetings: int = field(default=0, repr=False)

    @classmethod
    def current(cls) -> "Launch":
        """The launch of this process. Under several processes, the first call joins the launch's rendezvous store
        and takes the process out of the launch (see the module docstring); later calls return the same launch."""
        if _CURRENT:
            return _CURRENT[0]
        if launched_processes() == 1:
            return cls()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise BiodistilError(
                "evaluate and study share their runs out over the processes of a launch, each run alone on its "
                "process, so they start the launch: here an earlier stage already trained these processes together "
                "(DDP). Launch the evaluation or study on its own")
        store, index, count = next(torch.distributed.rendezvous("env://"))  # its default time-out to connect
        _alone_on(_device(int(os.environ.get("LOCAL_RANK", "0") or 0)))
        _CURRENT.append(cls(index, count, torch.distributed.PrefixStore(_PREFIX, store)))
        return _CURRENT[0]

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def wait(self) -> None:
        """Return when every process of the launch has got here, however long the others take (up to
        WAIT_TIMEOUT). A process that fails instead ends the launch (torchrun stops the others)."""
        if self.count == 1:
            return
        key = self._next_key("wait")
        self.store.set(f"{key}/{self.index}", b"here")
        self.store.wait([f"{key}/{index}" for index in range(self.count)], WAIT_TIMEOUT)

    def from_main(self, compute: Callable[[], T]) -> T:
        """`compute()` run on the main process; its result (JSON: lists, numbers, strings) on every process."""
        if self.count == 1:
            return compute()
        key = self._next_key("main")
        if self.is_main:
            value = compute()
            self.store.set(key, json.dumps(value))
            return value
        self.store.wait([key], WAIT_TIMEOUT)
        return json.loads(self.store.get(key))

    @contextmanager
    def main_first(self) -> Iterator[None]:
        """The block runs on the main process first (it writes what the others then read), then on the others."""
        if not self.is_main:
            self.wait()
        yield
        if self.is_main:
            self.wait()

    def share(self, costs: Sequence[float]) -> list[int]:
        """The positions of the items (expected costs `costs`, the same list on every process) this process runs."""
        return [position for position, owner in enumerate(assign(costs, self.count)) if owner == self.index]

    def _next_key(self, kind: str) -> str:
        """The key of the next meeting: every process meets the others in the same order, so the n-th is the same."""
        self._meetings += 1
        return f"{kind}-{self._meetings}"


def assign(costs: Sequence[float], processes: int) -> list[int]:
    """The process of each item: the most expensive first, each to the process with the least expected work so far
    (the lower index on ties): longest-processing-time first. With equal costs, item i goes to process i mod P."""
    loads = [0.0] * processes
    owners = [0] * len(costs)
    for item in sorted(range(len(costs)), key=lambda i: -costs[i]):  # stable: plan order among equal costs
        owner = min(range(processes), key=loads.__getitem__)
        owners[item] = owner
        loads[owner] += costs[item]
    return owners


def is_main_process() -> bool:
    """Whether this is the main process of its launch (the one that prints what a command returns)."""
    return _CURRENT[0].is_main if _CURRENT else os.environ.get("RANK", "0") == "0"


def computed_on_main(compute: Callable[[], T]) -> T:
    """`compute()` on the main process of the processes training together now (DDP), its result handed to the
    others (which wait for it); in one process simply `compute()`."""
    if launched_processes() == 1:
        return compute()
    from accelerate.state import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState()
    if state.num_processes == 1:
        return compute()
    box = [compute() if state.is_main_process else None]
    broadcast_object_list(box)
    return box[0]


def _device(local_rank: int) -> str:
    """The device of the process of `local_rank` on its machine: its GPU (one per process), else the CPU."""
    if not torch.cuda.is_available():
        return "cpu"
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return f"cuda:{index}"


def _alone_on(device: str) -> None:
    """From now on this process reads, in its environment, a launch of one process on `device`."""
    for name, value in {**_ONE_PROCESS_ENV, "ACCELERATE_TORCH_DEVICE": device}.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
