"""Confidence intervals and paired tests for per-sample outcomes (numpy only, seeded).

* ``bootstrap_ci``: percentile bootstrap of the mean of per-sample values (accuracy, IoU), resampling
  samples with a seeded generator.
* ``paired_test``: exact two-sided McNemar test on paired binary outcomes (masked vs unmasked on the
  SAME samples): only discordant pairs carry information; p = P(Binomial(n_disc, 1/2) as extreme).
"""

from __future__ import annotations

from math import comb
from typing import Sequence

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
