"""The one verdict rule for a difference between two arms' per-seed scores: a t-test with the 95% confidence interval of
the difference (`compare_scores`). A difference is a *finding* only when that interval excludes 0; otherwise it is
*inconclusive*, with about how many seeds per arm the observed spread would need for the interval to exclude 0.

- Paired (the arms share seeds and data order, so seed i of one arm is comparable with seed i of the other): the
  differences d_i = a_i − b_i, mean d̄, se = s_d/√n, n − 1 degrees of freedom.
- Otherwise Welch's t-test: se = √(s_a²/n_a + s_b²/n_b), degrees of freedom by Welch–Satterthwaite
  ν = se⁴ / ((s_a²/n_a)²/(n_a − 1) + (s_b²/n_b)²/(n_b − 1)).
- Interval: d̄ ± t_{0.975, ν}·se; p = 2·(1 − F_t(|d̄|/se; ν)).
- One seed on either side, or no spread at all (every seed equal): no test; inconclusive.
- Looking, then adding: a comparison whose arms were extended (more seeds) or re-scheduled after k − 1 earlier looks
  at their scores (`looks` = k) is tested at α/k, Bonferroni over the looks: its p is k·p (at most 1) and its interval
  the 1 − α/k interval, so a procedure that may stop at any of its k looks still calls a finding at most α of the time
  under no effect.
- Several comparisons in one table are one family (`holm`): Holm's step-down adjustment, p_(i) ordered ascending
  among the m tested, p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)); a finding only when p̃ < 0.05. The interval
  printed stays the comparison's own 95% interval.
- Seeds needed (an inconclusive comparison): the smallest n per arm at which the two-sided t-test at the family's
  worst level, α/m, has 80% power against the observed difference at the observed spread (noncentral t).
"""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scipy import stats

LEVEL = 0.95
ALPHA = 1 - LEVEL
POWER = 0.8
MAX_SEEDS = 1000


@dataclass(frozen=True)
class Comparison:
    """mean(first) − mean(second) and what may be said of it."""

    difference: float
    test: str  # "paired t-test" | "Welch's t-test" | "" (no test)
    low: float | None = None  # the 95% confidence interval of the difference
    high: float | None = None
    p_value: float | None = None
    seeds_needed: int | None = None  # inconclusive: seeds per arm for 80% power (None: not estimable)
    why_no_test: str = ""
    p_holm: float | None = None  # Holm-adjusted within its family (`holm`); None: a comparison on its own
    family: int = 1  # how many tested comparisons share the family
    looks: int = 1  # the scores were looked at this many times before they were final (`compare_scores`)
    variance: float = 0.0  # of one seed's difference (paired) or the sum of the arms' variances: for seeds_needed
    paired: bool = False

    @property
    def adjusted_p(self) -> float | None:
        return self.p_holm if self.p_holm is not None else self.p_value

    @property
    def finding(self) -> bool:
        return self.adjusted_p is not None and self.adjusted_p < ALPHA

    @property
    def verdict(self) -> str:
        return "finding" if self.finding else "inconclusive"

    def describe(self, unit: str = "", digits: int = 3) -> str:
        """E.g. "+0.082 F1 (95% CI +0.041 to +0.123, Welch's t-test, p = 0.003): a finding"."""
        value = f"{self.difference:+.{digits}f}{unit}"
        if self.low is None:
            return f"{value} ({self.why_no_test}): inconclusive"
        level = f"{100 * (1 - ALPHA / self.looks):g}%"
        interval = f"{level} CI {self.low:+.{digits}f} to {self.high:+.{digits}f}, {self.test}, p = {self.p_value:.2g}"
        if self.p_holm is not None and self.family > 1:
            interval += f", Holm p = {self.p_holm:.2g} (family of {self.family})"
        if self.finding:
            return f"{value} ({interval}): a finding"
        needed = f"would need about {self.seeds_needed} seeds per arm" if self.seeds_needed else \
            "no difference to find at this spread"
        return f"{value} ({interval}): inconclusive — {needed}"


def compare_scores(first: Sequence[float], second: Sequence[float], paired: bool = False, looks: int = 1
                   ) -> Comparison:
    """The verdict on mean(first) − mean(second) from per-seed scores (`paired`: seed i of both arms shares its seed
    and data order; then both need the same number of seeds; `looks`: how many times the arms' scores were looked at
    before this result was final, counting this one)."""
    first, second = [float(x) for x in first], [float(x) for x in second]
    difference = statistics.fmean(first) - statistics.fmean(second)
    if min(len(first), len(second)) < 2:
        return Comparison(difference, "", why_no_test="one seed: no spread to test against")
    if paired:
        if len(first) != len(second):
            raise ValueError(f"a paired comparison needs as many seeds on both sides ({len(first)} vs {len(second)})")
        variance = statistics.variance([a - b for a, b in zip(first, second, strict=True)])
        se, dof, test = math.sqrt(variance / len(first)), len(first) - 1.0, "paired t-test"
    else:
        var_a, var_b = statistics.variance(first), statistics.variance(second)
        se, dof, test = math.sqrt(var_a / len(first) + var_b / len(second)), _welch_dof(var_a, len(first), var_b,
                                                                                        len(second)), "Welch's t-test"
        variance = var_a + var_b  # of a difference of one seed each: se(n)² = variance / n at n seeds per arm
    if se == 0:
        spread = "the per-seed differences do not vary" if paired else "every seed scored the same"
        return Comparison(difference, "", why_no_test=f"no seed spread: {spread}")
    half = float(stats.t.ppf(1 - ALPHA / (2 * looks), dof)) * se
    p_value = min(1.0, looks * float(2 * stats.t.sf(abs(difference) / se, dof)))
    test += f", {looks} looks (Bonferroni)" if looks > 1 else ""
    result = Comparison(difference, test, difference - half, difference + half, p_value, variance=variance,
                        paired=paired, looks=looks)
    return _with_seeds_needed(result)


def holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The comparisons of one table as a family: each tested one with its Holm-adjusted p (`p_holm`, see the module
    docstring) and the family's size; the untested ones as they are. Order kept."""
    tested = sorted((i for i, c in enumerate(comparisons) if c.p_value is not None),
                    key=lambda i: comparisons[i].p_value)
    adjusted, running = list(comparisons), 0.0
    for rank, index in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * comparisons[index].p_value))
        adjusted[index] = _with_seeds_needed(replace(comparisons[index], p_holm=running, family=len(tested)))
    return adjusted


def _with_seeds_needed(result: Comparison) -> Comparison:
    if result.finding:
        return replace(result, seeds_needed=None)
    return replace(result, seeds_needed=seeds_needed(result.difference, result.variance, result.paired,
                                                     ALPHA / (result.family * result.looks)))


def _welch_dof(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    parts = (var_a / n_a, var_b / n_b)
    denominator = parts[0] ** 2 / (n_a - 1) + parts[1] ** 2 / (n_b - 1)
    return (sum(parts) ** 2) / denominator if denominator > 0 else float(n_a + n_b - 2)


def seeds_needed(difference: float, variance: float, paired: bool, alpha: float = ALPHA) -> int | None:
    """The smallest n (seeds per arm) at which the two-sided t-test at level `alpha` has `POWER` against `difference`
    at `variance` (noncentral t, noncentrality |difference|/√(variance/n)): with `paired`, the variance of the
    per-seed differences and dof = n − 1; else the sum of the arms' variances and dof = 2n − 2 (two arms of n seeds).
    None when the difference is 0 or more than MAX_SEEDS would be needed."""
    if difference == 0 or variance <= 0:
        return None
    for n in range(2, MAX_SEEDS + 1):
        dof = n - 1.0 if paired else 2.0 * n - 2.0
        critical = stats.t.ppf(1 - alpha / 2, dof)
        shift = abs(difference) / math.sqrt(variance / n)
        if stats.nct.sf(critical, dof, shift) + stats.nct.cdf(-critical, dof, shift) >= POWER:
            return n
    return None
