"""The vocabulary logit rows of one model for one batch: where they are, what stands for them, who forms them.

A model's logits are wanted only at some positions (`positions`, [B, L] bool: the union of the positions of the
terms that read them), one row per True entry in row-major order. Four things stand for the logits there:

- a tensor [N, V]: the logits themselves (a classifier's outputs, a teacher's formed logits);
- `TopKLogits`: a teacher cache's top-k logits, their ids and the log-normaliser (no whole rows exist);
- `LinearRows`: a masked LM's MLM head up to its decoder, z = x·Wᵀ + b, whose [N, V] logits are formed only where
  a loss asks for them;
- a `RowSource` (`losses.distillation`): rows that form themselves on demand, likewise, at the objective's
  temperature.

`LogitRows` owns them. `at(mask)` restricts them to some of the rows (no copy when the mask is `positions`);
`logits()` forms the logits of a head, once per set of rows (memoised here, shared by the views `at` returns);
`soft_kl(teacher, T)` is the distillation KL on them, choosing the loss by what stands for the two sides.

Who forms what is declared before the terms run: the objective gives the rows at which its terms read the student's
formed logits (`planned`: the MLM targets, soft CE, logit MSE, a KL that cannot form its logits itself) and a KL on a
student head reads those rows' formed logits and forms every other row inside `linear_soft_kl_loss`, a chunk at a
time. What is computed therefore depends on the recipe's terms, never on their order.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from biodistil.errors import BiodistilError
from biodistil.losses.distillation import (
    KLRows,
    Linear,
    RowSource,
    Teacher,
    linear_soft_kl_loss,
    soft_kl_loss,
    topk_kl_loss,
)


@dataclass(frozen=True)
class LinearRows:
    """Logit rows given as the input of the linear layer that makes them, z = x·Wᵀ + b: rows x [N, d], weight W
    [V, d], bias b [V] (an MLM head's decoder). The fused KL forms the logits a chunk of rows at a time, so an
    [N, V] tensor never exists whole."""

    inputs: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def logits(self) -> torch.Tensor:
        """z = x·Wᵀ + b, [N, V]."""
        return F.linear(self.inputs, self.weight, self.bias)

    def select(self, rows: torch.Tensor) -> "LinearRows":
        return LinearRows(self.inputs[rows], self.weight, self.bias)

    @property
    def linear(self) -> Linear:
        """(x, W, b) as the losses take them."""
        return self.inputs, self.weight, self.bias


@dataclass
class TopKLogits:
    """A teacher's vocabulary distribution at N positions, as a teacher cache keeps it: the logits of its k most
    probable tokens minus the row's largest logit, their ids, the log-normaliser log Σ_j exp((z_j − max z) / T)
    over the whole vocabulary at the cache's temperature T, and optionally m tokens drawn from the rest of its
    tempered distribution with their logits (see `biodistil.losses.distillation.topk_kl_loss`)."""

    values: torch.Tensor  # [N, k]
    ids: torch.Tensor  # [N, k]
    log_norm: torch.Tensor  # [N]
    temperature: float
    tail_values: torch.Tensor | None = None  # [N, m] logits (same shift) of m draws from the teacher's tail
    tail_ids: torch.Tensor | None = None  # [N, m]

    def __getitem__(self, rows: torch.Tensor) -> "TopKLogits":
        tail = (None, None) if self.tail_ids is None else (self.tail_values[rows], self.tail_ids[rows])
        return TopKLogits(self.values[rows], self.ids[rows], self.log_norm[rows], self.temperature, *tail)


LogitSource = torch.Tensor | TopKLogits | LinearRows | RowSource


@dataclass(frozen=True)
class _Root:
    """What a `LogitRows` and its views share: the rows at `positions`, the rows declared to be read formed, and
    the logits formed from a head so far, (mask, logits) per set of rows (a `planned` copy shares them)."""

    positions: torch.Tensor
    source: LogitSource
    formed: tuple[torch.Tensor, ...] = ()
    memo: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list, repr=False)

    def restricted(self, mask: torch.Tensor) -> LogitSource:
        """The source at `mask`'s rows (itself when `mask` is `positions`: no copy)."""
        if mask is self.positions:
            return self.source
        rows = mask[self.positions]
        return self.source.select(rows) if isinstance(self.source, LinearRows | RowSource) else self.source[rows]

    def formed_at(self, mask: torch.Tensor) -> torch.Tensor:
        """The head's logits at `mask`'s rows, formed the first time they are asked for."""
        logits = next((logits for known, logits in self.memo if known is mask), None)
        if logits is None:
            logits = self.restricted(mask).logits()
            self.memo.append((mask, logits))
        return logits


class LogitRows:
    """The logit rows of one model for one batch at `positions` ([B, L] bool, row-major rows) and what stands for
    them (`source`: a logits tensor [N, V], a cache's `TopKLogits` or a head's `LinearRows`); `formed`: the masks
    whose rows the terms read as formed logits (see the module docstring)."""

    def __init__(self, positions: torch.Tensor, source: LogitSource, formed: Sequence[torch.Tensor] = ()):
        self._root = _Root(positions, source, tuple(formed))
        self.positions = positions

    @classmethod
    def _view(cls, root: _Root, mask: torch.Tensor) -> "LogitRows":
        rows = cls.__new__(cls)
        rows._root, rows.positions = root, mask
        return rows

    @property
    def source(self) -> LogitSource:
        """What stands for the logits at every computed row (not only this view's)."""
        return self._root.source

    @property
    def rows(self) -> LogitSource:
        """What stands for the logits at these rows: a tensor, `TopKLogits` or `LinearRows`."""
        return self._root.restricted(self.positions)

    def at(self, mask: torch.Tensor) -> "LogitRows":
        """These logit rows at the True entries of `mask` [B, L], which must lie within the computed positions;
        `mask` itself when it is them. Nothing is copied until the rows are read."""
        return self if mask is self.positions else LogitRows._view(self._root, mask)

    def planned(self, formed: Sequence[torch.Tensor]) -> "LogitRows":
        """These rows with `formed` declared: the masks at which terms will read the formed logits. A KL on a head
        reads those rows' logits rather than form them again (`soft_kl`); the memo of formed logits is shared."""
        return LogitRows._view(dataclasses.replace(self._root, formed=tuple(formed)), self.positions)

    def logits(self) -> torch.Tensor:
        """z [N, V] at these rows: the logits given, or formed from the head (once per set of rows)."""
        source = self._root.source
        if isinstance(source, TopKLogits):
            raise TypeError("a teacher cache's top-k logits are not whole logit rows")
        if isinstance(source, LinearRows | RowSource):
            return self._root.formed_at(self.positions)
        return self.rows

    def logits_at(self, subset: torch.Tensor) -> torch.Tensor:
        """z at the rows of `subset` [B, L] (within these rows), read from these rows' formed logits (`logits()`:
        formed once and shared with the terms that read them all), in row-major order. Across tokenizers the
        logit terms read the first token of each masked word so, out of the logits the MLM forms at every target."""
        return self.logits()[subset[self.positions]]

    def fuses_kl(self, teacher: "LogitRows", vocab: int | None = None) -> bool:
        """Whether the KL against `teacher` forms these rows' logits inside the loss: a student head, whole
        vocabularies (no shared prefix `vocab`) and a teacher's logits or head (not a cache's top-k)."""
        return (vocab is None and isinstance(self.source, LinearRows)
                and not isinstance(teacher.source, TopKLogits))

    def soft_kl(self, teacher: "LogitRows", temperature: float, vocab: int | None = None,
                kernel: KLRows | None = None) -> torch.Tensor:
        """T²·(1/N)·Σ_rows KL(softmax(z_T/T) ‖ softmax(z_S/T)) over these N rows (the student's) and `teacher`'s
        at the same positions; with `vocab`, over the first `vocab` columns only (VE-KD's shared vocabulary).

        The loss follows what stands for the logits: a cache's top-k → `topk_kl_loss` (the student's whole
        vocabulary); logits, or a shared prefix → `soft_kl_loss`; a student head → `soft_kl_loss` on the formed
        logits at the rows declared formed, `linear_soft_kl_loss` (logits formed a chunk at a time) at the others,
        and the mean over all rows. A teacher head is formed a chunk at a time inside either loss. `kernel`: the fused
        row kernel the losses use (`losses.distillation.compiled_kl_rows`), or None for eager rows.
        """
        if isinstance(teacher.source, TopKLogits):
            return _topk_kl(self.logits(), teacher.rows, temperature)
        if not self.fuses_kl(teacher, vocab):
            return soft_kl_loss(_prefix(self.logits(), vocab), _prefix(teacher.logits(), vocab), temperature, kernel)
        formed, logits, rest = self._split()
        plain = None if formed is None else soft_kl_loss(logits, teacher.at(formed)._operand(), temperature, kernel)
        if rest is None:
            return plain
        fused = linear_soft_kl_loss(*self.at(rest).rows.linear, teacher.at(rest)._operand(), temperature, kernel)
        if formed is None:
            return fused
        counts = formed.sum(), rest.sum()
        return (counts[0] * plain + counts[1] * fused) / (counts[0] + counts[1]).clamp(min=1)

    def _split(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(formed, their logits, rest): these rows split into those within the first mask declared formed, with
        the logits formed there, and the others; None for a part empty by construction. When these rows hold every
        row of the declared mask, that mask itself is the formed part (its logits are read without a copy)."""
        declared = self._root.formed
        if any(self.positions is mask for mask in declared):
            return self.positions, self.logits(), None
        if not declared:
            return None, None, self.positions
        first = declared[0]
        part, logits = self.positions & first, self.at(first).logits()
        if torch.equal(part, first):
            part = first
        else:
            logits = logits[part[first]]
        return part, logits, self.positions & ~first

    def _operand(self) -> Teacher:
        """These rows as a KL's teacher: a head's (x, W, b) or a `RowSource`, formed a chunk at a time inside the loss,
        else logits."""
        source = self.rows
        if isinstance(source, RowSource):
            return source
        return source.linear if isinstance(source, LinearRows) else self.logits()


def _prefix(logits: torch.Tensor, vocab: int | None) -> torch.Tensor:
    return logits if vocab is None else logits[:, :vocab]


def _topk_kl(student: torch.Tensor, teacher: TopKLogits, temperature: float) -> torch.Tensor:
    """`topk_kl_loss` of the student's logits against a cache's top-k, built at the objective's temperature."""
    if teacher.temperature != temperature:
        raise BiodistilError(f"The teacher cache was built for temperature {teacher.temperature}, the objective uses "
                             f"{temperature}")
    return topk_kl_loss(student, teacher.values, teacher.ids, teacher.log_norm, temperature, teacher.tail_values,
                        teacher.tail_ids)
