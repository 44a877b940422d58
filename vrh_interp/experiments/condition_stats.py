"""Statistics over condition outcomes, shared by the grounding sweep (``experiments.sweep``) and the VQA sweep
(``experiments.vqa_sweep``): the per-condition rows every summary starts with (accuracy with its bootstrap
interval, the paired McNemar test against the baseline: ``condition_rows``), the set-level rows of each control
kind's sets (their distribution, the two-level bootstrap, empirical p-values: ``set_level_rows``) and the
deprecated summary-only verdict (``summary_verdict``).

Apart from either sweep because neither owns them: each passes its own records (with a boolean ``correct``
column) and its own pooled rates.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from vrh_interp.core.execution.ablation_kinds import DEFAULT_ABLATION_KIND
from vrh_interp.evaluation.controls import CONTROL_KINDS
from vrh_interp.evaluation.statistics import (QUANTILES, bootstrap_ci, empirical_p_value, mcnemar_exact,
                                              random_set_distribution, set_level_verdict, two_level_bootstrap_ci)
from vrh_interp.experiments.conditions import Condition

QUANTILE_COLUMNS: list[str] = [f"accuracy_q{round(100 * q):02d}" for q in QUANTILES]


def _set_outcomes(parts: Sequence[pd.DataFrame], column: str = "correct") -> np.ndarray:
    """(sets x samples) table of one column, sets aligned on the samples they all share."""
    series = [part.set_index("sample_id")[column] for part in parts]
    shared = [i for i in series[0].index if all(i in s.index for s in series[1:])]
    return np.array([s.loc[shared].to_numpy(dtype=float) for s in series]).reshape(len(series), len(shared))


def _clustered(parts: Sequence[pd.DataFrame], seed: int, resamples: int) -> tuple[float, float, dict[str, float]]:
    """Sets each answered on their own items (one per scene): the accuracy over all their items, its percentile
    interval resampling the sets (the clusters) with replacement; no quantiles (a set's accuracy on its few items
    is not a draw of the set-accuracy distribution)."""
    correct = [part["correct"].to_numpy(dtype=float) for part in parts]
    totals, sizes = np.array([c.sum() for c in correct]), np.array([c.size for c in correct], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(parts), size=(resamples, len(parts)))
    means = totals[picks].sum(axis=1) / sizes[picks].sum(axis=1)
    dist = {"sets": len(parts), "mean": float(totals.sum() / sizes.sum()), "sd": float("nan"),
            **{f"q{round(100 * q):02d}": float("nan") for q in QUANTILES}}
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)), dist


def condition_rows(parts: Mapping[str, pd.DataFrame], conditions: Sequence[Condition], base: pd.Series,
                   total_heads: int | None, *, bootstrap_seed: int,
                   resamples: int) -> Iterator[tuple[Condition, dict[str, Any], dict[str, Any]]]:
    """Per condition with records (``parts[key]``, a boolean ``correct`` column): the columns every sweep
    summary's row starts with (the condition, ``k_fraction`` NaN when the model's head count is unknown, ``n``,
    the accuracy with its bootstrap interval over samples; the set-level columns ``sets``, ``accuracy_sd`` and
    the quantiles NaN, ``set_level_rows`` fills them) and the exact McNemar test of the same samples against
    ``base`` (baseline correctness by sample id; nothing lost or gained for the baseline itself)."""
    for cond in conditions:
        part = parts[cond.key]
        if part.empty:
            continue
        correct = part["correct"].to_numpy(dtype=bool)
        paired = mcnemar_exact(base.loc[part["sample_id"]].to_numpy(dtype=bool), correct) \
            if cond.kind != "baseline" else {"lost": 0, "gained": 0, "p_value": 1.0}
        low, high = bootstrap_ci(correct.astype(float), seed=bootstrap_seed, resamples=resamples)
        yield cond, {"key": cond.key, "condition": cond.kind, "k": cond.k,
                     "k_fraction": cond.k / total_heads if total_heads else float("nan"), "seed": cond.seed,
                     "ablation": cond.ablation, "n": len(correct), "sets": float("nan"),
                     "accuracy": float(correct.mean()), "accuracy_ci_low": low, "accuracy_ci_high": high,
                     "accuracy_sd": float("nan"), **{c: float("nan") for c in QUANTILE_COLUMNS}}, paired


def set_level_rows(rows: list[dict[str, Any]], parts: Mapping[str, pd.DataFrame], conditions: Sequence[Condition], *,
                   pooled: Callable[[pd.DataFrame], dict[str, Any]], bootstrap_seed: int = 0,
                   resamples: int = 2000) -> list[dict[str, Any]]:
    """``rows`` (one per condition, with ``key`` and ``accuracy``) plus, per (control kind, k, ablation), a
    ``seed="all"`` row of the sets' distribution; every non-control masked row gets ``p_vs_<control kind>``.

    ``parts`` maps condition keys to their records (with a boolean ``correct`` column); ``pooled(records)``
    gives the aggregate row's remaining columns from the sets' pooled records (descriptive rates). The
    aggregate's ``accuracy`` is the mean of the set accuracies, its interval the two-level bootstrap, and
    its paired-test columns are NaN: a McNemar test on pooled sets would count each sample once per set.
    """
    by_key = {row["key"]: row for row in rows}
    out = list(rows)
    groups: dict[tuple[str, int, str], list[Condition]] = {}
    for cond in conditions:
        if cond.kind in CONTROL_KINDS and cond.key in by_key:
            groups.setdefault((cond.kind, cond.k, cond.ablation), []).append(cond)
    for row in out:
        for kind in CONTROL_KINDS:
            row.setdefault(f"p_vs_{kind}", float("nan"))
    for (kind, k, ablation), members in groups.items():
        accuracies = [by_key[c.key]["accuracy"] for c in members]
        outcomes = _set_outcomes([parts[c.key] for c in members])
        if outcomes.shape[1] or len(members) == 1:
            low, high = two_level_bootstrap_ci(outcomes, seed=bootstrap_seed, resamples=resamples)
            dist = random_set_distribution(accuracies)
        else:  # one fresh set per scene (a partition of the items): clusters, not a distribution of set accuracies
            low, high, dist = _clustered([parts[c.key] for c in members], bootstrap_seed, resamples)
        template = by_key[members[0].key]
        aggregate = {column: float("nan") for column in template}
        aggregate.update({c: template[c] for c in ("condition", "k", "k_fraction", "ablation", "benchmark")
                          if c in template})
        aggregate.update(pooled(pd.concat([parts[c.key] for c in members])))
        suffix = f":ablation={ablation}" if ablation != DEFAULT_ABLATION_KIND else ""
        aggregate.update({"key": f"{kind}:k={k}:seed=all{suffix}",
                          "seed": "all", "sets": dist["sets"], "accuracy": dist["mean"], "accuracy_ci_low": low,
                          "accuracy_ci_high": high, "accuracy_sd": dist["sd"],
                          **{column: dist[column[len("accuracy_"):]] for column in QUANTILE_COLUMNS}})
        last = max(i for i, row in enumerate(out) if row["key"] in {c.key for c in members})
        out.insert(last + 1, aggregate)
        for cond in conditions:
            if cond.kind != "baseline" and cond.kind not in CONTROL_KINDS and cond.k == k \
                    and cond.ablation == ablation and cond.key in by_key:
                by_key[cond.key][f"p_vs_{kind}"] = empirical_p_value(by_key[cond.key]["accuracy"], accuracies) \
                    if np.isfinite(dist["q05"]) else float("nan")  # clustered sets: the rank test is the claim's
    return out


def summary_verdict(summary: pd.DataFrame, k: int, *, target: str = "top",
                    controls: Sequence[str] | None = None, alpha: float = 0.05) -> dict[str, Any]:
    """The 0.2 set-level rule "masking the ``target`` set at ``k`` is more harmful than each control's sets", kept
    for compatibility (deprecated): every verdict the library prints comes from ``evaluation.claims`` with the
    evidence of ``experiments.verdicts`` (per-item records, three outcomes); this one reads a summary only.

    ``summary`` is one model's ``SweepResult.summary()`` (or its CSV read back, or one benchmark's rows of a
    VQA summary). The control sets are the summary's per-set rows (``seed`` not "all"); ``controls=None``
    uses every control kind present at ``k``. Returns ``verdict`` and ``reason``
    (``statistics.set_level_verdict``), the ``target`` row and each control's aggregate row.
    """
    seeds = summary["seed"].astype(str)
    target_row = summary[(summary["condition"] == target) & (summary["k"] == k)]
    if len(target_row) != 1:
        raise ValueError(f"the summary has {len(target_row)} {target!r} rows at k={k}, expected 1")
    present = [c for c in CONTROL_KINDS if ((summary["condition"] == c) & (summary["k"] == k)).any()]
    kinds = present if controls is None else list(controls)
    sets = {kind: summary[(summary["condition"] == kind) & (summary["k"] == k) & (seeds != "all")]["accuracy"]
            .astype(float).tolist() for kind in kinds}
    aggregates = {kind: summary[(summary["condition"] == kind) & (summary["k"] == k) & (seeds == "all")]
                  for kind in kinds}
    row = target_row.iloc[0]
    verdict, reason = set_level_verdict(float(row["accuracy"]), float(row["p_value_vs_baseline"]), sets, alpha=alpha)
    return {"verdict": verdict, "reason": reason, "target": row,
            "controls": {kind: (frame.iloc[0] if len(frame) else None) for kind, frame in aggregates.items()}}
