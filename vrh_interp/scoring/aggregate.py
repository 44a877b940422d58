"""From per-sample statistics to head scores, for any point of the design space (pure numpy)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from vrh_interp.scoring.collect import SampleStats
from vrh_interp.scoring.design import ScoringDesign

REGION_FREE = ("entropy",)


@dataclass
class Aggregated:
    scores: np.ndarray  # [L, H]
    per_position: np.ndarray  # [P, L, H] mean per-sample score at answer position p (output query sets)
    position_counts: np.ndarray  # [P]
    used_ids: list[str]
    skipped: dict[str, int]


def _random_row(design: ScoringDesign, sample_id: str, n: int) -> int:
    digest = hashlib.sha256(f"{design.seed}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % n


def _phi(rows: np.ndarray, key_aggregation: str) -> np.ndarray:
    """rows [n, L, H, 3] -> per-row values [n, L, H]."""
    if key_aggregation == "sum":
        return rows[..., 0]
    if key_aggregation == "argmax":
        return rows[..., 2]
    if key_aggregation == "ratio":
        visual = rows[..., 1]
        return np.divide(rows[..., 0], visual, out=np.zeros_like(visual), where=visual > 0)
    raise ValueError(key_aggregation)


def query_rows(stats: SampleStats, design: ScoringDesign) -> np.ndarray:
    """The statistics rows of the design's query set, ``[n, L, H, 3]`` (n may be 0)."""
    out, inp = stats.output_rows, stats.input_rows
    q = design.query_set
    if q == "output":
        return out
    if q in ("first_output", "last_input"):
        return out[:1]
    if q == "random_output":
        return out[_random_row(design, stats.sample_id, len(out)): ][:1] if len(out) else out
    if q == "input":
        return inp
    if q == "union":
        return np.concatenate([inp, out[1:]], axis=0)  # out[0] is the last input row, already in inp
    raise ValueError(q)


def per_sample_score(stats: SampleStats, design: ScoringDesign) -> np.ndarray | None:
    """``[L, H]`` score of one sample, or None when the design is undefined for it."""
    if design.key_aggregation == "entropy":
        return None if np.isnan(stats.neg_entropy).any() else stats.neg_entropy
    rows = query_rows(stats, design)
    if len(rows) == 0:
        return None
    return _phi(rows, design.key_aggregation).mean(axis=0)


def aggregate(all_stats: Sequence[SampleStats], design: ScoringDesign) -> Aggregated:
    skipped = {"no_region_tokens": 0, "no_answer_tokens": 0, "incorrect": 0}
    per_sample: list[np.ndarray] = []
    used: list[str] = []
    kept: list[SampleStats] = []
    for stats in all_stats:
        if design.key_aggregation not in REGION_FREE and stats.region_tokens == 0:
            skipped["no_region_tokens"] += 1
            continue
        if design.correct_only and stats.iou < 0.5:
            skipped["incorrect"] += 1
            continue
        score = per_sample_score(stats, design)
        if score is None:
            skipped["no_answer_tokens"] += 1
            continue
        per_sample.append(score)
        used.append(stats.sample_id)
        kept.append(stats)
    if not per_sample:
        raise ValueError(
            f"no sample could be scored with {design.label} (skipped: {skipped}); check that boxes map to visual "
            "tokens and that the model produces an answer"
        )
    stacked = np.stack(per_sample)  # [N, L, H]
    if design.sample_aggregation == "mean":
        scores = stacked.mean(axis=0)
    else:
        k = min(design.freq_top_k, stacked.shape[1] * stacked.shape[2])
        flat = stacked.reshape(len(stacked), -1)
        top = np.argsort(-flat, axis=1, kind="stable")[:, :k]
        counts = np.zeros(flat.shape[1])
        for row in top:
            counts[row] += 1
        scores = (counts / len(stacked)).reshape(stacked.shape[1:])
    per_position, position_counts = _per_position(kept, design, stacked.shape[1:])
    return Aggregated(scores, per_position, position_counts, used, skipped)


def _per_position(kept: Sequence[SampleStats], design: ScoringDesign,
                  shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    if design.key_aggregation == "entropy":
        return np.zeros((0, *shape)), np.zeros(0, dtype=int)
    longest = max((len(s.output_rows) for s in kept), default=0)
    sums = np.zeros((longest, *shape))
    counts = np.zeros(longest, dtype=int)
    for stats in kept:
        values = _phi(stats.output_rows, design.key_aggregation) if len(stats.output_rows) else np.zeros((0, *shape))
        sums[: len(values)] += values
        counts[: len(values)] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / np.maximum(counts, 1)[:, None, None]
    return means, counts
