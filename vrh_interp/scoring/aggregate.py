"""From per-sample statistics to head scores, for any point of the design space (pure numpy)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from vrh_interp.scoring.collect import SampleStats
from vrh_interp.scoring.design import ENTROPY_AGGREGATIONS, ScoringDesign

REGION_FREE = ENTROPY_AGGREGATIONS
RATIO_EPSILON = 1e-9  # VERA (Prongcan/VERA vera/analysis/full_analysis.py): total_attn = np.sum(attn_array) + 1e-9
COLUMN = {"sum": 0, "argmax": 2, "argmax_prompt": 3}  # the statistic each key aggregation reads (``collect``)


class StatsTooOldError(ValueError):
    """Statistics collected before a design's statistic existed (a run folder of an earlier version)."""


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


def _too_old(what: str) -> StatsTooOldError:
    return StatsTooOldError(f"these statistics hold no {what}: they were collected before the released-code presets "
                            "(ocr_heads, localization_heads) existed; collect them again (a new run folder)")


def _phi(rows: np.ndarray, key_aggregation: str) -> np.ndarray:
    """rows [n, L, H, 4] -> per-row values [n, L, H]."""
    if key_aggregation in COLUMN:
        if rows.shape[-1] <= COLUMN[key_aggregation]:
            raise _too_old("argmax over the prompt keys")
        return rows[..., COLUMN[key_aggregation]]
    if key_aggregation == "ratio":  # VERA's code: weighted_score / (sum(attn) + 1e-9)
        return rows[..., 0] / (rows[..., 1].astype(np.float64) + RATIO_EPSILON)
    raise ValueError(key_aggregation)


def query_rows(stats: SampleStats, design: ScoringDesign) -> np.ndarray:
    """The statistics rows of the design's query set, ``[n, L, H, 4]`` (n may be 0; None for ``gold_token_rows``
    when a gold token's row was never read)."""
    out, inp = stats.output_rows, stats.input_rows
    q = design.query_set
    if q == "gold_token_rows":
        if stats.gold_tokens is None or stats.next_row is None:
            raise _too_old("gold-token flags")
        rows_of_tokens = np.concatenate([out[1:], stats.next_row], axis=0)  # the row OF answer token n: row n + 1
        gold = np.asarray(stats.gold_tokens, dtype=bool)
        if gold.any() and np.flatnonzero(gold)[-1] >= len(rows_of_tokens):
            return None  # the last answer token is gold but was never fed back (cut at max_new_tokens)
        return rows_of_tokens[gold[: len(rows_of_tokens)]]
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


def elbow_keep(values: np.ndarray) -> np.ndarray:
    """Heads at or above the elbow of their sorted values (seilk/LocalizationHeads ``find_elbow_point``: the chord
    method on the values sorted ascending, the point farthest from the chord between the first and the last), as
    a boolean array of ``values``' shape. The cut is by VALUE (the code returns the flat head index at the elbow and
    compares head indices with it: its issue #12). All values equal: every head is kept."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    ordered = np.sort(flat)
    points = np.stack([np.arange(len(ordered), dtype=np.float64), ordered], axis=1)
    line = points[-1] - points[0]
    norm = np.linalg.norm(line)
    if len(flat) < 2 or norm == 0:
        return np.ones(np.shape(values), dtype=bool)
    unit = line / norm
    offset = points - points[0]
    distances = np.linalg.norm(offset - np.outer(offset @ unit, unit), axis=1)
    return (flat >= ordered[int(np.argmax(distances))]).reshape(np.shape(values))


def _entropy_score(stats: SampleStats, design: ScoringDesign) -> np.ndarray | None:
    value = stats.neg_entropy if design.key_aggregation == "entropy" else stats.neg_entropy_mass
    if value is None:
        raise _too_old("released spatial entropies")
    if np.isnan(value).any():
        return None
    if design.elbow == "per_sample":
        if stats.image_mass is None:
            raise _too_old("image-attention sums")
        value = np.where(elbow_keep(stats.image_mass), value, -np.inf)
    return value


def per_sample_score(stats: SampleStats, design: ScoringDesign) -> np.ndarray | None:
    """``[L, H]`` score of one sample, or None when the design is undefined for it."""
    if design.key_aggregation in ENTROPY_AGGREGATIONS:
        return _entropy_score(stats, design)
    entries = per_row_entries(stats, design)
    if entries is None or len(entries) == 0:
        return None
    return entries.mean(axis=0)


def per_row_entries(stats: SampleStats, design: ScoringDesign) -> np.ndarray | None:
    """``[n, L, H]`` values of the query rows (times the graded correctness with ``grade_weight``)."""
    rows = query_rows(stats, design)
    if rows is None:
        return None
    values = _phi(rows, design.key_aggregation)
    if design.grade_weight:
        if stats.grade is None:
            raise _too_old("graded correctness")
        values = values * stats.grade
    return values


def aggregate(all_stats: Sequence[SampleStats], design: ScoringDesign) -> Aggregated:
    skipped = {"no_region_tokens": 0, "no_answer_tokens": 0, "incorrect": 0}
    per_sample: list[np.ndarray] = []
    pooled: list[np.ndarray] = []
    used: list[str] = []
    kept: list[SampleStats] = []
    for stats in all_stats:
        if design.key_aggregation not in REGION_FREE and stats.region_tokens == 0:
            skipped["no_region_tokens"] += 1
            continue
        if design.correct_only and stats.iou < 0.5:
            skipped["incorrect"] += 1
            continue
        if design.sample_aggregation == "pooled":
            entries = per_row_entries(stats, design)
            score = None if entries is None or len(entries) == 0 else entries.mean(axis=0)
        else:
            score = per_sample_score(stats, design)
        if score is None:
            skipped["no_answer_tokens"] += 1
            continue
        if design.sample_aggregation == "pooled":
            pooled.append(entries)
        per_sample.append(score)
        used.append(stats.sample_id)
        kept.append(stats)
    if not per_sample:
        raise ValueError(
            f"no sample could be scored with {design.label} (skipped: {skipped}); check that boxes map to visual "
            "tokens and that the model produces an answer"
        )
    stacked = np.stack(per_sample)  # [N, L, H]
    if design.elbow == "mean":
        means = np.stack([s.image_mass if s.image_mass is not None else _raise(_too_old("image-attention sums"))
                          for s in kept]).mean(axis=0)
        stacked = np.where(elbow_keep(means), stacked, -np.inf)
    if design.sample_aggregation == "pooled":
        entries = np.concatenate(pooled)  # [all rows of all samples, L, H]
        scores = entries.mean(axis=0)
        if design.min_zero_share is not None:
            zero_share = (entries == 0).sum(axis=0)
            scores = np.where(zero_share > design.min_zero_share * len(entries), scores, 0.0)
    elif design.sample_aggregation == "mean":
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


def _raise(error: Exception) -> np.ndarray:
    raise error


def _per_position(kept: Sequence[SampleStats], design: ScoringDesign,
                  shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    if design.key_aggregation in ENTROPY_AGGREGATIONS:
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
