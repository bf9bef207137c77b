"""Model selection on the dev split and the final scores on the test split, written once for fine-tuning
(`finetune_on_task`: `finetune`, `evaluate`, studies, the quick demo) and task-specific distillation (`kd`).

A `ScoringSplit` is a labelled split encoded once and scored as often as asked with the task's official metric;
`select_on_dev` gives the engine what it needs to keep the best weights on dev; `write_test_results` writes the
test predictions of a finished run and the warnings that belong beside its scores; `write_dev_predictions` the
final model's dev predictions (a study's shares of the teacher on dev beside test).

Under several processes training together (DDP), the dev split is scored once, on the main process, and its scores
handed to the others (`computed_on_main`): every process selects the same weights, as one process would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn
from transformers import PreTrainedTokenizerBase

from biodistil.config import TrainConfig
from biodistil.data.formats import Example
from biodistil.io import atomic_write_jsonl
from biodistil.tasks.encoding import EncodedSplit, FeatureCollator, collator_for, encode_split
from biodistil.tasks.prediction import Predictions, degenerate, predict, prediction_notes, scored_rows
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import Scored, score, span_task_record
from biodistil.training.engine import Selection
from biodistil.training.processes import computed_on_main

EvaluateFn = Callable[[nn.Module], dict[str, float]]
TEST_PREDICTIONS = "test_predictions.jsonl"
DEV_PREDICTIONS = "dev_predictions.jsonl"  # the final model's, beside the test ones: a share on dev as on test
SPAN_RECORD = ("entity_alignment", "character", "character_f1", "character_note")  # a span task's extra record keys


@dataclass(frozen=True)
class ScoringSplit:
    """A labelled split of a task, encoded once: scored as often as asked (dev during training, test at the end)."""

    task: TaskSpec
    examples: Sequence[Example]
    encoded: EncodedSplit
    collate: FeatureCollator

    @classmethod
    def encode(cls, task: TaskSpec, examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase,
               whole_entities: bool = False) -> ScoringSplit:
        """`whole_entities`: a long sentence's windows never cut a gold entity (training data only: scored splits
        are cut as predictions are, without looking at their tags)."""
        encoded = encode_split(task, examples, tokenizer, whole_entities)
        return cls(task, examples, encoded, collator_for(task, tokenizer))

    def scored(self, model: Any, batch_size: int) -> Scored:
        """`model`'s predictions on the split and their scores with the task's official metric."""
        predictions = predict(model, self.task, self.examples, self.encoded, self.collate, batch_size)
        return Scored(score(self.task, self.examples, predictions), predictions, self.encoded.truncated_examples)


class DevSelection(NamedTuple):
    """What the engine selects with: the function that scores the dev split and the selection rule (both None
    without a dev split), and the train settings (dev scored every `eval_every` steps)."""

    evaluate_fn: EvaluateFn | None
    selection: Selection | None
    cfg: TrainConfig


def examples_per_step(cfg: TrainConfig, processes: int = 1) -> int:
    """The global batch: examples per optimizer step over `processes` processes training together."""
    return cfg.batch_size * cfg.grad_accumulation * processes


def select_on_dev(dev: ScoringSplit | None, cfg: TrainConfig, num_features: int,
                  classifier: Callable[[Any], Any], metric: str | None = None,
                  patience: int | None = None, processes: int = 1) -> DevSelection:
    """Keep the weights that score best on `dev` with the task metric (`metric`, default the task's headline),
    stopping after `patience` evaluations without gain; `eval_every: 0` becomes once per epoch of `num_features`
    (at the global batch of `processes` processes). `classifier` finds the classifier in the module the engine
    trains. The dev split is scored on the main process only (see the module docstring)."""
    if dev is None:
        return DevSelection(None, None, cfg)
    if cfg.eval_every == 0:
        cfg = cfg.model_copy(update={"eval_every": max(1, num_features // examples_per_step(cfg, processes))})
    batch_size = cfg.batch_size * 2

    def evaluate_fn(module: nn.Module) -> dict[str, float]:
        return computed_on_main(lambda: dev.scored(classifier(module), batch_size).scores)

    return DevSelection(evaluate_fn, Selection(metric=metric or dev.task.headline_key, mode="max", patience=patience),
                        cfg)


def write_test_results(run_dir: Path, task: TaskSpec, test: Sequence[Example], predictions: Predictions,
                       truncated: dict[str, int], markers_cut: dict[str, int] | None = None,
                       data_root: Any = None, fold: int | None = None) -> dict[str, Any]:
    """Write `<run>/test_predictions.jsonl`, print the notes on the scores (truncation, words without prediction,
    degenerate predictions) as warnings; returns the record's `degenerate` and `notes`, and for a span task what
    became of its gold entities and its character-level scores (`span_task_record`, printed too)."""
    atomic_write_jsonl(run_dir / TEST_PREDICTIONS, scored_rows(test, predictions))
    words = sum(len(e.tokens) for e in test) if task.kind == "token_classification" else None
    notes = prediction_notes(task, predictions, truncated, words, markers_cut)
    for note in notes:
        print(f"Warning: {note}", file=sys.stderr, flush=True)
    written: dict[str, Any] = {"degenerate": degenerate(task, predictions), "notes": notes}
    if task.is_span_task:
        written.update(span_task_record(task, test, predictions.labels, "test", data_root, fold))
        print_span_record(written)
    return written


def write_dev_predictions(run_dir: Path, dev: Sequence[Example], predictions: Predictions | None) -> None:
    """Write `<run>/dev_predictions.jsonl`: the final (selected) model's predictions on the dev split, if it has one."""
    if predictions is not None and dev:
        atomic_write_jsonl(run_dir / DEV_PREDICTIONS, scored_rows(dev, predictions))


def print_span_record(record: dict[str, Any]) -> None:
    """The gold entities' counts per split and the character-level scores, on stderr."""
    from biodistil.documents.scoring import score_table

    for split, counts in record.get("entity_alignment", {}).items():
        reasons = ", ".join(f"{r} {n}" for r, n in counts["by_reason"].items() if not r.startswith("kept"))
        print(f"Gold entities ({split}): {counts['entities']:,}: {counts['kept']:,} kept exactly, {counts['changed']:,}"
              f" changed, {counts['dropped']:,} dropped{f' ({reasons})' if reasons else ''}", file=sys.stderr)
    if "character" in record:
        print("Character-level entity scores (original documents):\n" + score_table(record["character"]),
              file=sys.stderr, flush=True)
    elif "character_note" in record:
        print(f"Note: {record['character_note']}", file=sys.stderr, flush=True)
