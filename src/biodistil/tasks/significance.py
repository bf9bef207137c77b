"""The one verdict rule for a difference between two arms' per-seed scores: a t-test with the 95% confidence interval of
the difference (`compare_scores`). A difference is a *finding* only when that interval excludes 0; otherwise it is
*inconclusive*, with about how many seeds per arm the observed spread would need for the interval to exclude 0.

- Paired (the arms share seeds and data order, so seed i of one arm is comparable with seed i of the other): the
  differences d_i = a_i − b_i, mean d̄, se = s_d/√n, n − 1 degrees of freedom.
- Otherwise Welch's t-test: se = √(s_a²/n_a + s_b²/n_b), degrees of freedom by Welch–Satterthwaite
  ν = se⁴ / ((s_a²/n_a)²/(n_a − 1) + (s_b²/n_b)²/(n_b − 1)).
- An arm may instead give a grid: its runs by start (rows: e.g. distillation runs) × seed (columns: the same
  fine-tuning seeds for every start, so starts and seeds are *crossed*, not nested). Its mean is then estimated under
  the crossed random-effects model y_ij = μ + r_i + c_j + e_ij, whose variance is
  Var(ȳ) = σ_r²/n_r + σ_c²/n_c + σ_e²/(n_r·n_c), from the two-way ANOVA's mean squares (E MS_rows = σ_e² + n_c·σ_r²,
  E MS_cols = σ_e² + n_r·σ_c², E MS_res = σ_e²; a negative component is set to 0), with Satterthwaite's degrees of
  freedom for that sum of mean squares. The starts' means alone would leave out the seeds' own variance: every start
  shares the same few seeds, so a seed that helps one arm helps all of its runs alike (`crossed_mean`). Welch's
  test then takes se² = V_a + V_b and ν = (V_a + V_b)² / (V_a²/ν_a + V_b²/ν_b), which is the formula above for
  plain per-seed scores (V = s²/n, ν = n − 1).
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
  worst level, α/m, has 80% power against the observed difference at the observed spread (noncentral t). For a
  grid the unit is a start (with its seeds): its variance n_r·V, i.e. more starts each fine-tuned as these were.
"""

import math
import numbers
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
    crossed: bool = False  # an arm was a grid of starts × seeds: `seeds_needed` counts starts

    @property
    def adjusted_p(self) -> float | None:
        return self.p_holm if self.p_holm is not None else self.p_value

    @property
    def finding(self) -> bool:
        return self.adjusted_p is not None and self.adjusted_p < ALPHA

    @property
    def unit(self) -> str:
        """What `seeds_needed` counts: seeds, or the starts of a grid (each fine-tuned with the same seeds)."""
        return "starts (each with its seeds)" if self.crossed else "seeds"

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
        needed = f"would need about {self.seeds_needed} {self.unit} per arm" if self.seeds_needed else \
            "no difference to find at this spread"
        return f"{value} ({interval}): inconclusive — {needed}"


Scores = Sequence[float] | Sequence[Sequence[float]]  # per seed, or a grid: starts (rows) × the same seeds


@dataclass(frozen=True)
class MeanEstimate:
    """An arm's mean score, the estimated variance of that mean, its degrees of freedom and its units (seeds, or the
    starts of a grid)."""

    mean: float
    variance: float
    dof: float
    units: int
    crossed: bool = False  # from a grid of several starts × several seeds


def crossed_mean(grid: Sequence[Sequence[float]]) -> MeanEstimate:
    """The mean of a grid of scores, starts (rows) × seeds (columns, the same seeds in every row), and its variance
    under the crossed random-effects model (see the module docstring); one row or one column: the t-test's s²/n."""
    rows = [[float(x) for x in row] for row in grid]
    n_r, n_c = len(rows), len(rows[0])
    if any(len(row) != n_c for row in rows):
        raise ValueError(f"a grid of starts × seeds needs every start with the same seeds ({[len(r) for r in rows]})")
    cells = [x for row in rows for x in row]
    mean = statistics.fmean(cells)
    if n_r == 1 or n_c == 1:
        return mean_estimate(cells)
    row_means = [statistics.fmean(row) for row in rows]
    col_means = [statistics.fmean(col) for col in zip(*rows, strict=True)]
    ms_rows = n_c * sum((m - mean) ** 2 for m in row_means) / (n_r - 1)
    ms_cols = n_r * sum((m - mean) ** 2 for m in col_means) / (n_c - 1)
    ms_res = sum((rows[i][j] - row_means[i] - col_means[j] + mean) ** 2
                 for i in range(n_r) for j in range(n_c)) / ((n_r - 1) * (n_c - 1))
    # Var(ȳ)·n_r·n_c = n_c·σ_r² + n_r·σ_c² + σ_e², each σ² ≥ 0: (coefficient, mean square, its dof) terms
    terms = [(1.0, ms_res, (n_r - 1.0) * (n_c - 1.0))]
    for ms, dof in ((ms_rows, n_r - 1.0), (ms_cols, n_c - 1.0)):
        if ms > ms_res:
            terms += [(1.0, ms, dof)]
            terms[0] = (terms[0][0] - 1.0, ms_res, terms[0][2])
    total = sum(c * ms for c, ms, _ in terms)
    parts = sum((c * ms) ** 2 / dof for c, ms, dof in terms if c)
    return MeanEstimate(mean, total / (n_r * n_c), total ** 2 / parts if parts else n_r * n_c - 1.0, n_r, True)


def mean_estimate(scores: Scores) -> MeanEstimate:
    """Per-seed scores (a mean over n seeds: s²/n, n − 1 degrees of freedom) or a grid of starts × seeds."""
    if _is_grid(scores):
        return crossed_mean(scores)  # type: ignore[arg-type]
    values = [float(x) for x in scores]  # type: ignore[arg-type]
    if len(values) < 2:
        return MeanEstimate(statistics.fmean(values), 0.0, 0.0, len(values))
    return MeanEstimate(statistics.fmean(values), statistics.variance(values) / len(values), len(values) - 1.0,
                        len(values))


def compare_scores(first: Scores, second: Scores, paired: bool = False, looks: int = 1) -> Comparison:
    """The verdict on mean(first) − mean(second) from per-seed scores, or from grids of starts × seeds (crossed; not
    with `paired`) (`paired`: seed i of both arms shares its seed and data order; then both need the same number of
    seeds; `looks`: how many times the arms' scores were looked at before this result was final, counting this one)."""
    a, b = mean_estimate(first), mean_estimate(second)
    difference = a.mean - b.mean
    if min(a.units, b.units) < 2:
        return Comparison(difference, "", why_no_test="one seed: no spread to test against")
    if paired:
        if _is_grid(first) or _is_grid(second):
            raise ValueError("a paired comparison takes per-seed scores, not grids of starts × seeds")
        if len(first) != len(second):
            raise ValueError(f"a paired comparison needs as many seeds on both sides ({len(first)} vs {len(second)})")
        variance = statistics.variance([float(x) - float(y) for x, y in zip(first, second, strict=True)])
        se, dof, test = math.sqrt(variance / len(first)), len(first) - 1.0, "paired t-test"
    else:
        se = math.sqrt(a.variance + b.variance)
        dof = _satterthwaite(a, b)
        test = "Welch's t-test" + (", starts × seeds crossed" if a.crossed or b.crossed else "")
        variance = a.units * a.variance + b.units * b.variance  # of one unit each: se(n)² = variance / n
    if se == 0:
        spread = "the per-seed differences do not vary" if paired else "every seed scored the same"
        return Comparison(difference, "", why_no_test=f"no seed spread: {spread}")
    half = float(stats.t.ppf(1 - ALPHA / (2 * looks), dof)) * se
    p_value = min(1.0, looks * float(2 * stats.t.sf(abs(difference) / se, dof)))
    test += f", {looks} looks (Bonferroni)" if looks > 1 else ""
    result = Comparison(difference, test, difference - half, difference + half, p_value, variance=variance,
                        paired=paired, looks=looks, crossed=a.crossed or b.crossed)
    return _with_seeds_needed(result)


def _is_grid(scores: Scores) -> bool:
    return len(scores) > 0 and not isinstance(scores[0], numbers.Real)


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


def _satterthwaite(a: MeanEstimate, b: MeanEstimate) -> float:
    """ν = (V_a + V_b)² / (V_a²/ν_a + V_b²/ν_b): Welch's degrees of freedom when each V is s²/n with n − 1."""
    denominator = (a.variance ** 2 / a.dof if a.dof else 0.0) + (b.variance ** 2 / b.dof if b.dof else 0.0)
    return (a.variance + b.variance) ** 2 / denominator if denominator > 0 else a.dof + b.dof


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
