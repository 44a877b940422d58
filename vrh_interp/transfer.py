"""Comparing head scores of two models that share a language backbone (the paper's sec. 5.3).

Overlap statistics come with a permutation baseline: the same statistic for random rankings
(seeded shuffles), so "3 of the top 5 heads coincide" can be read against chance (expected k^2/N).
Rank correlations are Spearman (Pearson of ranks) and Kendall tau-b (numpy, O(N^2) pairs).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from vrh_interp.heads import HeadGeometry
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.templates.transfer import IncompatibleHeadGridError


def _ranks(values: np.ndarray) -> np.ndarray:
    return pd.Series(values).rank(method="average").to_numpy()


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def kendall_tau_b(a: np.ndarray, b: np.ndarray) -> float:
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), k=1)
    x, y = da[upper], db[upper]
    concordant_minus_discordant = float((x * y).sum())
    denom = np.sqrt(float((x != 0).sum()) * float((y != 0).sum()))
    return concordant_minus_discordant / denom if denom else float("nan")


def compare_scores(a: HeadScores, b: HeadScores, ks: Sequence[int] = (5, 10, 20), *, permutations: int = 1000,
                   seed: int = 0) -> pd.DataFrame:
    """Top-k overlap / Jaccard with permutation p-values, plus Spearman and Kendall of the L x H maps."""
    if a.scores.shape != b.scores.shape:
        raise IncompatibleHeadGridError(
            f"score maps have different head grids {a.scores.shape} vs {b.scores.shape}: the models do not share a "
            "backbone layout, so heads cannot be compared by index")
    total = a.scores.size
    ranking_a, ranking_b = a.ranking(), b.ranking()
    rng = np.random.default_rng(seed)
    rows = []
    for k in ks:
        if not 0 < k <= total:
            continue
        top_a, top_b = set(ranking_a[:k]), set(ranking_b[:k])
        overlap = len(top_a & top_b)
        null = np.array([len(set(rng.permutation(total)[:k]) & set(range(k))) for _ in range(permutations)])
        rows.append({"statistic": f"top-{k} overlap", "value": overlap / k, "heads_shared": overlap,
                     "jaccard": overlap / len(top_a | top_b), "chance_mean": float(null.mean()) / k,
                     "p_value": float((1 + (null >= overlap).sum()) / (1 + permutations))})
    flat_a, flat_b = a.scores.ravel(), b.scores.ravel()
    rows.append({"statistic": "spearman", "value": spearman(flat_a, flat_b)})
    rows.append({"statistic": "kendall_tau_b", "value": kendall_tau_b(flat_a, flat_b)})
    return pd.DataFrame(rows)


def same_grid(a: HeadGeometry, b: HeadGeometry) -> bool:
    return (a.num_layers, a.num_heads, a.head_dim, a.num_kv_heads) == (b.num_layers, b.num_heads, b.head_dim, b.num_kv_heads)
