"""The batch every training stage hands the engine, and the engine hands the module: one typed record.

- `inputs`: the student's model inputs (`input_ids`, `attention_mask`, `token_type_ids` where the tokenizer makes
  them);
- `labels`: gold labels or MLM targets (-100 where a position has none), or None;
- `masks`: named position sets the data marked — `kd` (where task KD's teacher term counts: each word's first
  sub-word that has a teacher), `cls` (examples whose cached teacher [CLS] states exist: PatientKD), `new_tokens`
  (VE-KD's expanded vocabulary);
- `alignment`: across tokenizers, each side's unit id per token and the units' masks (`UnitIds`);
- `teachers`: one payload per teacher (`teacher` is the first) — its own inputs (across tokenizers, VE-KD) or its
  cached outputs — read only by the teacher signal that attached it (`biodistil.teachers.signal`, which knows its
  index), under names without a "teacher_" prefix.

Collators build it (`AsBatch` wraps a collate function that pads a dict of model inputs and labels); `to(device)`
moves every tensor; `pin_memory()` lets a CUDA data loader pin it.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class UnitIds:
    """Across tokenizers: `student_units` [B, L_S] and `teacher_units` [B, L_T] (the unit of each token, -1 for
    none), `unit_mask` [B, W] (the units each text has), `word_mask` [B, W] (those that are words, not the [CLS]/[SEP]
    sequence units) and, once masked, `chosen` [B, W] (the words masked on both sides)."""

    student_units: torch.Tensor
    teacher_units: torch.Tensor
    unit_mask: torch.Tensor
    word_mask: torch.Tensor
    chosen: torch.Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "UnitIds":
        return UnitIds(*(None if value is None else value.to(device, non_blocking=non_blocking)
                         for value in (getattr(self, f.name) for f in fields(self))))

    def pin_memory(self) -> "UnitIds":
        return UnitIds(*(None if value is None else value.pin_memory()
                         for value in (getattr(self, f.name) for f in fields(self))))


@dataclass
class Batch:
    """One batch (module docstring)."""

    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor | None = None
    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    alignment: UnitIds | None = None
    teachers: list[dict[str, torch.Tensor]] = field(default_factory=lambda: [{}])

    @classmethod
    def of(cls, collated: dict[str, torch.Tensor], **parts: Any) -> "Batch":
        """A batch from a padded dict: its model inputs and `labels` (other keys are not the engine's)."""
        inputs = {key: collated[key] for key in MODEL_INPUTS if key in collated}
        return cls(inputs, collated.get("labels"), **parts)

    @property
    def teacher(self) -> dict[str, torch.Tensor]:
        """The first (or only) teacher's payload."""
        return self.teachers[0]

    def payload(self, index: int) -> dict[str, torch.Tensor]:
        """Payload `index`, made empty when no signal attached one yet."""
        while len(self.teachers) <= index:
            self.teachers.append({})
        return self.teachers[index]

    @property
    def input_ids(self) -> torch.Tensor:
        return self.inputs["input_ids"]

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.inputs["attention_mask"]

    def teacher_inputs(self, index: int = 0) -> dict[str, torch.Tensor]:
        """The model inputs the teacher of payload `index` reads: its own tokenization when the payload has one (an
        `attention_mask`: across tokenizers), else the student's positions with the payload's `input_ids` (VE-KD) or
        the student's."""
        payload = self.payload(index)
        own = {key: payload[key] for key in MODEL_INPUTS if key in payload}
        return own if "attention_mask" in own else {**self.inputs, **own}

    def replace(self, **changes: Any) -> "Batch":
        return replace(self, **changes)

    def to(self, device: torch.device | str, non_blocking: bool = True) -> "Batch":
        return self._map(lambda tensor: tensor.to(device, non_blocking=non_blocking),
                         lambda units: units.to(device, non_blocking))

    def pin_memory(self) -> "Batch":
        return self._map(torch.Tensor.pin_memory, UnitIds.pin_memory)

    def _map(self, tensor: Callable[[torch.Tensor], torch.Tensor],
             units: Callable[[UnitIds], UnitIds]) -> "Batch":
        return Batch({key: tensor(value) for key, value in self.inputs.items()},
                     None if self.labels is None else tensor(self.labels),
                     {key: tensor(value) for key, value in self.masks.items()},
                     None if self.alignment is None else units(self.alignment),
                     [{key: tensor(value) for key, value in payload.items()} for payload in self.teachers])


@dataclass(frozen=True)
class AsBatch:
    """A collate function that pads a dict of model inputs and labels, returning a `Batch`."""

    collate: Callable[[list[Any]], dict[str, torch.Tensor]]

    def __call__(self, items: list[Any]) -> Batch:
        return Batch.of(self.collate(items))
