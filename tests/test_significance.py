"""The one verdict rule (issue 35): a t-test on per-seed scores with the 95% confidence interval of the difference,
checked against values worked out by hand (t quantiles from tables: t_{0.975,1} = 12.706, t_{0.975,2} = 4.303)."""

import math

import pytest
from scipy import stats

from biodistil.tasks.significance import compare_scores, crossed_mean, holm, mean_estimate, seeds_needed


def test_welch_interval_and_p_value_by_hand():
    # a = (0.74, 0.75), b = (0.64, 0.65): s² = 5e-5 each, se = √(5e-5/2 + 5e-5/2) = 0.0070711, ν = 2
    result = compare_scores([0.74, 0.75], [0.64, 0.65])
    assert result.test == "Welch's t-test" and result.finding and result.verdict == "finding"
    assert result.difference == pytest.approx(0.10, abs=1e-12)
    assert result.low == pytest.approx(0.10 - 4.3027 * 0.0070711, abs=1e-4)
    assert result.high == pytest.approx(0.10 + 4.3027 * 0.0070711, abs=1e-4)
    # t = 0.10/0.0070711 = 14.142; for ν = 2, p = 1 − t/√(2 + t²) = 1 − 14.142/14.213 = 0.00496
    assert result.p_value == pytest.approx(0.00496, abs=1e-4)
    assert "95% CI +0.070 to +0.130, Welch's t-test" in result.describe(" F1") and "a finding" in result.describe()


def test_welch_degrees_of_freedom_for_unequal_spreads_by_hand():
    # a = (0.73, 0.60): s² = 0.00845; b = (0.64, 0.65): s² = 5e-5; se² = 0.00425, ν = se⁴ / (0.004225² + 0.000025²)
    result = compare_scores([0.73, 0.60], [0.64, 0.65])
    dof = 0.00425 ** 2 / (0.004225 ** 2 + 0.000025 ** 2)
    assert dof == pytest.approx(1.0118, abs=1e-4)
    assert not result.finding and result.low < 0 < result.high
    assert result.high - result.difference == pytest.approx(12.4 * math.sqrt(0.00425), rel=0.03)  # t_{0.975,1.01}
    # seeds for 80% power at α = 0.05: the noncentral t with 2n − 2 dof and noncentrality 0.02/√(0.0085/n) puts 80%
    # beyond ±t_{0.975, 2n−2} first at n = 168 (a simulation of 20,000 studies: 0.799 at 167 and 168 both — the
    # boundary lies between; the noncentral t decides it)
    assert result.seeds_needed == 168 and "would need about 168 seeds per arm" in result.describe()


def test_paired_test_by_hand():
    # differences (0.05, 0.03, 0.04): mean 0.04, s_d = 0.01, se = 0.01/√3 = 0.0057735, ν = 2
    result = compare_scores([0.80, 0.78, 0.79], [0.75, 0.75, 0.75], paired=True)
    assert result.test == "paired t-test" and result.finding
    assert result.low == pytest.approx(0.04 - 4.3027 * 0.0057735, abs=1e-4)
    with pytest.raises(ValueError, match="as many seeds"):
        compare_scores([0.8, 0.7], [0.7, 0.6, 0.5], paired=True)


def test_one_seed_or_no_spread_is_never_a_finding():
    assert compare_scores([0.9], [0.1]).verdict == "inconclusive"
    assert "one seed" in compare_scores([0.9], [0.1]).describe()
    flat = compare_scores([0.7, 0.7], [0.6, 0.6])
    assert not flat.finding and "no seed spread" in flat.describe()
    assert seeds_needed(0.0, 0.01, paired=False) is None
    # paired, effect 0.02 at a per-seed sd of 0.02 (d = 1): the one-sample t-test at α = 0.05 has 74% power at n = 9
    # and 80.3% at n = 10 (Cohen's tables: n = 10 for d = 1; a simulation of 20,000 studies: 0.743 and 0.803)
    assert seeds_needed(0.02, 0.0004, paired=True) == 10
    assert seeds_needed(0.02, 0.0004, paired=True, alpha=0.01) > 10, "a stricter level needs more seeds"


def test_a_comparison_looked_at_twice_is_tested_at_half_the_level_by_hand():
    """Bonferroni over the looks: the Welch example above at looks = 2 has p 2 × 0.00496 and the 97.5% interval:
    t_{0.9875, 2} = 0.975/√(2·0.9875·0.0125) = 6.205 (ν = 2: t = (2q − 1)/√(2q(1 − q))), half-width × 0.0070711."""
    once, twice = compare_scores([0.74, 0.75], [0.64, 0.65]), compare_scores([0.74, 0.75], [0.64, 0.65], looks=2)
    assert twice.p_value == pytest.approx(2 * once.p_value, rel=1e-9)
    assert twice.high - twice.difference == pytest.approx(6.205 * 0.0070711, abs=1e-3)
    assert "97.5% CI +0.056 to +0.144, Welch's t-test, 2 looks (Bonferroni)" in twice.describe()
    assert compare_scores([0.74, 0.75], [0.64, 0.65], looks=400).p_value == 1.0, "p is at most 1 (400 × 0.005)"


def test_holm_adjusts_a_tables_p_values_step_down_by_hand():
    """p = (0.01, 0.04, 0.03) → sorted 0.01·3 = 0.03, 0.03·2 = 0.06, max(0.06, 0.04·1) = 0.06: adjusted (0.03, 0.06,
    0.06); untested comparisons keep no p and do not count in the family."""
    from dataclasses import replace

    base = compare_scores([0.74, 0.75], [0.64, 0.65])
    family = [replace(base, p_value=p) for p in (0.01, 0.04, 0.03)] + [compare_scores([0.9], [0.1])]
    adjusted = holm(family)
    assert [c.p_holm for c in adjusted[:3]] == pytest.approx([0.03, 0.06, 0.06], abs=1e-12)
    assert [c.family for c in adjusted] == [3, 3, 3, 1] and adjusted[3].p_holm is None
    assert [c.finding for c in adjusted] == [True, False, False, False]
    assert "Holm p = 0.06 (family of 3)" in adjusted[1].describe()
    assert adjusted[1].seeds_needed is not None and adjusted[0].seeds_needed is None


def test_a_study_counts_a_look_for_each_summary_it_grew_past():
    from types import SimpleNamespace

    from biodistil.kd.study import looks

    run = lambda arm, seed, start=None: SimpleNamespace(task="gad", arm=arm, seed=seed, start=start)  # noqa: E731
    recipe = SimpleNamespace(earlier_looks=0)
    first = [run("kd", 1), run("kd", 2)]
    summary = {"runs": [{"task": "gad", "arm": "kd", "seed": s} for s in (1, 2)], "looks": 1}
    assert looks(recipe, first, None) == 1 and looks(recipe, first, summary) == 1, "nothing new: the same look"
    assert looks(recipe, [*first, run("kd", 3)], summary) == 2, "a seed added after the summary was read"
    assert looks(recipe, [*first, run("kd", 3)], {**summary, "looks": 2}) == 3
    assert looks(SimpleNamespace(earlier_looks=1), first, None) == 2, "a schedule changed after an earlier look"
    assert looks(recipe, [*first, run("kd", 1, start=2)], summary) == 2, "a start (distillation run) added"


def test_a_study_report_gives_each_arm_its_verdict_against_the_first_arm():
    from pathlib import Path

    from biodistil.kd.study import render_study

    def row(arm: str, scores: list[float]) -> dict:
        return {"task": "gad", "arm": arm, "command": "kd", "metric": "auroc", "seeds": len(scores),
                "mean": sum(scores) / len(scores), "sd": 0.0, "scores": scores, "init": 0.5, "teacher": 0.7,
                "gap_closed": 0.5}

    summary = {"rows": [row("finetune", [0.64, 0.65]), row("kd", [0.74, 0.75]), row("kd-general", [0.73, 0.60])],
               "seeds": [1, 2], "teachers": {}, "machine": {}}
    text = render_study(summary, Path("study"))
    assert "| gad | kd − finetune | +0.1000 auroc (95% CI +0.0696 to +0.1304, Welch's t-test, p = 0.005, Holm" in text
    # one family of two: kd's p 0.005 → 0.0099 (still a finding), kd-general's 0.81 stays 0.81; seeds at α/2
    assert "p = 0.005, Holm p = 0.0099 (family of 2)): a finding |" in text
    assert "| gad | kd-general − finetune | +0.0200 auroc (95% CI" in text and "204 seeds per arm" in text


def test_a_grid_of_starts_by_seeds_takes_the_crossed_variance_of_its_mean_by_hand():
    # rows (starts) 1 2 6 / 2 3 7: mean 3.5, row means 3, 4, column means 1.5, 2.5, 6.5, residuals all 0;
    # MS_rows = 3·(0.25 + 0.25)/1 = 1.5, MS_cols = 2·(4 + 1 + 9)/2 = 14, MS_res = 0;
    # Var(ȳ) = (1.5 + 14 − 0)/6 = 2.5833, ν = 15.5²/(1.5²/1 + 14²/2) = 2.3965
    estimate = crossed_mean([[1, 2, 6], [2, 3, 7]])
    assert estimate.mean == pytest.approx(3.5, abs=1e-12) and estimate.units == 2 and estimate.crossed
    assert estimate.variance == pytest.approx(15.5 / 6, abs=1e-9)
    assert estimate.dof == pytest.approx(15.5 ** 2 / (1.5 ** 2 + 14 ** 2 / 2), abs=1e-9)
    # the starts' means alone (3, 4: s²/n = 0.25) would miss the seeds' effect that every start shares
    assert estimate.variance > 10 * mean_estimate([3.0, 4.0]).variance


def test_a_grid_whose_seeds_add_nothing_is_the_t_test_on_its_starts_means():
    # columns equal within each row: MS_cols = MS_res = 0, so Var(ȳ) = MS_rows/6 = var(1, 3)/2 = 1 with 1 dof
    estimate = crossed_mean([[1, 1, 1], [3, 3, 3]])
    assert estimate.variance == pytest.approx(1.0, abs=1e-12) and estimate.dof == pytest.approx(1.0, abs=1e-12)
    assert crossed_mean([[0.5], [0.7], [0.9]]) == mean_estimate([0.5, 0.7, 0.9]), "one seed a start: per-run scores"


def test_welch_on_a_grid_and_per_seed_scores_by_hand():
    # grid above: V_a = 2.5833, ν_a = 2.3965; b = (0, 1, 2): V_b = 1/3, ν_b = 2;
    # se = √2.9167 = 1.7078, ν = 2.9167²/(2.5833²/2.3965 + (1/3)²/2) = 2.9949, t = 2.5/1.7078 = 1.4639
    result = compare_scores([[1, 2, 6], [2, 3, 7]], [0, 1, 2])
    v_a, dof_a = 15.5 / 6, 15.5 ** 2 / (1.5 ** 2 + 14 ** 2 / 2)
    se = math.sqrt(v_a + 1 / 3)
    dof = (v_a + 1 / 3) ** 2 / (v_a ** 2 / dof_a + (1 / 3) ** 2 / 2)
    assert dof == pytest.approx(2.9949, abs=1e-3)
    assert result.test == "Welch's t-test, starts × seeds crossed" and not result.finding
    assert result.difference == pytest.approx(2.5, abs=1e-12)
    assert result.p_value == pytest.approx(2 * stats.t.sf(2.5 / se, dof), abs=1e-9)
    assert result.high - result.difference == pytest.approx(stats.t.ppf(0.975, dof) * se, abs=1e-9)
    with pytest.raises(ValueError, match="grids"):
        compare_scores([[1, 2], [3, 4]], [[1, 2], [3, 4]], paired=True)


def test_a_grid_counts_the_starts_it_would_need():
    result = compare_scores([[1, 2, 6], [2, 3, 7]], [0, 1, 2])
    assert result.seeds_needed and f"about {result.seeds_needed} starts (each with its seeds) per arm" in \
        result.describe()
    assert "seeds per arm" in compare_scores([1.0, 2.0, 3.5], [2.0, 3.0, 5.0]).describe()
