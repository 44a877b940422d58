"""Confidence intervals and paired tests for per-sample outcomes (numpy only, seeded).

* ``bootstrap_ci``: percentile bootstrap of the mean of per-sample values (accuracy, IoU), resampling
  samples with a seeded generator. ``bootstrap_statistic_ci``: the same for a statistic that is not a
  mean of per-sample values (held-out R^2).
* ``paired_test``: exact two-sided McNemar test on paired binary outcomes (masked vs unmasked on the
  SAME samples): only discordant pairs carry information; p = P(Binomial(n_disc, 1/2) as extreme).
"""

from __future__ import annotations

from math import comb
from typing import Callable, Sequence

import numpy as np


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
