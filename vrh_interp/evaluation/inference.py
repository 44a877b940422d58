"""Valid tests behind the claims' verdicts (numpy only; seeded where random).

Each function returns a p-value that is valid for its stated null at the sample sizes the library uses, not only
asymptotically; ``docs/results/calibration.md`` (``evaluation.calibration``) measures that on simulated tables.

* ``sequential_rank_p``: is a head set *special*? Under the null "the scorer is no better than chance" the top-k
  is one more draw from the distribution of control sets, so its accuracy is ranked among the sets *including its
  own draw* (``statistics.empirical_p_value``: ``(1 + #{sets at least as harmful}) / (S + 1)``, ties against the
  top-k; floor ``1 / (S + 1)``, so a decision at level a needs ``S >= 1/a - 1`` sets: ``sets_for``), with sets
  drawn one at a time (Besag and Clifford 1991): stop once ``h`` sets
  were at least as harmful (``p = h / drawn``) or after ``S`` (``(1 + count) / (S + 1)``). A clearly ordinary
  top-k stops after about ``h / p`` sets; stopping depends only on the outcomes.
* ``drop_p``: does masking hurt at all? The exact one-sided McNemar test (``statistics.mcnemar_exact``'s
  discordant counts, the binomial tail of the pairs baseline right / masked wrong), for 0/1 outcomes.
* ``sign_flip_p``: the exact randomisation test of a mean of paired per-item differences > 0 (symmetric null),
  Monte Carlo over sign vectors with the +1 correction, for differences that are not 0/1.
* ``set_effect``: is the effect at least a stated size? ``theta = mean over control sets of accuracy - target's
  accuracy``. Crossed (every set on the same items), its error has two parts: items (the per-item differences)
  and sets (a finite sample of control sets estimates the mean of the set distribution); the standard error adds
  both, ``s_items^2 / n + s_sets^2 / S``, with a t reference on the Welch-Satterthwaite degrees of freedom.
  Clustered (``cluster_effect``: one fresh set per scene, on its referents), the scenes are independent units
  and the cluster-robust standard error on ``scenes - 1`` degrees of freedom holds both parts.
* ``betting_p``: a one-sided test of ``mean <= m`` for bounded i.i.d. values that is valid at every sample size
  (the hedged-capital test martingale of Waudby-Smith and Ramdas 2024 with aGRAPA bets; Ville's inequality
  makes ``1 / max_t K_t`` a p-value): used where a statistic is a plain mean of bounded per-item values.
* ``bonferroni``: the adjustment over a fixed family that the claims tables use (each claim at alpha / m: its
  verdict depends on its own data alone); ``holm``: Holm's step-down over a fixed family (not measured: p = 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ALPHA = 0.05


def _binom_tail(successes: int, trials: int) -> float:
    """P(Binomial(trials, 1/2) >= successes), exactly."""
    if trials <= 0 or successes <= 0:
        return 1.0
    total = sum(math.comb(trials, i) for i in range(successes, trials + 1))
    return float(min(1.0, total / 2 ** trials))


def sequential_rank_p(target: float, controls: Sequence[float], *, h: int = 5,
                      limit: int | None = None) -> tuple[float, int]:
    """``(p, sets used)``: Besag-Clifford sequential rank p-value over ``controls`` in their drawn order (module
    doc); ``limit`` caps the sets (default: all given)."""
    from vrh_interp.evaluation.statistics import empirical_p_value

    values = np.asarray(controls, dtype=float)[:limit]
    as_harmful = 0
    for used, value in enumerate(values, start=1):
        if value <= target:
            as_harmful += 1
            if as_harmful >= h:
                return h / used, used
    return (empirical_p_value(target, values) if values.size else 1.0), int(values.size)


def sets_for(level: float) -> int:
    """The fewest control sets whose rank p-value can reach ``level`` (``1 / (S + 1) <= level``)."""
    return max(1, math.ceil(1 / level - 1 - 1e-9))


def drop_p(baseline: Sequence[float], masked: Sequence[float]) -> tuple[float, int, int]:
    """``(p, lost, gained)``: exact one-sided McNemar p of "masking lowers accuracy" on 0/1 outcomes of the same
    items (``lost``: right unmasked, wrong masked; ``gained``: the reverse)."""
    from vrh_interp.evaluation.statistics import mcnemar_exact

    counts = mcnemar_exact(np.asarray(baseline, dtype=float) >= 0.5, np.asarray(masked, dtype=float) >= 0.5)
    lost, gained = int(counts["lost"]), int(counts["gained"])
    return _binom_tail(lost, lost + gained), lost, gained


def sign_flip_p(differences: Sequence[float], *, flips: int = 20000, seed: int = 0) -> float:
    """One-sided randomisation p of "the mean of ``differences`` > 0" (each item's sign flipped at random under
    the null), exact by enumeration up to 16 non-zero items, else Monte Carlo with the +1 correction."""
    values = np.asarray(differences, dtype=float)
    values = values[np.abs(values) > 1e-12]
    if values.size == 0:
        return 1.0
    observed = values.sum()
    if values.size <= 16:
        signs = ((np.arange(2 ** values.size)[:, None] >> np.arange(values.size)) & 1) * 2 - 1
        return float(np.mean(signs @ values >= observed - 1e-12))
    rng = np.random.default_rng(seed)
    signs = rng.integers(0, 2, size=(flips, values.size)) * 2 - 1
    return float((1 + np.sum(signs @ values >= observed - 1e-12)) / (flips + 1))


def _t_sf(t: float, df: float) -> float:
    """P(T_df >= t) for Student's t (regularised incomplete beta by continued fraction; no scipy)."""
    if not np.isfinite(t):
        return 0.0 if t > 0 else 1.0
    if df <= 0:
        return float("nan")
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return tail if t >= 0 else 1 - tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (Numerical Recipes' continued fraction)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1 - x)
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1e-30 if abs(d) < 1e-30 else d
        d = 1.0 / d
        c = 1.0 + numerator / c
        c = 1e-30 if abs(c) < 1e-30 else c
        f *= c * d
        if abs(1.0 - c * d) < 1e-12:
            break
    return front * (f - 1.0) / a


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on ``_t_sf``)."""
    low, high = -1e3, 1e3
    for _ in range(200):
        mid = (low + high) / 2
        if 1 - _t_sf(mid, df) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(frozen=True)
class Effect:
    """``theta = mean control-set accuracy - target accuracy`` on the same items, with its two variance parts."""

    estimate: float
    items: int
    sets: int
    var_items: float  # variance over items of the per-item differences (mean over sets - target)
    var_sets: float  # variance over sets of the set accuracies
    set_unit: str = "control sets"  # what ``sets`` counts: scenes in the clustered design (``cluster_effect``)

    @property
    def se(self) -> float:
        return math.sqrt(self.var_items / max(1, self.items) + (self.var_sets / self.sets if self.sets > 1 else 0.0))

    @property
    def df(self) -> float:
        """Welch-Satterthwaite degrees of freedom of the two parts."""
        a = self.var_items / max(1, self.items)
        b = self.var_sets / self.sets if self.sets > 1 else 0.0
        if a + b <= 0:
            return float("inf")
        den = ((a * a / (self.items - 1) if self.items > 1 else 0.0)
               + (b * b / (self.sets - 1) if self.sets > 1 else 0.0))
        return (a + b) ** 2 / den if den > 0 else float("inf")

    def p_above(self, value: float) -> float:
        """One-sided p of "theta <= value" (small: theta is above ``value``)."""
        return self._p(self.estimate - value)

    def p_below(self, value: float) -> float:
        """One-sided p of "theta >= value" (small: theta is below ``value``)."""
        return self._p(value - self.estimate)

    def _p(self, distance: float) -> float:
        if not np.isfinite(self.estimate):
            return float("nan")
        if self.se <= 0:
            return 0.0 if distance > 0 else 1.0
        return _t_sf(distance / self.se, self.df if np.isfinite(self.df) else 1e6)

    def interval(self, level: float = 1 - 2 * ALPHA) -> tuple[float, float]:
        if not np.isfinite(self.estimate):
            return (float("nan"), float("nan"))
        if self.se <= 0:
            return (self.estimate, self.estimate)
        q = t_quantile(1 - (1 - level) / 2, self.df if np.isfinite(self.df) else 1e6)
        return (self.estimate - q * self.se, self.estimate + q * self.se)

    def needed(self, boundary: float, level: float, power: float = 0.8) -> dict[str, int | None]:
        """Items (sets as now) and sets (items as now) that would likely decide against ``boundary`` at the
        one-sided ``level``: the variance decomposition, not one spread scaled by 1/sqrt(n). None: that lever
        alone cannot (its other part already exceeds the distance)."""
        from statistics import NormalDist

        distance = abs(self.estimate - boundary)
        if not np.isfinite(distance) or distance <= 1e-12:
            return {"items": None, "sets": None}
        z = NormalDist().inv_cdf(1 - level) + NormalDist().inv_cdf(power)
        budget = (distance / z) ** 2  # the variance that would decide
        part_sets = self.var_sets / self.sets if self.sets > 1 else 0.0
        part_items = self.var_items / max(1, self.items)
        items = math.ceil(self.var_items / (budget - part_sets)) if budget > part_sets and self.var_items > 0 else None
        sets = math.ceil(self.var_sets / (budget - part_items)) if budget > part_items and self.var_sets > 0 else None
        return {"items": items, "sets": sets}


def set_effect(target: Sequence[float], controls: np.ndarray) -> Effect:
    """``Effect`` of ``controls`` (sets x n outcomes) against ``target`` (n outcomes) on the same items. NaN marks
    an item a set was not answered on: a PARTITION (each item answered under exactly one set of the kind, e.g. one
    fresh set per scene) is the clustered design (``cluster_effect``); other partial tables are refused."""
    target = np.asarray(target, dtype=float)
    controls = np.asarray(controls, dtype=float)
    if controls.ndim != 2 or controls.shape[1] != target.shape[0] or controls.shape[0] == 0:
        raise ValueError(f"controls must be (sets x {target.shape[0]}), got {controls.shape}")
    answered = np.isfinite(controls)
    if not answered.all():
        if not np.all(answered.sum(axis=0) == 1):
            raise ValueError("a partial control table must be a partition: every item answered under exactly one "
                             "set (one fresh set per scene); pass the full (sets x items) table otherwise")
        return cluster_effect(target, np.nansum(controls, axis=0), np.argmax(answered, axis=0))
    per_item = controls.mean(axis=0) - target
    set_acc = controls.mean(axis=1)
    n, sets = target.shape[0], controls.shape[0]
    # each variance as if one more unit deviated by the outcome's resolution (1 per item, 1/n per set): a table
    # whose outcomes never vary (12 items wrong everywhere) has no zero standard error to decide on
    var_items = (float(np.sum((per_item - per_item.mean()) ** 2)) + 1.0) / n
    var_sets = (float(np.sum((set_acc - set_acc.mean()) ** 2)) + 1.0 / n ** 2) / sets if sets > 1 else 0.0
    return Effect(float(per_item.mean()), n, sets, var_items, var_sets)


def cluster_effect(target: Sequence[float], control: Sequence[float], cluster: Sequence[int]) -> Effect:
    """``Effect`` of the clustered design: item i answered under ``control[i]`` of its cluster's own fresh set
    (``cluster[i]``; the items of a cluster share the set) and under the ``target``. The estimand is the same as
    the crossed design's (the mean over the set distribution of a set's accuracy, minus the target's): each item's
    set is a fresh draw, so ``mean(control - target)`` is unbiased, and the clusters are independent units, so
    its variance is the cluster-robust one (between-set and item parts together) on ``clusters - 1`` degrees of
    freedom. Reported as ``var_sets`` over ``sets = clusters`` (``var_items`` 0): more clusters (scenes, each with
    its own set) is the one lever, and ``Effect.needed`` says how many. As in ``set_effect``, one more unit that
    deviates by the outcome's resolution is added, so a table whose outcomes never vary has no zero variance."""
    target = np.asarray(target, dtype=float)
    diff = np.asarray(control, dtype=float) - target
    cluster = np.asarray(cluster)
    labels, index = np.unique(cluster, return_inverse=True)
    g, n = labels.size, target.size
    estimate = float(diff.mean())
    totals = np.bincount(index, weights=diff, minlength=g)
    sizes = np.bincount(index, minlength=g).astype(float)
    residual = totals - sizes * estimate  # each cluster's total deviation
    mean_size = n / g
    # var(estimate) = sum residual^2 / n^2 * g / (g - 1); as var_sets / sets with sets = g
    var_estimate = (float(np.sum(residual ** 2)) + mean_size ** 2) / n ** 2 * (g / max(1, g - 1))
    return Effect(estimate, n, g, 0.0, var_estimate * g, "scenes (each with its own control sets)")


def betting_p(values: Sequence[float], threshold: float, *, low: float = 0.0, high: float = 1.0,
              cap: float = 0.5) -> float:
    """One-sided p of "mean <= ``threshold``" for values in [``low``, ``high``], in the given order (module
    doc). ``cap`` bounds each bet so a single item can lose at most that share of the capital."""
    x = (np.asarray(values, dtype=float) - low) / (high - low)
    m = (threshold - low) / (high - low)
    if x.size == 0 or m >= 1:
        return 1.0
    if m <= 0:
        return 0.0 if np.any(x > 0) else 1.0
    log_capital, best = 0.0, 0.0
    total, squares = 0.0, 0.0
    for t, value in enumerate(x):
        mean = (0.5 + total) / (t + 1)
        var = (0.25 + squares) / (t + 1)
        bet = (mean - m) / (var + (mean - m) ** 2)
        bet = min(max(bet, 0.0), cap / m)
        log_capital += math.log1p(bet * (value - m))
        best = max(best, log_capital)
        total += value
        squares += (value - mean) ** 2
    return float(min(1.0, math.exp(-best)))


def bonferroni(pvalues: Sequence[float], *, family: int | None = None) -> list[float]:
    """Bonferroni-adjusted p-values over a FIXED family of ``family`` hypotheses (default: the values given): each
    ``min(1, m p)``, so a claim's verdict depends on its own data alone (what Holm's step-down gives up: there a
    skipped claim changes the levels of the others). NaN (not tested) stays NaN."""
    values = np.asarray(pvalues, dtype=float)
    m = max(len(values), family or 0)
    return np.where(np.isfinite(values), np.minimum(1.0, m * values), np.nan).tolist()


def holm(pvalues: Sequence[float], *, family: int | None = None) -> list[float]:
    """Holm step-down adjusted p-values over a family of ``family`` hypotheses (default: the values given). NaN
    means "not tested": it counts towards the family as p = 1 and stays NaN."""
    values = np.asarray(pvalues, dtype=float)
    m = max(len(values), family or 0)
    filled = np.where(np.isfinite(values), values, 1.0)
    adjusted = np.full(values.shape, np.nan)
    running = 0.0
    for rank, index in enumerate(np.argsort(filled, kind="stable")):
        running = max(running, min(1.0, (m - rank) * filled[index]))
        if np.isfinite(values[index]):
            adjusted[index] = running
    return adjusted.tolist()
