"""Several teachers in one `kd` run: the pre-flight table of what each teacher contributes to each term, made (and
the teachers checked against the task) before any work; and the teachers' own ensemble scored on labelled examples
(the reference a student of several teachers is read against)."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biodistil.data.formats import Example
from biodistil.errors import BiodistilError
from biodistil.kd.objective import kd_terms
from biodistil.kd.recipe import KDRecipe
from biodistil.methods.cross_tokenizer import tokenizer_pair
from biodistil.methods.several_teachers import Teachers, contribution
from biodistil.models.loading import load_tokenizer
from biodistil.tasks.prediction import Predictions
from biodistil.tasks.registry import TaskSpec
from biodistil.tasks.scoring import score
from biodistil.teachers.loading import check_teacher_for_task
from biodistil.teachers.task_cache import TeacherRequest, cached_teacher_outputs


def teacher_field(recipe: KDRecipe, index: int) -> str:
    """The recipe field that names teacher `index` (for error messages)."""
    return "teacher.name_or_path" if recipe.teachers is None else f"teachers[{index}].name_or_path"


def teacher_table(recipe: KDRecipe, task: TaskSpec) -> list[dict[str, Any]]:
    """One row per teacher: its model, weight λ, tokens, and per teacher term what it contributes. Refuses a teacher
    whose head or labels are not the task's, naming it and the mismatch."""
    student_tokenizer = load_tokenizer(recipe.student.name_or_path)
    terms = [term for term in kd_terms(recipe.kd) if term.spec.needs_teacher]
    entries = recipe.teacher_entries()
    teachers = Teachers(tuple(entry.weight for entry in entries), recipe.kd.combine, recipe.kd.confidence)
    rows = []
    for index, entry in enumerate(entries):
        try:
            check_teacher_for_task(entry.name_or_path, task)
        except BiodistilError as err:
            raise BiodistilError(f"{teacher_field(recipe, index)}: {err}") from None
        same = tokenizer_pair(student_tokenizer, load_tokenizer(entry.name_or_path)) == "same"
        dtype = "" if entry.dtype == "float32" else f" ({entry.dtype})"
        rows.append({"teacher": f"{entry.name_or_path}{dtype}", "weight": round(entry.weight, 4),
                     "tokens": "the student's" if same else (
                         "its own: outputs stored per word" if recipe.outputs_mode() == "cached" else "its own"),
                     "terms": {term.name: contribution(term.spec, entry.weight, teachers) for term in terms}})
    return rows


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
            mixed = [_mixture([(out.logits[out.by_word[(index, word)]], share) for out, share in
                               zip(outputs, shares, strict=True) if (index, word) in out.by_word], multi)
                     for word in range(len(example.tokens))]
            labels.append([task.labels[int(np.argmax(p))] if p is not None else "O" for p in mixed])
            continue
        probabilities = _mixture([(out.logits[out.by_example[index]], share)
                                  for out, share in zip(outputs, shares, strict=True)], multi)
        scores.append(probabilities.tolist())
        labels.append((probabilities >= 0.5).astype(int).tolist() if multi
                      else task.labels[int(np.argmax(probabilities))])
    return score(task, examples, Predictions(labels, scores))


def _mixture(rows: list[tuple[np.ndarray, float]], multi_label: bool) -> np.ndarray | None:
    """Σ_k w_k·p_k over the teachers that have the row, renormalised over them (None: none has it)."""
    if not rows:
        return None
    total = sum(share for _, share in rows)
    squash = torch.sigmoid if multi_label else (lambda z: torch.softmax(z, -1))
    return sum(share / total * squash(torch.tensor(np.asarray(z, dtype=np.float32))).numpy()
               for z, share in rows)
