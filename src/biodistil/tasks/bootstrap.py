"""Intervals that include the test set's sampling: a paired bootstrap over test examples (sentences, or documents),
two-level when each side has several runs (seeds).

A statistic of two or more sides — the share of the teacher S/T, a difference A − B, the gap closed (S − R)/(T − R) from
a reference arm R — is recomputed on B resamples. Each resample draws, with replacement, the runs of each side (seed
variance: of the students, and of the teachers when several were trained) and then the test examples, the same examples
for every run (paired: a hard sentence is hard for both sides); the side's score is the mean over its drawn runs of the
task's headline metric on the drawn examples.
The interval is the percentile interval of the B statistics. With one run a side it is the plain paired bootstrap
over examples. A side may also be given as groups of runs (e.g. the fine-tuning seeds of each distillation run): a
resample then draws the groups and the runs within them — the two-level bootstrap that keeps the variance between
groups (distillation runs) as well as within them (fine-tuning seeds). Groups of equal size are taken as *crossed*:
the k-th run of every group shares its seed (a study fine-tunes every start with the same seeds), so a resample draws
the groups and, independently, the positions within a group once for the whole side, and uses every drawn group at
every drawn position (the pigeonhole bootstrap of Owen, 2007, for crossed random effects: drawing seeds anew within
each group would treat the seeds' shared effect as independent noise and understate it). Groups of unequal sizes
are nested: the runs within each drawn group are drawn for that group.

A resample must cost little (a study forms B = 2,000 of them for each row), so the metrics that are ratios of sums are
formed from per-example counts, summed for a block of resamples at once as one product of how often each resample drew
each example with the counts: entity F1 from correct, predicted and gold entities per sentence (strict IOB2 spans, as
`metrics.entity_f1` parses them), accuracy and the F1 of positive classes from per-example hits. AUROC is the
Mann-Whitney statistic on the drawn examples' ranks (ties count one half, as `sklearn.metrics.roc_auc_score`). Any
other metric is recomputed by its own function on the drawn examples.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata

from biodistil.errors import BiodistilError
from biodistil.io import read_jsonl
from biodistil.tasks.metrics import entity_f1, get_metric

RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A statistic on the full test set and its bootstrap percentile interval."""

    estimate: float
    low: float
    high: float
    resamples: int
    runs: tuple[int, ...]  # runs (seeds) on each side
    groups: tuple[int, ...] | None = None  # groups of runs on each side, when a side was given in groups

    def as_record(self) -> dict[str, Any]:
        method = "paired bootstrap over test examples, runs drawn per side"
        grouped = {"groups": list(self.groups)} if self.groups else {}
        if self.groups:
            method += (" (two-level where a side has groups: groups and the seeds within them drawn, crossed when the"
                       " groups share their seeds)")
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "resamples": self.resamples,
                "runs": list(self.runs), **grouped, "method": method}


@dataclass(frozen=True)
class ScoredRun:
    """One run's test predictions, aligned with the gold by example id, and how to score any subset of them."""

    ids: tuple[str, ...]
    score: Callable[[np.ndarray], float]  # the headline metric on the examples at these indices
    counts: np.ndarray | None = None  # per-example counts, where the metric is a function of their sums
    of_sums: Callable[[np.ndarray], np.ndarray] | None = None  # that function, on a row of sums per resample

    def scores(self, draws: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        """The metric on each resample, a row of `draws` (example indices); `weights[b, i]`: how often resample b drew
        example i, which turns the sums over a resample's examples into one product for all of them."""
        if self.counts is None or self.of_sums is None or weights is None:
            return np.array([self.score(row) for row in draws])
        return self.of_sums(weights @ self.counts)


def read_scored_run(path: Path, metric: str, key: str | None = None, positive_at: int | None = None,
                    **options: Any) -> ScoredRun:
    """A run's `test_predictions.jsonl` (id, gold, predicted and any class scores per example) scored by `metric` (a
    name of `tasks.metrics.METRICS`, with its `options`) at `key` (default its headline); `positive_at`: the index of
    the positive class in the class scores, for a metric that also reads them (AUROC)."""
    return scored_run(read_jsonl(path), metric, key, positive_at, str(path), **options)


def scored_run(rows: Sequence[dict[str, Any]], metric: str, key: str | None = None, positive_at: int | None = None,
               source: str = "predictions", **options: Any) -> ScoredRun:
    """`read_scored_run` on records already read (`tasks.prediction.scored_rows`); `source` names them in errors."""
    if not rows or any(not {"id", "gold", "predicted"} <= set(row) for row in rows):
        raise BiodistilError(f"{source}: expected one JSON record per test example with id, gold and predicted")
    gold, predicted = [row["gold"] for row in rows], [row["predicted"] for row in rows]
    ids = tuple(str(row["id"]) for row in rows)
    spec = get_metric(metric)
    key = key or spec.headline
    if "positive_scores" in spec.inputs:
        if positive_at is None or any("scores" not in row for row in rows):
            raise BiodistilError(f"{source}: {metric} also reads the positive class's score; these predictions have "
                                 "no class scores (or no positive class was named)")
        options["positive_scores"] = np.array([row["scores"][positive_at] for row in rows])
    settled = {**_defaults(spec.function), **options}
    quick = _per_example_counts(metric, key, gold, predicted, settled)
    if quick is not None:
        counts, of_sums = quick
        return ScoredRun(ids, lambda indices: float(of_sums(counts[indices].sum(axis=0, keepdims=True))[0]), counts,
                         of_sums)
    if key == "auroc":
        return ScoredRun(ids, _auroc_of(np.array([str(g) == str(settled["positive"]) for g in gold]),
                                        np.asarray(settled["positive_scores"], float)))

    def score(indices: np.ndarray) -> float:
        drawn = {name: value[indices] if isinstance(value, np.ndarray) else value for name, value in options.items()}
        return float(spec([gold[i] for i in indices], [predicted[i] for i in indices], **drawn)[key])

    return ScoredRun(ids, score)


def entity_counts(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> np.ndarray:
    """Per sentence: [correct, predicted, gold] entities (strict IOB2 spans, type included: `metrics.entity_f1`)."""
    counts = np.zeros((len(gold), 3), dtype=np.int64)
    for index, (true, found) in enumerate(zip(gold, predicted, strict=True)):
        scores = entity_f1([true], [found])
        counts[index] = (scores["n_correct"], scores["n_pred"], scores["n_true"])
    return counts


def _per_example_counts(metric: str, key: str, gold: list[Any], predicted: list[Any], options: dict[str, Any]
                        ) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]] | None:
    """Per-example counts and the metric at `key` as a function of their sums (see the module's docstring), or None
    where the metric is no such ratio."""
    if metric == "entity_f1" and key == "f1":
        return entity_counts(gold, predicted), _f1_of_sums
    hits = np.array([str(g) == str(p) for g, p in zip(gold, predicted, strict=True)], dtype=np.int64)
    if key == "accuracy" and metric in {"binary_prf", "accuracy_macro_f1", "accuracy_auroc"}:
        return np.stack([hits, np.ones_like(hits)], axis=1), _accuracy_of_sums
    if metric == "binary_prf" and key == "f1":
        positives = {str(options["positive"])}
    elif metric == "micro_f1_excluding" and key == "f1":
        negatives = {str(n) for n in options["negative_labels"]}
        positives = ({str(g) for g in gold} | {str(p) for p in predicted}) - negatives
    else:
        return None
    is_gold = np.array([str(g) in positives for g in gold], dtype=np.int64)
    is_predicted = np.array([str(p) in positives for p in predicted], dtype=np.int64)
    return np.stack([hits * is_predicted, is_predicted, is_gold], axis=1), _f1_of_sums


def _f1_of_sums(sums: np.ndarray) -> np.ndarray:
    """F1 = 2·correct / (predicted + gold) (= 2PR/(P + R)) from the sums of [correct, predicted, gold]; 0 where nothing
    was predicted or gold."""
    total = sums[:, 1] + sums[:, 2]
    return np.divide(2.0 * sums[:, 0], total, out=np.zeros(len(sums)), where=total > 0)


def _accuracy_of_sums(sums: np.ndarray) -> np.ndarray:
    """Accuracy = hits / examples, from the sums of [hit, 1]."""
    return sums[:, 0] / sums[:, 1]


def _auroc_of(positive: np.ndarray, scores: np.ndarray) -> Callable[[np.ndarray], float]:
    """AUROC = (sum of the positives' ranks − n₁(n₁ + 1)/2) / (n₁·n₀), tied scores at their mean rank; NaN with one
    class among the drawn examples."""
    def score(indices: np.ndarray) -> float:
        drawn = positive[indices]
        n_positive = int(drawn.sum())
        n_negative = len(drawn) - n_positive
        if not n_positive or not n_negative:
            return float("nan")
        ranks = rankdata(scores[indices])
        return float((ranks[drawn].sum() - n_positive * (n_positive + 1) / 2) / (n_positive * n_negative))

    return score


def _defaults(function: Callable[..., Any]) -> dict[str, Any]:
    return {name: parameter.default for name, parameter in inspect.signature(function).parameters.items()
            if parameter.default is not inspect.Parameter.empty}


Side = Sequence[ScoredRun] | Sequence[Sequence[ScoredRun]]  # runs, or groups of runs (see the module docstring)


def share_interval(students: Side, teachers: Side, resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """The share of the teacher, mean student score / mean teacher score, with its interval (resamples on which the
    teacher scores 0 have no share and are left out); a teacher that scores 0 on the whole test set has none."""
    _check_aligned([*_runs(_groups(students)), *_runs(_groups(teachers))])
    if _whole_split_mean(teachers) == 0:
        raise BiodistilError("the teacher scores 0 on the test set: there is no share of it to form")
    return _interval((students, teachers), lambda s, t: s / t if t else float("nan"), resamples, seed)


def difference_interval(first: Side, second: Side, resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """mean score of `first` − mean score of `second`, with its interval."""
    return _interval((first, second), lambda a, b: a - b, resamples, seed)


def gap_interval(students: Side, reference: Side, teachers: Side, resamples: int = RESAMPLES,
                 seed: int = 0) -> Interval:
    """The gap closed from a reference arm, (S − R)/(T − R) of the mean scores, with its interval: every side's runs
    drawn, the examples paired across all three (resamples on which T = R have no gap and are left out)."""
    if _whole_split_mean(teachers) == _whole_split_mean(reference):
        raise BiodistilError("the reference arm scores as the teacher does on the test set: there is no gap to close")
    return _interval((students, reference, teachers), lambda s, r, t: (s - r) / (t - r) if t != r else float("nan"),
                     resamples, seed)


def _interval(given: Sequence[Side], statistic: Callable[..., float], resamples: int, seed: int) -> Interval:
    """`statistic` of the sides' mean scores on the whole split and its percentile interval over `resamples`, each
    drawing every side's runs (`_draw`) and then one set of examples for all of them."""
    sides = [_groups(side) for side in given]
    side_runs = [_runs(side) for side in sides]
    every_run = [run for runs in side_runs for run in runs]
    _check_aligned(every_run)
    examples = len(side_runs[0][0].ids)
    estimate = statistic(*(_mean(runs, np.arange(examples)) for runs in side_runs))
    rng = np.random.default_rng(seed)
    positions = [_positions(side) for side in sides]
    picked, draws = [], np.empty((resamples, examples), dtype=np.int64)
    for b in range(resamples):  # one stream: each side's runs, then the examples, resample after resample
        picked.append([_draw(side, rng) for side in positions])
        draws[b] = rng.integers(examples, size=examples)
    scores = _scores(every_run, draws)  # every side's runs scored on one set of weights
    ends = np.cumsum([len(runs) for runs in side_runs])
    means = [_drawn_means(scores[end - len(runs):end], [chosen[side] for chosen in picked])
             for side, (runs, end) in enumerate(zip(side_runs, ends, strict=True))]
    values = np.array([statistic(*resample) for resample in zip(*means, strict=True)])
    low, high = np.nanquantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    grouped = any(not isinstance(item, ScoredRun) for side in given for item in side)
    return Interval(float(estimate), float(low), float(high), resamples, tuple(len(runs) for runs in side_runs),
                    tuple(len(side) for side in sides) if grouped else None)


def _scores(runs: Sequence[ScoredRun], draws: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Each run's score on each resample (a row of `draws`): runs × resamples. The resamples go `chunk` at a time, with
    how often each drew each example (`weights`) formed once for all the runs."""
    examples = draws.shape[1]
    counted = any(run.counts is not None for run in runs)
    scores = np.empty((len(runs), len(draws)))
    for start in range(0, len(draws), chunk):
        rows = draws[start:start + chunk]
        offsets = (np.arange(len(rows))[:, None] * examples + rows).ravel()
        weights = np.bincount(offsets, minlength=len(rows) * examples).reshape(len(rows), examples) \
            if counted else None
        for index, run in enumerate(runs):
            scores[index, start:start + len(rows)] = run.scores(rows, weights)
    return scores


def _groups(side: Side) -> list[list[ScoredRun]]:
    """A side as groups of runs: a flat list of runs is one run per group (the one-level draw)."""
    return [list(item) if not isinstance(item, ScoredRun) else [item] for item in side]


def _runs(groups: list[list[ScoredRun]]) -> list[ScoredRun]:
    return [run for group in groups for run in group]


def _drawn_means(scores: np.ndarray, picked: list[list[int]]) -> np.ndarray:
    """Each resample's mean score over the runs drawn for it (`scores`: runs × resamples)."""
    if len({len(runs) for runs in picked}) == 1:  # as many runs on every resample: one gather for all
        return scores[np.array(picked), np.arange(len(picked))[:, None]].mean(axis=1)
    return np.array([scores[runs, b].mean() for b, runs in enumerate(picked)])


def _positions(groups: list[list[ScoredRun]]) -> list[list[int]]:
    """The groups with each run replaced by its position among the side's runs (`_runs`)."""
    flat = iter(range(sum(len(group) for group in groups)))
    return [[next(flat) for _ in group] for group in groups]


def _draw(groups: list[list[int]], rng: np.random.Generator) -> list[int]:
    """Groups drawn with replacement, and the runs within them: groups of one size crossed (one draw of positions for
    every drawn group), else nested (a draw per group). A group of one run draws nothing more: flat runs are drawn
    exactly as the one-level bootstrap draws them."""
    chosen = [groups[g] for g in rng.integers(len(groups), size=len(groups))]
    sizes = {len(group) for group in groups}
    if sizes == {1}:
        return [group[0] for group in chosen]
    if len(sizes) == 1:
        (size,) = sizes
        positions = rng.integers(size, size=size)
        return [group[i] for group in chosen for i in positions]
    return [group[i] for group in chosen for i in rng.integers(len(group), size=len(group))]


def _whole_split_mean(side: Side) -> float:
    runs = _runs(_groups(side))
    return _mean(runs, np.arange(len(runs[0].ids)))


def _mean(runs: Sequence[ScoredRun], indices: np.ndarray) -> float:
    return float(np.mean([run.score(indices) for run in runs]))


def _check_aligned(runs: Sequence[ScoredRun]) -> None:
    if not runs:
        raise BiodistilError("a bootstrap needs at least one run on each side")
    for run in runs[1:]:
        if run.ids != runs[0].ids:
            raise BiodistilError("the runs were scored on different test examples (their ids differ); a paired "
                                 "bootstrap needs the same test set in the same order")
