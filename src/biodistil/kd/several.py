"""Several teachers in one `kd` run: the pre-flight table of what each teacher contributes to each term, made (and
the teachers checked against the task) before any work."""

from typing import Any

from biodistil.errors import BiodistilError
from biodistil.kd.objective import kd_terms
from biodistil.kd.recipe import KDRecipe
from biodistil.methods.cross_tokenizer import tokenizer_pair
from biodistil.models.loading import load_tokenizer
from biodistil.tasks.registry import TaskSpec
from biodistil.teachers.loading import check_teacher_for_task


def teacher_field(recipe: KDRecipe, index: int) -> str:
    """The recipe field that names teacher `index` (for error messages)."""
    return "teacher.name_or_path" if recipe.teachers is None else f"teachers[{index}].name_or_path"


def teacher_table(recipe: KDRecipe, task: TaskSpec) -> list[dict[str, Any]]:
    """One row per teacher: its model, weight λ, tokens, and per teacher term what it contributes. Refuses a teacher
    whose head or labels are not the task's, naming it and the mismatch."""
    student_tokenizer = load_tokenizer(recipe.student.name_or_path)
    terms = [term for term in kd_terms(recipe.kd) if term.spec.needs_teacher]
    rows = []
    for index, entry in enumerate(recipe.teacher_entries()):
        try:
            check_teacher_for_task(entry.name_or_path, task)
        except BiodistilError as err:
            raise BiodistilError(f"{teacher_field(recipe, index)}: {err}") from None
        same = tokenizer_pair(student_tokenizer, load_tokenizer(entry.name_or_path)) == "same"
        rows.append({"teacher": str(entry.name_or_path), "weight": round(entry.weight, 4),
                     "tokens": "the student's" if same else (
                         "its own: outputs stored per word" if recipe.outputs_mode() == "cached" else "its own"),
                     "terms": {term.name: _contribution(recipe, term.spec.mixture, entry.weight) for term in terms}})
    return rows


def _contribution(recipe: KDRecipe, mixture: str | None, weight: float) -> str:
    if recipe.kd.combine == "mixture" and mixture is not None:
        share = "confidence × prior" if recipe.kd.confidence else "weight"
        return f"mixture of {mixture} probabilities ({share} {weight:.2f})" if mixture != "logits" else \
            f"mixture of logits ({share} {weight:.2f})"
    return f"its own term × {weight:.2f}"


def render_teacher_table(rows: list[dict[str, Any]]) -> str:
    """The pre-flight table as text: teacher × term."""
    names = list(rows[0]["terms"]) if rows else []
    lines = ["Teachers (pre-flight):", " | ".join(["teacher", "λ", "tokens", *names])]
    for row in rows:
        lines.append(" | ".join([row["teacher"], f"{row['weight']:.2f}", row["tokens"],
                                 *(row["terms"][name] for name in names)]))
    return "\n".join(lines)
