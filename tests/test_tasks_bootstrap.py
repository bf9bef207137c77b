"""Intervals over the test set (issue 55): per-sentence entity counts by hand, the estimate equal to the metric on
the whole set, and the bootstrap's width against the binomial spread worked out by hand."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from biodistil.errors import BiodistilError
from biodistil.tasks.bootstrap import (
    difference_interval,
    entity_counts,
    gap_interval,
    read_scored_run,
    share_interval,
)
from biodistil.tasks.metrics import entity_f1, get_metric


def write_run(path: Path, gold: list, predicted: list, ids: list | None = None) -> Path:
    ids = ids or [f"s{i}" for i in range(len(gold))]
    path.write_text("".join(json.dumps({"id": i, "gold": g, "predicted": p}) + "\n"
                            for i, g, p in zip(ids, gold, predicted, strict=True)))
    return path


def test_entity_counts_per_sentence_by_hand():
    gold = [["B-Disease", "I-Disease", "O", "B-Chemical"], ["O", "B-Disease"], ["O"]]
    predicted = [["B-Disease", "I-Disease", "O", "O"], ["O", "B-Chemical"], ["B-Disease"]]
    # sentence 0: the disease found, the chemical missed; 1: right span, wrong type; 2: a spurious entity
    assert entity_counts(gold, predicted).tolist() == [[1, 1, 2], [0, 1, 1], [0, 1, 0]]


def test_the_estimate_is_the_metric_on_the_whole_test_set(tmp_path):
    rng = np.random.default_rng(0)
    gold = [["B", "I", "O", "B"] if rng.random() < 0.5 else ["O", "B", "O", "O"] for _ in range(60)]
    student = [[tag if rng.random() < 0.8 else "O" for tag in sentence] for sentence in gold]
    teacher = [[tag if rng.random() < 0.95 else "O" for tag in sentence] for sentence in gold]
    runs = [read_scored_run(write_run(tmp_path / f"{n}.jsonl", gold, p), "entity_f1")
            for n, p in (("s", student), ("t", teacher))]
    share = share_interval([runs[0]], [runs[1]], resamples=200)
    expected = entity_f1(gold, student)["f1"] / entity_f1(gold, teacher)["f1"]
    assert share.estimate == pytest.approx(expected, abs=1e-12) and share.low <= share.estimate <= share.high
    same = difference_interval([runs[0]], [runs[0]], resamples=50)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0), "a model against itself: no spread at all"


def test_the_share_interval_has_the_width_of_the_binomial_spread_by_hand(tmp_path):
    """One gold entity per sentence; the teacher finds all, the student a seeded 80% and predicts nothing
    elsewhere. With p the share of sentences found, F1_S = 2p/(p + 1) and F1_T = 1, so the share is 2p/(1 + p);
    p over n = 400 resampled sentences has sd √(0.8·0.2/400) = 0.02, and d(share)/dp = 2/(1 + p)² = 0.617: sd 0.0123,
    a 95% interval of half-width 1.96 × 0.0123 = 0.0242."""
    n = 400
    found = np.zeros(n, dtype=bool)
    found[np.random.default_rng(1).permutation(n)[:320]] = True
    gold = [["O", "B-Disease", "I-Disease"] for _ in range(n)]
    student = [list(g) if hit else ["O", "O", "O"] for g, hit in zip(gold, found, strict=True)]
    teacher = read_scored_run(write_run(tmp_path / "t.jsonl", gold, gold), "entity_f1")
    share = share_interval([read_scored_run(write_run(tmp_path / "s.jsonl", gold, student), "entity_f1")], [teacher])
    assert share.estimate == pytest.approx(1.6 / 1.8, abs=1e-12)
    assert (share.high - share.low) / 2 == pytest.approx(0.0242, rel=0.2)


def test_the_gap_closed_from_a_reference_arm_is_formed_from_three_sides_by_hand(tmp_path):
    """One gold entity per sentence; the teacher finds all (F1 1), the reference arm a seeded 50% (F1 2·0.5/1.5 =
    2/3), the student those and 30% more (F1 2·0.8/1.8 = 8/9): the gap closed (8/9 − 2/3)/(1 − 2/3) = 2/3. The
    interval draws the same sentences for all three; a reference that scores as the teacher leaves no gap."""
    n = 400
    order = np.random.default_rng(2).permutation(n)
    gold = [["O", "B-Disease"] for _ in range(n)]

    def finding(count: int, name: str):
        hits = set(order[:count].tolist())
        predicted = [list(g) if i in hits else ["O", "O"] for i, g in enumerate(gold)]
        return read_scored_run(write_run(tmp_path / f"{name}.jsonl", gold, predicted), "entity_f1")

    student, reference, teacher = finding(320, "s"), finding(200, "r"), finding(n, "t")
    gap = gap_interval([student], [reference], [teacher], resamples=400)
    assert gap.estimate == pytest.approx(2 / 3, abs=1e-12)
    assert gap.low < gap.estimate < gap.high and gap.high - gap.low < 0.2 and gap.runs == (1, 1, 1)
    assert gap.as_record()["runs"] == [1, 1, 1]
    with pytest.raises(BiodistilError, match="no gap to close"):
        gap_interval([student], [teacher], [teacher], resamples=10)


def test_runs_of_several_seeds_widen_the_interval_by_their_spread(tmp_path):
    gold = [["O", "B"] for _ in range(200)]
    runs = []
    for seed, rate in enumerate((0.6, 0.8, 0.9)):
        hit = np.random.default_rng(seed).random(200) < rate
        runs.append(read_scored_run(write_run(tmp_path / f"s{seed}.jsonl", gold,
                                              [["O", "B"] if h else ["O", "O"] for h in hit]), "entity_f1"))
    teacher = [read_scored_run(write_run(tmp_path / "t.jsonl", gold, gold), "entity_f1")]
    one = share_interval(runs[1:2], teacher)
    three = share_interval(runs, teacher)
    assert three.estimate == pytest.approx(np.mean([r.score(np.arange(200)) for r in runs]), abs=1e-12)
    assert three.high - three.low > 1.5 * (one.high - one.low), "seeds 0.6-0.9 apart spread more than sentences"
    assert three.runs == (3, 1)


def test_auroc_is_recomputed_from_the_positive_class_scores_on_each_resample(tmp_path):
    gold = ["0", "1", "0", "1"]
    rows = [{"id": i, "gold": g, "predicted": "1", "scores": [1 - s, s]}
            for i, (g, s) in enumerate(zip(gold, [0.1, 0.9, 0.8, 0.7], strict=True))]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = read_scored_run(path, "binary_prf", key="auroc", positive_at=1, positive="1")
    # positives 0.9, 0.7 against negatives 0.1, 0.8: 3 of the 4 pairs ranked right
    assert run.score(np.arange(4)) == pytest.approx(0.75)
    with pytest.raises(BiodistilError, match="no class scores"):
        read_scored_run(write_run(tmp_path / "n.jsonl", gold, gold), "binary_prf", key="auroc", positive_at=1)


def test_a_label_metric_is_recomputed_on_each_resample_and_misaligned_runs_are_refused(tmp_path):
    gold = ["yes", "no"] * 20
    predicted = ["yes"] * 40
    run = read_scored_run(write_run(tmp_path / "a.jsonl", gold, predicted), "accuracy_macro_f1")
    assert run.score(np.arange(40)) == pytest.approx(0.5)
    other = read_scored_run(write_run(tmp_path / "b.jsonl", gold, predicted, [f"x{i}" for i in range(40)]),
                            "accuracy_macro_f1")
    with pytest.raises(BiodistilError, match="different test examples"):
        difference_interval([run], [other])
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(BiodistilError, match=r"bad\.jsonl: expected one JSON record per test example"):
        read_scored_run(tmp_path / "bad.jsonl", "entity_f1")
    assert not math.isnan(difference_interval([run], [run]).estimate)
    tags = [["B", "O"]] * 10
    student = read_scored_run(write_run(tmp_path / "s.jsonl", tags, tags), "entity_f1")
    silent = read_scored_run(write_run(tmp_path / "z.jsonl", tags, [["O", "O"]] * 10), "entity_f1")
    with pytest.raises(BiodistilError, match="the teacher scores 0"):  # no NaN in a record
        share_interval([student], [silent])


@pytest.mark.parametrize(("metric", "key", "labels", "options"), [
    ("binary_prf", "auroc", ["0", "1"], {"positive": "1"}),
    ("binary_prf", "f1", ["0", "1"], {"positive": "1"}),
    ("binary_prf", "accuracy", ["0", "1"], {}),
    ("accuracy_auroc", "auroc", ["no", "yes"], {}),
    ("micro_f1_excluding", "f1", ["False", "CPR:3", "CPR:4"], {"negative_labels": ["False"]}),
    ("accuracy_macro_f1", "accuracy", ["yes", "no", "maybe"], {}),
    ("accuracy_macro_f1", "macro_f1", ["yes", "no", "maybe"], {}),  # no per-example form: the metric itself
])
def test_a_resample_scores_what_the_metric_function_scores_on_the_drawn_examples(tmp_path, metric, key, labels,
                                                                                  options):
    """The per-example forms (counts, ranks) give the metric function's own value on any resample, ties and
    repeated examples included."""
    rng = np.random.default_rng(3)
    gold, predicted = rng.choice(labels, size=60).tolist(), rng.choice(labels, size=60).tolist()
    scores = rng.choice([0.1, 0.3, 0.5, 0.7], size=60)  # ties on purpose
    rows = [{"id": i, "gold": g, "predicted": p, "scores": [1 - s, s]}
            for i, (g, p, s) in enumerate(zip(gold, predicted, scores, strict=True))]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = read_scored_run(path, metric, key=key, positive_at=1, **options)
    spec = get_metric(metric)
    extra = {"positive_scores": scores} if "positive_scores" in spec.inputs else {}
    for _ in range(5):
        drawn = rng.integers(60, size=60)
        expected = spec([gold[i] for i in drawn], [predicted[i] for i in drawn],
                        **{name: value[drawn] for name, value in extra.items()}, **options)[key]
        assert run.score(drawn) == pytest.approx(expected, abs=1e-12)


def grid_of_runs(tmp_path: Path, rates: list[list[float]]) -> tuple[list[list], list]:
    """Groups of runs on 400 one-entity sentences, run [g][s] finding each entity with probability rates[g][s]
    (its own draw), and a teacher that finds them all."""
    gold = [["O", "B"] for _ in range(400)]
    groups = []
    for group, row in enumerate(rates):
        runs = []
        for seed, rate in enumerate(row):
            hit = np.random.default_rng(10 * group + seed).random(400) < rate
            runs.append(read_scored_run(write_run(tmp_path / f"g{group}s{seed}.jsonl", gold,
                                                  [["O", "B"] if h else ["O", "O"] for h in hit]), "entity_f1"))
        groups.append(runs)
    return groups, [read_scored_run(write_run(tmp_path / "t.jsonl", gold, gold), "entity_f1")]


def test_groups_of_runs_draw_the_groups_first_and_keep_their_spread(tmp_path):
    """Two distillation seeds (hit rates 0.6 and 0.9), each fine-tuned with three seeds close to their own rate: the
    two-level draw keeps the spread between the two groups, which six runs drawn flat mostly average away
    (sd of the mean ≈ 0.15/√2 against 0.15/√6 by hand)."""
    groups, teacher = grid_of_runs(tmp_path, [[rate + 0.01 * seed for seed in range(3)] for rate in (0.6, 0.9)])
    flat = share_interval([run for group in groups for run in group], teacher, resamples=800)
    grouped = share_interval(groups, teacher, resamples=800)
    assert grouped.estimate == pytest.approx(flat.estimate, abs=1e-12), "the estimate is the mean over every run"
    assert grouped.high - grouped.low > 1.4 * (flat.high - flat.low)
    assert grouped.runs == (6, 1) and grouped.groups == (2, 1)
    assert grouped.as_record()["groups"] == [2, 1] and "two-level" in grouped.as_record()["method"]


def test_groups_of_one_run_draw_as_the_flat_bootstrap(tmp_path):
    gold = [["O", "B"] for _ in range(50)]
    runs = [read_scored_run(write_run(tmp_path / f"s{seed}.jsonl", gold,
                                      [["O", "B"] if h else ["O", "O"] for h in np.random.default_rng(seed).random(50)
                                       < 0.7]), "entity_f1") for seed in range(3)]
    teacher = [read_scored_run(write_run(tmp_path / "t.jsonl", gold, gold), "entity_f1")]
    flat, one_each = share_interval(runs, teacher, resamples=300), share_interval([[r] for r in runs], teacher,
                                                                                  resamples=300)
    assert (one_each.low, one_each.high) == (flat.low, flat.high)
    assert flat.groups is None and one_each.groups == (3, 1)


def test_groups_that_share_their_seeds_draw_the_seeds_once_for_every_group(tmp_path):
    """Three distillation runs that do not differ, each fine-tuned with the same three seeds whose hit rates differ
    (0.5, 0.7, 0.9 in every run): the seeds' effect is shared by the runs, so the crossed draw keeps its spread (sd
    of the mean ≈ 0.16/√3), which nine runs drawn flat — or seeds drawn anew within each run — average away
    (≈ 0.16/√9): by hand a ratio of √3."""
    groups, teacher = grid_of_runs(tmp_path, [[0.5, 0.7, 0.9]] * 3)
    flat = share_interval([run for group in groups for run in group], teacher, resamples=800)
    crossed = share_interval(groups, teacher, resamples=800)
    assert crossed.estimate == pytest.approx(flat.estimate, abs=1e-12)
    assert crossed.high - crossed.low > 1.4 * (flat.high - flat.low)
    assert "crossed" in crossed.as_record()["method"]


@pytest.mark.parametrize("metric", ["entity_f1", "accuracy"])
def test_a_block_of_resamples_scored_at_once_gives_the_resample_by_resample_interval(tmp_path, metric):
    """The blocked form (counts times how often each resample drew each example) against the loop the module's
    docstring describes, written out here: per resample, each side's runs drawn, then the examples, and the mean of
    each drawn run's score on them."""
    rng = np.random.default_rng(5)
    if metric == "entity_f1":
        gold = [list(rng.choice(["O", "B-D", "I-D"], size=int(rng.integers(1, 6)))) for _ in range(45)]
        guess = [[[t if rng.random() < rate else "O" for t in g] for g in gold] for rate in (0.6, 0.7, 0.8, 0.9, 1.0)]
        runs = [read_scored_run(write_run(tmp_path / f"{k}.jsonl", gold, p), "entity_f1") for k, p in enumerate(guess)]
    else:
        gold = rng.choice(["yes", "no"], size=45).tolist()
        guess = [[g if rng.random() < rate else "maybe" for g in gold] for rate in (0.6, 0.7, 0.8, 0.9, 1.0)]
        runs = [read_scored_run(write_run(tmp_path / f"{k}.jsonl", gold, p), "accuracy_macro_f1", key="accuracy")
                for k, p in enumerate(guess)]
    students, reference, teachers = runs[:3], runs[3:4], runs[3:]
    draws = np.random.default_rng(11)
    by_hand = []
    for _ in range(300):
        sides = [[side[i] for i in draws.integers(len(side), size=len(side))] for side in (students, teachers)]
        drawn = draws.integers(45, size=45)
        student, teacher = (np.mean([run.score(drawn) for run in side]) for side in sides)
        by_hand.append(student / teacher)
    share = share_interval(students, teachers, resamples=300, seed=11)
    assert [share.low, share.high] == pytest.approx(list(np.nanquantile(by_hand, [0.025, 0.975])), abs=1e-12)
    rows = np.random.default_rng(2).integers(45, size=(7, 45))
    weights = np.stack([np.bincount(row, minlength=45) for row in rows])
    for run in runs:
        assert run.scores(rows, weights) == pytest.approx([run.score(row) for row in rows], abs=1e-12)
    gap = gap_interval(students, reference, teachers, resamples=50)
    assert gap.runs == (3, 1, 2) and gap.low <= gap.high
