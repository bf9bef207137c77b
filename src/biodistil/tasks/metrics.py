"""The official metric of each biomedical task, one function each, returning a dict of floats.

Every metric has a headline key (the number reported in BLURB-style tables), recorded in `METRICS`:

| metric | tasks | headline |
|---|---|---|
| entity_f1 | NER (NCBI-disease, BC5CDR, BC2GM, JNLPBA, LINNAEUS, Species-800) | f1 |
| binary_prf | GAD, EU-ADR (and AUROC) | f1 |
| micro_f1_excluding | ChemProt, DDI | f1 |
| hoc_example_f1 | HoC | example_f1 |
| accuracy_macro_f1 | PubMedQA | accuracy |
| accuracy_auroc | BioASQ | accuracy |
| token_macro_f1 | EBM PICO | macro_f1 |

All scores are fractions in [0, 1]. Class labels are compared as strings, so 1 and "1" are the same class.
A ratio with a zero denominator counts as 0 (no prediction of a class: precision 0), except where noted.
"""

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from biodistil.errors import BiodistilError

# seqeval and scikit-learn are imported by the metrics that use them: scikit-learn's import holds about 150 MB, which
# every training command (the task registry imports this module) would otherwise carry through its run

Metrics = dict[str, float]


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def _f1(precision: float, recall: float) -> float:
    return _ratio(2 * precision * recall, precision + recall)


def _check_lengths(y_true: Sequence[Any], y_pred: Sequence[Any], what: str = "examples") -> None:
    if len(y_true) != len(y_pred):
        raise BiodistilError(
            f"{len(y_true)} gold {what} but {len(y_pred)} predicted; expected the same number"
        )


def _labels(values: Sequence[Any]) -> list[str]:
    return [str(v) for v in values]


# ------------------------------------------------------------------------------------ sequence labelling


def _typed_tag(tag: str) -> str:
    """seqeval needs a type suffix: bare B / I (as in BioBERT/BLURB files) become B-ENT / I-ENT."""
    return f"{tag}-ENT" if tag in ("B", "I") else tag


def _typed(sequences: Sequence[Sequence[str]]) -> list[list[str]]:
    return [[_typed_tag(t) for t in sentence] for sentence in sequences]


def entity_f1(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> Metrics:
    """Entity-level micro precision / recall / F1 (headline "f1"), strict IOB2 spans via seqeval.

    Strict mode: an entity is a B tag followed by I tags of the same type; an I with no B before it starts
    no entity (it is not repaired into one), and B I B is two entities. A predicted entity counts only if
    its start, end and type all match a gold one. Also returns counts n_true, n_pred, n_correct.

    Each side's entities are parsed once by seqeval's strict parser (`Entities`) and the micro scores formed from
    the counts as seqeval forms them (P = correct / predicted, R = correct / true, F1 = 2PR / (P + R), 0 where a
    denominator is 0): equal to `seqeval.metrics.f1_score(..., mode="strict")`, without its three re-parses of
    both sides (1.6 s of every NCBI-disease evaluation).
    """
    _check_lengths(true_tags, pred_tags, "sentences")
    for index, (gold, pred) in enumerate(zip(true_tags, pred_tags, strict=True)):
        _check_lengths(gold, pred, f"tags in sentence {index}")
    gold_set = _entity_set(_typed(true_tags))
    pred_set = _entity_set(_typed(pred_tags))
    correct = len(gold_set & pred_set)
    precision = correct / len(pred_set) if pred_set else 0.0
    recall = correct / len(gold_set) if gold_set else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "n_true": len(gold_set),
        "n_pred": len(pred_set),
        "n_correct": correct,
    }


def format_metric(name: str, value: float | int | None) -> str:
    """A metric as a report prints it: counts (`n_*`, integers) as integers, scores to 4 decimals."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, int) or (name.startswith("n_") and float(value).is_integer()):
        return f"{int(value):,}"
    return f"{value:.4f}"


def _entity_set(sequences: list[list[str]]) -> set[tuple[int, int, int, str]]:
    from seqeval.scheme import IOB2, Entities

    entities = Entities(sequences, IOB2, suffix=False).entities
    return {e.to_tuple() for sentence in entities for e in sentence}


def _entity_type(tag: str) -> str:
    """Token-level class of a tag: B-PAR / I-PAR → PAR, bare B / I → ENT, O → O."""
    if tag == "O":
        return "O"
    prefix, _, kind = tag.partition("-")
    return kind if kind else "ENT" if prefix in ("B", "I") else tag


def token_macro_f1(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> Metrics:
    """Token-level macro F1 over the non-O classes (headline "macro_f1"), as BLURB scores EBM PICO.

    Each token is one decision; a tag's class is its entity type with the B-/I- prefix removed (B-PAR and
    I-PAR are both PAR). F1 is computed per class over all tokens and averaged over the classes that occur
    in gold or prediction, O excluded. Also returns the token-level micro F1 over those classes.
    """
    from sklearn.metrics import f1_score

    _check_lengths(true_tags, pred_tags, "sentences")
    gold: list[str] = []
    pred: list[str] = []
    for index, (g, p) in enumerate(zip(true_tags, pred_tags, strict=True)):
        _check_lengths(g, p, f"tags in sentence {index}")
        gold.extend(_entity_type(t) for t in g)
        pred.extend(_entity_type(t) for t in p)
    classes = sorted((set(gold) | set(pred)) - {"O"})
    if not classes:
        return {"macro_f1": 0.0, "micro_f1": 0.0}
    return {
        "macro_f1": float(f1_score(gold, pred, labels=classes, average="macro", zero_division=0)),
        "micro_f1": float(f1_score(gold, pred, labels=classes, average="micro", zero_division=0)),
    }


# -------------------------------------------------------------------------------------- classification


def binary_prf(y_true: Sequence[Any], y_pred: Sequence[Any], positive: Any = "1",
               positive_scores: Sequence[float] | None = None) -> Metrics:
    """Precision / recall / F1 of the positive class (headline "f1"), plus accuracy — GAD, EU-ADR — and, given the
    model's scores for the positive class, AUROC (threshold-free: a model that predicts one class still ranks)."""
    _check_lengths(y_true, y_pred)
    gold, pred, pos = _labels(y_true), _labels(y_pred), str(positive)
    true_pos = sum(g == pos and p == pos for g, p in zip(gold, pred, strict=True))
    precision = _ratio(true_pos, sum(p == pos for p in pred))
    recall = _ratio(true_pos, sum(g == pos for g in gold))
    accuracy = _ratio(sum(g == p for g, p in zip(gold, pred, strict=True)), len(gold))
    metrics = {"precision": precision, "recall": recall, "f1": _f1(precision, recall), "accuracy": accuracy}
    if positive_scores is not None:
        _check_lengths(y_true, positive_scores, "examples (scores)")
        metrics["auroc"] = _auroc([int(g == pos) for g in gold], positive_scores)
    return metrics


def micro_f1_excluding(
    y_true: Sequence[Any],
    y_pred: Sequence[Any],
    negative_labels: Sequence[Any] = ("False",),
) -> Metrics:
    """Micro precision / recall / F1 over every class except the negative ones (headline "f1").

    ChemProt: negative "False" (F1 over CPR:3,4,5,6,9). DDI: negative "DDI-false" (or the file's own
    negative label). A negative predicted as a positive class is a false positive; a positive predicted
    as negative is a false negative.
    """
    from sklearn.metrics import precision_recall_fscore_support

    _check_lengths(y_true, y_pred)
    gold, pred = _labels(y_true), _labels(y_pred)
    negatives = {str(n) for n in negative_labels}
    positives = sorted((set(gold) | set(pred)) - negatives)
    if not positives:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    precision, recall, f1, _ = precision_recall_fscore_support(
        gold, pred, labels=positives, average="micro", zero_division=0
    )
    return {"precision": float(precision), "recall": float(recall), "f1": float(f1)}


def accuracy_macro_f1(
    y_true: Sequence[Any],
    y_pred: Sequence[Any],
    labels: Sequence[Any] | None = None,
) -> Metrics:
    """Accuracy (headline "accuracy", BLURB's PubMedQA metric) and macro F1 over `labels` (default: seen)."""
    from sklearn.metrics import f1_score

    _check_lengths(y_true, y_pred)
    gold, pred = _labels(y_true), _labels(y_pred)
    classes = _labels(labels) if labels is not None else sorted(set(gold) | set(pred))
    accuracy = _ratio(sum(g == p for g, p in zip(gold, pred, strict=True)), len(gold))
    macro = f1_score(gold, pred, labels=classes, average="macro", zero_division=0) if gold else 0.0
    return {"accuracy": accuracy, "macro_f1": float(macro)}


def accuracy_auroc(
    y_true: Sequence[Any],
    y_pred: Sequence[Any],
    positive_scores: Sequence[float],
    positive: Any = "yes",
) -> Metrics:
    """Accuracy (headline "accuracy", BLURB's BioASQ metric) and AUROC of the positive class.

    `positive_scores` are the model's scores (probability or logit) for the positive class. AUROC is NaN
    when the gold labels contain only one class (it is undefined then).
    """
    _check_lengths(y_true, y_pred)
    _check_lengths(y_true, positive_scores, "examples (scores)")
    gold, pred, pos = _labels(y_true), _labels(y_pred), str(positive)
    accuracy = _ratio(sum(g == p for g, p in zip(gold, pred, strict=True)), len(gold))
    return {"accuracy": accuracy, "auroc": _auroc([int(g == pos) for g in gold], positive_scores)}


def _auroc(binary: list[int], positive_scores: Sequence[float]) -> float:
    """AUROC of 0/1 gold labels against scores; NaN when the gold labels hold one class (undefined then)."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(binary, list(positive_scores))) if len(set(binary)) == 2 else math.nan


# ----------------------------------------------------------------------------------------- multi-label


def _doc_prf(gold: set[int], pred: set[int]) -> tuple[float, float, float]:
    """Per-document precision, recall, F1; both sets empty counts as a perfect 1, 1, 1."""
    if not gold and not pred:
        return 1.0, 1.0, 1.0
    hits = len(gold & pred)
    return _ratio(hits, len(pred)), _ratio(hits, len(gold)), 2 * hits / (len(gold) + len(pred))


def _label_sets(rows: Sequence[Sequence[int]]) -> list[set[int]]:
    return [{j for j, v in enumerate(row) if int(v) == 1} for row in rows]


def hoc_example_f1(y_true_multi: Sequence[Sequence[int]], y_pred_multi: Sequence[Sequence[int]]) -> Metrics:
    """Example-based F1 for multi-label HoC (headline "example_f1"), plus micro / macro F1 over the labels.

    Rows are 0/1 vectors (10 hallmarks). Per document, with gold set G and predicted set P:
    F1 = 2|G∩P| / (|G|+|P|), and F1 = 1 when both are empty (a correct "no hallmark" answer; BLUE's script
    would divide by zero there, and HoC has many such abstracts). `example_f1` is the mean over documents.

    BLUE's eval_hoc.py (Peng et al. 2019) as we read it averages per-document precision |G∩P|/|P| (0 when P
    is empty) and recall |G∩P|/|G| over documents, then takes the harmonic mean of the two averages; that
    number is returned as `blue_f1` (with the same empty-set convention), next to `example_precision` and
    `example_recall`. `micro_f1` / `macro_f1` are sklearn's over the label columns.
    """
    from sklearn.metrics import f1_score

    _check_lengths(y_true_multi, y_pred_multi, "documents")
    widths = {len(row) for row in [*y_true_multi, *y_pred_multi]}
    if len(widths) > 1:
        raise BiodistilError(
            f"multi-label rows have different lengths {sorted(widths)}; expected one per label"
        )
    if not y_true_multi:
        return dict.fromkeys(
            ("example_f1", "example_precision", "example_recall", "blue_f1", "micro_f1", "macro_f1"), 0.0
        )
    per_doc = [
        _doc_prf(g, p) for g, p in zip(_label_sets(y_true_multi), _label_sets(y_pred_multi), strict=True)
    ]
    precision = statistics.fmean(d[0] for d in per_doc)
    recall = statistics.fmean(d[1] for d in per_doc)
    gold = [[int(v) for v in row] for row in y_true_multi]
    pred = [[int(v) for v in row] for row in y_pred_multi]
    return {
        "example_f1": statistics.fmean(d[2] for d in per_doc),
        "example_precision": precision,
        "example_recall": recall,
        "blue_f1": _f1(precision, recall),
        "micro_f1": float(f1_score(gold, pred, average="micro", zero_division=0)),
        "macro_f1": float(f1_score(gold, pred, average="macro", zero_division=0)),
    }


# ----------------------------------------------------------------------------------- folds and seeds


def _std(values: Sequence[float]) -> float:
    """Sample standard deviation (n − 1); 0.0 for a single value."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate_folds(fold_metrics: Sequence[dict[str, float]]) -> Metrics:
    """Mean and sample std of each metric across cross-validation folds.

    Returns each key with its mean under the same name (so the headline key still works), `<key>_std`, and
    `n_folds`. Every fold must report the same keys.
    """
    if not fold_metrics:
        raise BiodistilError("no fold results to aggregate; expected one metrics dict per fold")
    keys = list(fold_metrics[0])
    for index, metrics in enumerate(fold_metrics):
        if set(metrics) != set(keys):
            raise BiodistilError(
                f"fold {index} reports {sorted(metrics)}; expected the same keys {sorted(keys)}"
            )
    result: Metrics = {}
    for key in keys:
        values = [float(m[key]) for m in fold_metrics]
        result[key] = statistics.fmean(values)
        result[f"{key}_std"] = _std(values)
    result["n_folds"] = float(len(fold_metrics))
    return result


def summarize_seeds(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std, median and n of one score across random seeds."""
    if not values:
        raise BiodistilError("no seed results to summarize; expected at least one score")
    floats = [float(v) for v in values]
    return {
        "mean": statistics.fmean(floats),
        "std": _std(floats),
        "median": statistics.median(floats),
        "n": float(len(floats)),
    }


# --------------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class MetricSpec:
    """A metric function, the key of its headline number and what it takes as inputs."""

    function: Callable[..., Metrics]
    headline: str
    inputs: str
    options: tuple[str, ...] = field(default=())

    def __call__(self, *args: Any, **kwargs: Any) -> Metrics:
        return self.function(*args, **kwargs)


METRICS: dict[str, MetricSpec] = {
    "entity_f1": MetricSpec(entity_f1, "f1", "tag sequences"),
    "token_macro_f1": MetricSpec(token_macro_f1, "macro_f1", "tag sequences"),
    "binary_prf": MetricSpec(binary_prf, "f1", "labels + positive_scores", ("positive",)),
    "micro_f1_excluding": MetricSpec(micro_f1_excluding, "f1", "labels", ("negative_labels",)),
    "accuracy_macro_f1": MetricSpec(accuracy_macro_f1, "accuracy", "labels", ("labels",)),
    "accuracy_auroc": MetricSpec(accuracy_auroc, "accuracy", "labels + positive_scores", ("positive",)),
    "hoc_example_f1": MetricSpec(hoc_example_f1, "example_f1", "0/1 label vectors"),
}


def get_metric(name: str) -> MetricSpec:
    """The registered metric of that name, or an error listing the known ones."""
    if name not in METRICS:
        raise BiodistilError(f"Unknown metric '{name}'; known metrics: {', '.join(sorted(METRICS))}")
    return METRICS[name]


def headline_key(name: str) -> str:
    """The key of the headline number in the metric's result dict."""
    return get_metric(name).headline
