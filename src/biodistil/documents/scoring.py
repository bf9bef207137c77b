"""Entity F1 at the character level on the original documents, as users report it, through nervaluate.

Two matches: **strict** (the same span and type; nervaluate's `strict`) and **overlap** (the same type and at least
one shared character; nervaluate's `ent_type`), each per type, micro (over every entity) and macro (the mean of the
types' F1). nervaluate counts ends as inclusive, so a [start, end) span goes in as (start, end - 1): two entities
that only touch ([0, 5) and [5, 8)) do not overlap. A discontinuous span is scored by its extent (first start to
last end). Documents are matched by id; a predicted document without gold (or the reverse) is an error naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from biodistil.documents.model import SpanDocument
from biodistil.errors import BiodistilError

MATCHES = {"strict": "strict", "overlap": "ent_type"}  # our name → nervaluate's scheme


def _entities(document: SpanDocument) -> list[dict[str, Any]]:
    unique = {(span.type, span.start, span.end) for span in document.spans}  # an annotation given twice is one
    return [{"label": kind, "start": start, "end": end - 1} for kind, start, end in sorted(unique)]


def paired(gold: Sequence[SpanDocument], predicted: Sequence[SpanDocument]) -> list[tuple[SpanDocument,
                                                                                         SpanDocument]]:
    """(gold, predicted) pairs by document id; documents missing on one side are an error that names a few."""
    by_id = {document.id: document for document in predicted}
    missing = [document.id for document in gold if document.id not in by_id]
    extra = sorted(set(by_id) - {document.id for document in gold})
    if missing or extra:
        raise BiodistilError(f"gold and predicted documents differ: {len(missing)} gold document(s) without a "
                             f"prediction (e.g. {missing[:3]}), {len(extra)} predicted document(s) without gold "
                             f"(e.g. {extra[:3]}); score the predictions of the same documents")
    for document in gold:
        if by_id[document.id].text != document.text:
            raise BiodistilError(f"document {document.id}: the predicted document's text differs from the gold "
                                 f"one ({by_id[document.id].source} vs {document.source}); offsets cannot be compared")
    return [(document, by_id[document.id]) for document in gold]


def character_scores(gold: Sequence[SpanDocument], predicted: Sequence[SpanDocument],
                     types: Sequence[str] | None = None) -> dict[str, Any]:
    """Strict and overlap precision, recall and F1, micro and macro, and per type:
    `{"strict": {"micro": {p, r, f1, gold, predicted, correct}, "macro_f1": x, "per_type": {type: {...}}}, ...}`."""
    from nervaluate import Evaluator

    pairs = paired(gold, predicted)
    kinds = sorted(set(types) if types is not None else
                   {span.type for pair in pairs for document in pair for span in document.spans})
    if not kinds:
        return {match: {"micro": _numbers(None), "macro_f1": 0.0, "per_type": {}} for match in MATCHES}
    evaluator = Evaluator([_entities(g) for g, _ in pairs], [_entities(p) for _, p in pairs], tags=kinds,
                          loader="dict")
    results = evaluator.evaluate()
    scores = {}
    for match, scheme in MATCHES.items():
        per_type = {kind: _numbers(results["entities"][kind][scheme]) for kind in kinds}
        scored = [numbers["f1"] for numbers in per_type.values() if numbers["gold"] or numbers["predicted"]]
        scores[match] = {"micro": _numbers(results["overall"][scheme]),
                         "macro_f1": sum(scored) / len(scored) if scored else 0.0, "per_type": per_type}
    return scores


def _numbers(result: Any) -> dict[str, float | int]:
    if result is None:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0, "gold": 0, "predicted": 0, "correct": 0}
    return {"precision": float(result.precision), "recall": float(result.recall), "f1": float(result.f1),
            "gold": int(result.possible), "predicted": int(result.actual), "correct": int(result.correct)}


def headline(scores: dict[str, Any]) -> dict[str, float]:
    """The flat numbers a results record keeps: char_strict_f1, char_overlap_f1 and their macro averages."""
    return {f"char_{match}_f1": scores[match]["micro"]["f1"] for match in MATCHES} | {
        f"char_{match}_macro_f1": scores[match]["macro_f1"] for match in MATCHES}


def score_table(scores: dict[str, Any]) -> str:
    """A plain-text table: one row per type, then micro and macro; strict and overlap P/R/F1."""
    header = f"{'type':<20} {'gold':>6} {'pred':>6}  {'strict P':>8} {'R':>6} {'F1':>6}  {'overlap P':>9} {'R':>6} " \
             f"{'F1':>6}"
    rows = [header]
    kinds = list(scores["strict"]["per_type"])
    for kind in [*kinds, "micro"]:
        strict = scores["strict"]["micro"] if kind == "micro" else scores["strict"]["per_type"][kind]
        overlap = scores["overlap"]["micro"] if kind == "micro" else scores["overlap"]["per_type"][kind]
        rows.append(f"{kind:<20} {strict['gold']:>6} {strict['predicted']:>6}  {strict['precision']:>8.4f} "
                    f"{strict['recall']:>6.4f} {strict['f1']:>6.4f}  {overlap['precision']:>9.4f} "
                    f"{overlap['recall']:>6.4f} {overlap['f1']:>6.4f}")
    rows.append(f"{'macro':<20} {'':>6} {'':>6}  {'':>8} {'':>6} {scores['strict']['macro_f1']:>6.4f}  {'':>9} "
                f"{'':>6} {scores['overlap']['macro_f1']:>6.4f}")
    return "\n".join(rows)
