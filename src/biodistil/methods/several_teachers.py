"""Several teachers, written once for `distill` (`methods.objective.Objective`) and `kd` (`kd.objective.KDObjective`):
which teacher each term reads (`expand`: once on the teachers' mixture, or once per teacher k weighted w·λ_k and logged
`<name>@k` and `<name>` = Σ_k λ_k·`<name>@k`), their mixture (`mix`: λ_k, or confidence weights per row: teacher k's
probability of the label the student's own loss reads there, exp(−H) where there is none), the pre-flight table of
teacher × term (`teacher_table`, `render_teacher_table`) and the teachers' own ensemble scored on labelled examples
(`ensemble_test_scores`: the reference a student of several teachers is read against). The options are one
`config.TeachersConfig`; docs/methods.md ("Several teachers") gives the equations.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biodistil.config import TeachersConfig
from biodistil.data.formats import Example
from biodistil.errors import BiodistilError
from biodistil.losses.distillation import Linear
from biodistil.losses.multi_teacher import MixedRows, confidence_weights, mixed_teacher_logits
from biodistil.methods.terms import Term, TermInputs
from biodistil.methods.word_units import WordUnits
from biodistil.models.features import Features
from biodistil.models.logits import LinearRows, LogitRows
from biodistil.tasks.prediction import Predictions
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score
from biodistil.teachers.task_cache import TeacherRequest, cached_teacher_outputs
from biodistil.term_specs import TermSpec


@dataclass(frozen=True)
class Teachers:
    """The teachers as the terms see them: λ_k, which may teach logit terms, and the recipe's `combine`/`confidence`."""

    weights: tuple[float, ...] = (1.0,)
    options: TeachersConfig = field(default_factory=TeachersConfig, hash=False)  # combine, confidence
    logit_teachers: tuple[int, ...] | None = None  # None: every teacher

    @property
    def several(self) -> bool:
        return len(self.weights) > 1

    @property
    def readers(self) -> tuple[int, ...]:
        """The teachers a logit term reads."""
        return tuple(range(len(self.weights))) if self.logit_teachers is None else self.logit_teachers

    def shares(self, spec: TermSpec) -> tuple[float, ...]:
        """Each teacher's share of a term of kind `spec`: λ_k, for a logit term `logit_shares`."""
        return self.logit_shares if spec.reads == "logits" else self.weights

    @property
    def logit_shares(self) -> tuple[float, ...]:
        """λ_k renormalised over `readers` (0 for the others)."""
        kept = [w if k in self.readers else 0.0 for k, w in enumerate(self.weights)]
        return tuple(w / (sum(kept) or 1.0) for w in kept)

    def on_mixture(self, spec: TermSpec) -> bool:
        """Whether a term of kind `spec` is computed once on the teachers' mixture."""
        return self.several and bool(self.options.on_mixture([spec.name]))

    def reads(self, term: Term, teacher: int) -> bool:
        """Whether `term` reads teacher `teacher`'s features: its own, or the mixture of the teachers it mixes."""
        return term.spec.needs_teacher and (term.teacher == teacher or (_mixed(term) and teacher in self.readers))


def expand(terms: Sequence[Term], teachers: Teachers,
           resolve: Callable[[Term, int], Term] = lambda term, teacher: term) -> list[Term]:
    """The terms as computed: a term without a teacher (or with one teacher) as it is; a mixture term once, reading the
    mixture (`teacher` its space's name, `TermSpec.mixture`); any other teacher term once per teacher k with a share
    (`name@k`, `teacher=k`, `share=λ_k`, resolved against teacher k by `resolve`: its layer pairs, heads and
    windows)."""
    expanded = []
    for term in terms:
        if not teachers.several or not term.spec.needs_teacher:
            expanded.append(term)
        elif teachers.on_mixture(term.spec):
            expanded.append(replace(term, teacher=term.spec.mixture))
        else:
            expanded += [replace(resolve(term, k), name=f"{term.name}@{k}", teacher=k, share=share)
                         for k, share in enumerate(teachers.shares(term.spec)) if share]
    return expanded


def each_teacher(features: Sequence[Features],
                 units: Sequence[WordUnits] = ()) -> dict[int | str, tuple[Features, WordUnits | None]]:
    """`TermInputs.by_teacher` of several teachers: each one's features (across tokenizers, and its words) under its
    index; of one teacher: nothing (its terms read `TermInputs.teacher`)."""
    if len(features) < 2:
        return {}
    return {k: (own, units[k] if units else None) for k, own in enumerate(features)}


def mix(terms: Sequence[Term], inputs: TermInputs, teachers: Teachers) -> TermInputs:
    """`inputs` with the teachers' mixture in each space a mixture term reads, as one teacher's features under the
    space's name: their logit rows (`each_teacher`'s) at the first reader's positions mixed with λ_k, or per row with
    the confidence weights (module docstring)."""
    spaces = {term.teacher for term in terms if _mixed(term)}
    if not spaces:
        return inputs
    by_teacher = dict(inputs.by_teacher)
    features = {k: own for k, (own, _) in by_teacher.items()}
    readers = teachers.readers
    first = features[readers[0]]
    positions = first.logits.positions
    shares = teachers.logit_shares
    weights = torch.tensor([shares[k] for k in readers], device=positions.device)
    if teachers.options.confidence:
        dense = [features[k].logits.logits() for k in readers]
        weights = confidence_weights(dense, weights, _row_labels(inputs, positions), inputs.multi_label)
    for space in spaces:
        if space == "softmax":  # formed a chunk of rows at a time inside the KL, never whole
            rows = MixedRows(tuple(_rows(features[k].logits) for k in readers), weights, inputs.temperature)
        else:
            logits = [features[k].logits.logits() for k in readers]
            binary_pair = space == "sigmoid" and not inputs.multi_label and logits[0].size(-1) == 2
            rows = mixed_teacher_logits(logits, weights, space, inputs.temperature, binary_pair)
        by_teacher[space] = (replace(first, logits=LogitRows(positions, rows), hidden={}), None)
    return replace(inputs, by_teacher=by_teacher)


def contribution(spec: TermSpec, share: float | None, teachers: Teachers) -> str:
    """One cell of the pre-flight table: what a teacher of share `share` gives a term of kind `spec`."""
    if share is None:
        return "— (the student's own loss)"
    if not share:
        return "— no trained MLM head (its logits would be random)"
    if teachers.on_mixture(spec):
        what = "logits" if spec.mixture == "logits" else f"{spec.mixture} probabilities"
        return f"mixture of {what} ({'confidence × ' if teachers.options.confidence else ''}weight {share:.2f})"
    return f"its own term × {share:.2f}" + (" (own projections)" if spec.reads == "hidden" else "")


def refuse_mixed_vocabularies(cfg: TeachersConfig, losses: list[str], count: int) -> None:
    """Across tokenizers each teacher is compared with the student over the strings their two vocabularies share:
    several teachers' vocabularies are never mixed."""
    mixed = cfg.on_mixture(losses)
    if count > 1 and mixed:
        raise BiodistilError(f"Objective terms {mixed} would mix several teachers' vocabularies, and across tokenizers "
                             "each teacher is compared with the student over the strings their two vocabularies "
                             "share: set objective.combine: per_teacher (one term per teacher)")


def teacher_table(teachers: Teachers, terms: Mapping[str, TermSpec],
                  about: Sequence[dict[str, str]] = ()) -> list[dict[str, Any]]:
    """The pre-flight table, one row per teacher k: `about[k]` (its name, the tokens it reads), its weight λ_k and,
    per term (log name → kind), what it gives (`contribution`)."""
    return [{**known, "weight": round(weight, 4),
             "terms": {name: contribution(spec, teachers.shares(spec)[k] if spec.needs_teacher else None, teachers)
                       for name, spec in terms.items()}}
            for k, (known, weight) in enumerate(zip(about or [{}] * len(teachers.weights), teachers.weights,
                                                    strict=True))]


def render_teacher_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """The pre-flight table as text (or a Markdown table, for a report): teacher × term (rows: teacher, weight, tokens
    and per term what it gives)."""
    names = list(rows[0]["terms"]) if rows else []
    cells = [["teacher", "λ", "tokens", *names]]
    cells += [[row["teacher"], f"{row['weight']:.2f}", row["tokens"], *(row["terms"][name] for name in names)]
              for row in rows]
    if not markdown:
        return "\n".join(["Teachers (pre-flight):", *(" | ".join(line) for line in cells)])
    header, *body = (f"| {' | '.join(line)} |" for line in cells)
    return "\n".join(["Teachers (pre-flight):", "", header, "|" + "---|" * len(cells[0]), *body])


def ensemble_test_scores(teachers: Sequence[str | Path], weights: Sequence[float], task: TaskSpec,
                         examples: Sequence[Example], cache_dir: str | Path | None = None) -> dict[str, float]:
    """The task metric of the teachers' ensemble on labelled `examples`: per example (per word of a token task: at
    each word's first sub-word, whatever each teacher's tokenizer) the weighted mixture Σ_k w_k·softmax(z_k)
    (multi-label: of the sigmoids), its most probable class (words a teacher lost to truncation take the others';
    none: O). Each teacher's outputs come from the teacher store, as KD reads them."""
    outputs = [cached_teacher_outputs(path, examples, TeacherRequest(task, progress_bar=False), cache_dir)
               for path in teachers]
    shares = np.asarray(weights, dtype=np.float64) / float(sum(weights))
    multi = task.kind == "multilabel_classification"
    labels, scores = [], []
    for index, example in enumerate(examples):
        if task.kind == "token_classification":
            mixed = [_ensemble([(out.logits[out.by_word[(index, word)]], share) for out, share in
                                zip(outputs, shares, strict=True) if (index, word) in out.by_word], multi)
                     for word in range(len(example.tokens))]
            labels.append([task.labels[int(np.argmax(p))] if p is not None else "O" for p in mixed])
            continue
        probabilities = _ensemble([(out.logits[out.by_example[index]], share)
                                   for out, share in zip(outputs, shares, strict=True)], multi)
        scores.append(probabilities.tolist())
        labels.append((probabilities >= 0.5).astype(int).tolist() if multi
                      else task.labels[int(np.argmax(probabilities))])
    return score(task, examples, Predictions(labels, scores))


def _ensemble(rows: list[tuple[np.ndarray, float]], multi_label: bool) -> np.ndarray | None:
    """Σ_k w_k·p_k over the teachers that have the row, renormalised over them (None: none has it)."""
    if not rows:
        return None
    total = sum(share for _, share in rows)
    squash = torch.sigmoid if multi_label else (lambda z: torch.softmax(z, -1))
    return sum(share / total * squash(torch.tensor(np.asarray(z, dtype=np.float32))).numpy()
               for z, share in rows)


def _mixed(term: Term) -> bool:
    """Whether `term` reads the teachers' mixture (`expand` keys it by its space)."""
    return isinstance(term.teacher, str)


def _row_labels(inputs: TermInputs, positions: torch.Tensor) -> torch.Tensor | None:
    """The label at each logit row (−100: none), or per example the 0/1 label vector of a multi-label task."""
    if inputs.labels is None:
        return None
    return inputs.labels if inputs.multi_label else inputs.labels[positions]


def _rows(logits: LogitRows) -> torch.Tensor | Linear:
    """What stands for a teacher's logit rows in a mixture: its head's (x, W, b), else the logits."""
    return logits.rows.linear if isinstance(logits.rows, LinearRows) else logits.logits()
