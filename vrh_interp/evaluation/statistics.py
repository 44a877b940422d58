"""Confidence intervals and paired tests for per-sample outcomes (numpy; pandas for tied ranks; seeded).

* ``bootstrap_ci``: percentile bootstrap of the mean of per-sample values (accuracy, IoU), resampling
  samples with a seeded generator. ``bootstrap_statistic_ci``: the same for a statistic that is not a
  mean of per-sample values (held-out R^2).
* ``mcnemar_exact``: exact two-sided McNemar test on paired binary outcomes (masked vs unmasked on the
  SAME samples): only discordant pairs carry information; p = P(Binomial(n_disc, 1/2) as extreme).

Set-level statistics for controls (``random_set_distribution``, ``empirical_p_value``,
``two_level_bootstrap_ci``, ``set_level_verdict``). The unit of a random control is the HEAD SET, not the
sample: which heads a draw happens to hit moves accuracy far more than which samples are evaluated (on toy A
at k=3, 20 random sets range 0.31-0.85). Pooling the samples of a few sets and bootstrapping them treats
every answer as independent and ignores that between-set spread, so its interval is too narrow and a verdict
built on it can call a difference "separated" that another handful of sets would erase. Hence: the top-k set
is compared with the DISTRIBUTION of set accuracies (empirical p-value), and the interval for the control's
mean resamples sets first, then samples within each resampled set.
"""

from __future__ import annotations

from math import comb
from typing import Callable, Sequence

import numpy as np
import pandas as pd


def bootstrap_ci(values: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return (float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha)))


def mcnemar_exact(before: Sequence[bool], after: Sequence[bool]) -> dict[str, float]:
    """Exact McNemar test; returns discordant counts and the two-sided p-value."""
    a = np.asarray(before, dtype=bool)
    b = np.asarray(after, dtype=bool)
    if a.shape != b.shape:
        raise ValueError("paired outcomes must have the same length")
    lost = int((a & ~b).sum())  # correct before, wrong after
    gained = int((~a & b).sum())
    n = lost + gained
    if n == 0:
        return {"lost": 0, "gained": 0, "p_value": 1.0}
    k = min(lost, gained)
    p = sum(comb(n, i) for i in range(k + 1)) / 2 ** n * 2
    return {"lost": lost, "gained": gained, "p_value": float(min(1.0, p))}


def bootstrap_statistic_ci(statistic: Callable[[np.ndarray], float], n: int, *, confidence: float = 0.95,
                           resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap of any statistic of ``n`` samples (R^2 is not a mean of per-sample values).

    ``statistic(indices)`` computes the statistic on the samples at ``indices`` (drawn with replacement by
    the same seeded generator as ``bootstrap_ci``); non-finite resamples (e.g. R^2 of a resample whose
    targets are all equal) are dropped.
    """
    if n == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    values = np.array([statistic(row) for row in draws], dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return (float("nan"), float("nan"))
    alpha = (1 - confidence) / 2
    return (float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha)))


QUANTILES: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)


def random_set_distribution(accuracies: Sequence[float]) -> dict[str, float]:
    """Mean, sample sd (ddof=1; NaN for one set) and the 5/25/50/75/95 % quantiles (numpy's linear
    interpolation) of the control sets' accuracies; keys ``sets``, ``mean``, ``sd``, ``q05`` .. ``q95``."""
    data = np.asarray(accuracies, dtype=float)
    out: dict[str, float] = {"sets": int(data.size)}
    if data.size == 0:
        return {**out, "mean": float("nan"), "sd": float("nan"),
                **{f"q{round(100 * q):02d}": float("nan") for q in QUANTILES}}
    out["mean"] = float(data.mean())
    out["sd"] = float(data.std(ddof=1)) if data.size > 1 else float("nan")
    out.update({f"q{round(100 * q):02d}": float(np.quantile(data, q)) for q in QUANTILES})
    return out


def empirical_p_value(top_accuracy: float, control_accuracies: Sequence[float]) -> float:
    """One-sided empirical p-value that the top-k set is more harmful than sets drawn like the control:
    (1 + #control sets with accuracy <= top-k's) / (1 + #sets).

    A set at least as harmful (accuracy as low or lower) counts against the top-k, ties included, and the +1
    counts the top-k set itself (the permutation-test convention: the p-value is never 0). With S sets the
    smallest possible value is 1/(S + 1), so p <= 0.05 needs at least 19 sets and no set as harmful.
    """
    data = np.asarray(control_accuracies, dtype=float)
    if data.size == 0:
        return float("nan")
    return float((1 + int((data <= top_accuracy).sum())) / (1 + data.size))


def two_level_bootstrap_ci(outcomes: np.ndarray | Sequence[Sequence[float]], *, confidence: float = 0.95,
                           resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile interval for the mean accuracy of the control's head sets, resampling at both levels.

    ``outcomes`` is a (sets x samples) array of per-sample values (1.0 correct, 0.0 wrong), every set
    evaluated on the same samples. Each resample draws, with one ``np.random.default_rng(seed)``: first
    ``sets`` set indices with replacement (``rng.integers(0, sets, size=sets)``), then for those sets a
    (sets x samples) block of sample indices with replacement (``rng.integers(0, samples, size=(sets,
    samples))``, row i for the i-th drawn set, so a set drawn twice gets two independent sample draws); the
    statistic is the mean over drawn sets of each set's mean over its drawn samples. Between-set spread
    enters through the first level, sampling noise through the second.
    """
    data = np.asarray(outcomes, dtype=float)
    if data.ndim != 2:
        raise ValueError(f"outcomes must be a (sets x samples) table, got shape {data.shape}")
    sets, samples = data.shape
    if sets == 0 or samples == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for b in range(resamples):
        chosen = rng.integers(0, sets, size=sets)
        picks = rng.integers(0, samples, size=(sets, samples))
        means[b] = data[chosen[:, None], picks].mean()
    alpha = (1 - confidence) / 2
    return (float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha)))


def set_level_verdict(top_accuracy: float, mcnemar_p: float, controls: dict[str, Sequence[float]], *,
                      alpha: float = 0.05) -> tuple[str, str]:
    """``(verdict, reason)`` for "masking the top-k is more harmful than masking sets drawn like each control".

    * ``holds``: the drop vs the unmasked baseline is significant (McNemar p < ``alpha``) AND against EVERY
      control the empirical p-value is <= ``alpha`` (a uniform control alone mixes "retrieval" with "breaks
      everything"; the layer-matched one tells them apart, so the claim must survive both);
    * ``does not hold``: no significant drop, or the top-k is not more harmful than some control on average
      (accuracy >= that control's mean set accuracy), or there is no control at all;
    * ``inconclusive``: a significant drop, below every control's mean, but too many control sets are as
      harmful (or too few sets were drawn for p to reach ``alpha``: fewer than 1/alpha - 1).
    """
    if not controls:
        return "does not hold", "no control sets"
    worse = []
    for name, accuracies in controls.items():
        if len(accuracies) == 0:
            return "does not hold", f"no {name} control sets"
        if top_accuracy >= float(np.mean(accuracies)):
            worse.append(name)
    if not mcnemar_p < alpha:
        return "does not hold", f"no significant drop vs baseline (McNemar p={mcnemar_p:.2g})"
    if worse:
        return "does not hold", f"not more harmful than the {', '.join(worse)} sets on average"
    pvalues = {name: empirical_p_value(top_accuracy, accuracies) for name, accuracies in controls.items()}
    failing = [f"{name} p={p:.3g}" for name, p in pvalues.items() if p > alpha]
    if failing:
        return "inconclusive", "too many control sets as harmful: " + ", ".join(failing)
    return "holds", ", ".join(f"{name} p={p:.3g}" for name, p in pvalues.items())


def _ranks(values: np.ndarray) -> np.ndarray:
    return pd.Series(values).rank(method="average").to_numpy()


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def spearman_permutation_p(a: np.ndarray, b: np.ndarray, *, permutations: int = 10000, seed: int = 0) -> float:
    """One-sided permutation p-value of Spearman's rho of ``a`` and ``b`` being this large by chance:
    (1 + #pairings with rho >= the observed) / (1 + permutations), ``b``'s ranks shuffled (seeded). NaN when
    rho is undefined (no variation)."""
    ra, rb = _ranks(np.asarray(a, dtype=float)), _ranks(np.asarray(b, dtype=float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    za, zb = (ra - ra.mean()) / ra.std(), (rb - rb.mean()) / rb.std()
    observed = float(np.mean(za * zb))
    rng = np.random.default_rng(seed)
    shuffled = np.array([zb[rng.permutation(len(zb))] for _ in range(permutations)])
    null = shuffled @ za / len(za)
    return float((1 + np.sum(null >= observed - 1e-12)) / (1 + permutations))


def kendall_tau_b(a: np.ndarray, b: np.ndarray) -> float:
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), k=1)
    x, y = da[upper], db[upper]
    concordant_minus_discordant = float((x * y).sum())
    denom = np.sqrt(float((x != 0).sum()) * float((y != 0).sum()))
    return concordant_minus_discordant / denom if denom else float("nan")
