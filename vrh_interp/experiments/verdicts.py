"""Evidence for each declared claim (``evaluation.claims``) from the experiments' records, per item.

Every builder reads per-item outcomes (the run folders' records), never a summary's pooled numbers, and returns
an ``Evidence`` (estimate, bootstrap replicates, items) that ``claims.judge`` turns into the claims table. The
rules are in ``evaluation.claims``; here is only how each claim's statistic is computed from the records.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from vrh_interp.evaluation.claims import (RESAMPLES, Evidence, decide, CLAIMS, item_weights, mean_evidence,
                                          set_effect, smallest, statistic_evidence)
from vrh_interp.evaluation.controls import CONTROL_KINDS
from vrh_interp.evaluation.statistics import spearman


def _matrix(records: pd.DataFrame, keys: Sequence[str], column: str, ids: Sequence[str]) -> np.ndarray:
    """(keys x ids) of one per-item column, items in the order of ``ids``."""
    by_key = {key: part.set_index("sample_id")[column] for key, part in records.groupby("condition")}
    return np.array([by_key[key].loc[list(ids)].to_numpy(dtype=float) for key in keys]).reshape(len(keys), len(ids))


def _correct(records: pd.DataFrame, iou_threshold: float) -> pd.DataFrame:
    frame = records.copy()
    if "correct" not in frame:
        frame["correct"] = (frame["iou"].astype(float) >= iou_threshold).astype(float)
    return frame


def _common_ids(records: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    sets = [set(records.loc[records["condition"] == key, "sample_id"]) for key in keys]
    first = records.loc[records["condition"] == keys[0], "sample_id"].tolist()
    return [i for i in dict.fromkeys(first) if all(i in s for s in sets)]


def control_keys(conditions: Sequence[Any], kind: str, k: int, ablation: str = "zero",
                 target: str = "top") -> tuple[str | None, list[str]]:
    """The key of the ``target`` condition at ``k`` and the keys of the ``kind`` control sets there."""
    tops = [c.key for c in conditions if c.kind == target and c.k == k and c.ablation == ablation]
    sets = [c.key for c in conditions if c.kind == kind and c.k == k and c.ablation == ablation]
    return (tops[0] if tops else None), sets


def set_effects(records: pd.DataFrame, conditions: Sequence[Any], ks: Sequence[int], kinds: Sequence[str], *,
                ablation: str = "zero", target: str = "top", iou_threshold: float = 0.5,
                seed: int = 0) -> tuple[dict[tuple[int, str], tuple[float, np.ndarray, int]], int, int]:
    """Per (k, control kind) with sets: ``(estimate, replicates, sets)`` of control accuracy minus target
    accuracy, every statistic on the same items with ONE item resampling. Returns them, the item count and the
    informative items (outcomes not all equal across the target and the sets)."""
    frame = _correct(records, iou_threshold)
    wanted = {}
    for k in ks:
        for kind in kinds:
            top, sets = control_keys(conditions, kind, k, ablation, target)
            if top is not None and sets:
                wanted[(k, kind)] = (top, sets)
    if not wanted:
        return {}, 0, 0
    all_keys = list(dict.fromkeys(key for top, sets in wanted.values() for key in (top, *sets)))
    ids = _common_ids(frame, all_keys)
    every = _matrix(frame, all_keys, "correct", ids)
    informative = int(np.sum(every.min(axis=0) != every.max(axis=0)))
    weights = item_weights(len(ids), RESAMPLES, seed)
    out = {}
    for index, ((k, kind), (top, sets)) in enumerate(wanted.items()):
        estimate, replicates = set_effect(_matrix(frame, [top], "correct", ids)[0],
                                          _matrix(frame, sets, "correct", ids), weights, seed=seed + 1 + index)
        out[(k, kind)] = (estimate, replicates, len(sets))
    return out, len(ids), informative


def causal_evidence(records: pd.DataFrame, conditions: Sequence[Any], k: int, *,
                    kinds: Sequence[str] = CONTROL_KINDS, ablation: str = "zero", target: str = "top",
                    iou_threshold: float = 0.5, seed: int = 0) -> Evidence | None:
    """The causal claim at ``k``: the smallest over the control kinds present of (control - top) accuracy."""
    effects, n, informative = set_effects(records, conditions, [k], kinds, ablation=ablation, target=target,
                                          iou_threshold=iou_threshold, seed=seed)
    if not effects:
        return None
    frame = _correct(records, iou_threshold)
    accuracy = frame.groupby("condition")["correct"].mean()
    top, _ = control_keys(conditions, kinds[0], k, ablation, target)
    base = accuracy.get("baseline:k=0", float("nan"))
    parts = {kind: (e, r) for (_, kind), (e, r, _) in effects.items()}
    numbers = (f"k={k}, n={n} items: baseline {base:.3f}, {target} {accuracy[top]:.3f}; "
               + "; ".join(f"{kind} ({s} sets) {accuracy[top] + e:.3f} (effect {e:+.3f})"
                           for (_, kind), (e, _, s) in effects.items()))
    missing = [kind for kind in kinds if kind not in parts]
    if missing:
        numbers += f"; no {', '.join(missing)} sets"
    return smallest(parts, n, numbers + f"; {informative} informative items", informative)


def curve_evidence(records: pd.DataFrame, conditions: Sequence[Any], *, kinds: Sequence[str] = CONTROL_KINDS,
                   ablation: str = "zero", iou_threshold: float = 0.5, seed: int = 0) -> Evidence | None:
    """The causal claim along the k-curve: per control kind the mean over every k > 0 with sets of (control -
    top), then the smallest over the kinds (the area between the curves, per unit of k grid)."""
    ks = sorted({c.k for c in conditions if c.kind == "top" and c.k > 0})
    effects, n, informative = set_effects(records, conditions, ks, kinds, ablation=ablation,
                                          iou_threshold=iou_threshold, seed=seed)
    parts = {}
    for kind in kinds:
        mine = [(e, r) for (k, kd), (e, r, _) in effects.items() if kd == kind]
        if mine:
            parts[kind] = (float(np.mean([e for e, _ in mine])), np.mean(np.stack([r for _, r in mine]), axis=0))
    if not parts or len(ks) < 2:
        return None
    numbers = f"ks={ks}, n={n} items; mean effect over k: " + ", ".join(f"{kind} {e:+.3f}"
                                                                       for kind, (e, _) in parts.items())
    return smallest(parts, n, numbers, informative)


def specificity_evidence(records: pd.DataFrame, k: int, *, iou_threshold: float = 0.5,
                         target: str = "top") -> Evidence | None:
    """Per item: (mislocated under top-k - unmasked) - (parse failure under top-k - unmasked), averaged."""
    key = f"{target}:k={k}"
    keys = ["baseline:k=0", key]
    if not all((records["condition"] == c).any() for c in keys):
        return None
    frame = records.copy()
    parsed = frame["parsed"].astype(bool) if "parsed" in frame else frame["box"].notna()
    frame["parse_failure"] = (~parsed).astype(float)
    frame["mislocated"] = (parsed & (frame["iou"].astype(float) < iou_threshold)).astype(float)
    ids = _common_ids(frame, keys)
    mis = _matrix(frame, keys, "mislocated", ids)
    parse = _matrix(frame, keys, "parse_failure", ids)
    values = (mis[1] - mis[0]) - (parse[1] - parse[0])
    numbers = (f"k={k}, n={len(ids)} items: mislocation {mis[0].mean():.3f} -> {mis[1].mean():.3f}, parse failure "
               f"{parse[0].mean():.3f} -> {parse[1].mean():.3f}")
    return mean_evidence(values, informative_changes=True, numbers=numbers)


def sparse_evidence(stats: Sequence[Any], *, design: Any = "vrh", seed: int = 0) -> Evidence:
    """Share of the total score carried by the top 10 % of heads, detection samples resampled."""
    from vrh_interp.scoring.design import resolve_design
    from vrh_interp.scoring.detect import scores_from_stats

    design = resolve_design(design)

    def share(indices: np.ndarray) -> float:
        flat = np.sort(scores_from_stats([stats[i] for i in indices], design).scores.ravel())[::-1]
        tenth = max(1, len(flat) // 10)
        return float(flat[:tenth].sum() / flat.sum()) if flat.sum() > 0 else float("nan")

    evidence = statistic_evidence(share, len(stats), resamples=200, seed=seed)
    evidence.numbers = f"top 10% of heads carry {evidence.estimate:.1%} of the score ({len(stats)} detection samples)"
    return evidence


def stability_evidence(stats: Sequence[Any], k: int, *, samples: int = 20, resamples: int = 50,
                       seed: int = 0) -> Evidence | None:
    """Mean top-k overlap of rankings from ``samples`` resampled detection samples with the all-sample ranking."""
    from vrh_interp.experiments.design_space import stability

    if len(stats) <= samples:
        return None
    table = stability(stats, k=k, sizes=(samples,), resamples=resamples, seed=seed)
    if table.empty:
        return None
    row = table.iloc[0]
    evidence = mean_evidence(table.attrs["overlaps"][samples], seed=seed)
    evidence.numbers = (f"{samples} of {len(stats)} samples, {int(row['resamples'])} resamples: mean top-{k} overlap "
                        f"{row['mean_overlap']:.2f} (min {row['min_overlap']:.2f})")
    evidence.n = len(stats)
    return evidence


def design_evidence(records: pd.DataFrame, key_of: Mapping[str, str], default: str, *, margin: float = 0.05,
                    iou_threshold: float = 0.5, seed: int = 0) -> Evidence | None:
    """5 points minus the shortfall of the default variant's drop behind the best variant's (items resampled,
    the best variant chosen again in every replicate, so the selection is part of the interval)."""
    if default not in key_of:
        return None
    frame = _correct(records, iou_threshold)
    keys = list(dict.fromkeys(key_of.values()))
    ids = _common_ids(frame, keys)
    outcomes = _matrix(frame, keys, "correct", ids)
    weights = item_weights(len(ids), RESAMPLES, seed)
    accuracy = weights @ outcomes.T  # (B x variants)
    mine = keys.index(key_of[default])
    replicates = margin - (accuracy[:, mine] - accuracy.min(axis=1))
    means = outcomes.mean(axis=1)
    estimate = float(margin - (means[mine] - means.min()))
    best = keys[int(np.argmin(means))]
    best_names = [name for name, key in key_of.items() if key == best]
    informative = int(np.sum(outcomes.min(axis=0) != outcomes.max(axis=0)))
    return Evidence(estimate, replicates, len(ids), informative=informative, numbers=
                    f"n={len(ids)} items: default masked {means[mine]:.3f}, best variant ({best_names[0]}) "
                    f"{means.min():.3f}: shortfall {means[mine] - means.min():.3f} (margin {margin:g})")


def transfer_evidence(results: Mapping[str, Any], k: int, *, seed: int = 0) -> Evidence | None:
    """Cross-masking: per direction (the other model's top-k masked in each model), random-set accuracy minus
    transferred accuracy; the smallest over the two directions."""
    parts, numbers, n, informative = {}, [], 0, None
    for label, result in results.items():
        effects, count, useful = set_effects(result.records, result.conditions, [k], ["random"], target="transferred",
                                     iou_threshold=result.iou_threshold, seed=seed)
        if (k, "random") not in effects:
            continue
        estimate, replicates, sets = effects[(k, "random")]
        parts[label] = (estimate, replicates)
        n = count if not n else min(n, count)
        informative = useful if informative is None else min(informative, useful)
        numbers.append(f"masked in {label}: transferred vs {sets} random sets effect {estimate:+.3f}")
    if len(parts) < len(results) or not parts:
        return None
    # the directions resample different models' records on the same items: pair them by replicate index
    return smallest(parts, n, f"k={k}, n={n} items; " + "; ".join(numbers), informative)


def vqa_evidence(result: Any, kinds_answered: Sequence[str], k: int, *, kinds: Sequence[str] = CONTROL_KINDS,
                 seed: int = 0) -> Evidence | None:
    """The causal statistic on the VQA items of the question kinds the model answers (pooled, paired)."""
    records = result.records[result.records["benchmark"].isin(list(kinds_answered))].copy()
    if records.empty:
        return None
    records["sample_id"] = records["benchmark"].astype(str) + "/" + records["sample_id"].astype(str)
    records["correct"] = records["correct"].astype(float)
    evidence = causal_evidence(records, result.conditions, k, kinds=kinds, seed=seed)
    if evidence is not None:
        evidence.numbers = f"answered kinds {', '.join(kinds_answered)}; " + evidence.numbers
    return evidence


def score_damage_evidence(scores: Sequence[float], damage: Sequence[float], *, seed: int = 0) -> Evidence | None:
    """Spearman(score, single-head accuracy drop) over the scanned heads, heads resampled."""
    a, b = np.asarray(scores, dtype=float), np.asarray(damage, dtype=float)
    if len(a) < 4:
        return None

    def rho(indices: np.ndarray) -> float:
        return spearman(a[indices], b[indices])

    evidence = statistic_evidence(rho, len(a), resamples=1000, seed=seed)
    evidence.numbers = f"Spearman {evidence.estimate:.3f} over {len(a)} heads"
    return evidence


def kinds_agree(evidence_by_kind: Mapping[str, Evidence | None]) -> Evidence | None:
    """The method check "the causal claim holds under every ablation kind": each kind's causal evidence judged on
    its own (unadjusted); holds when all hold, does not hold when any decisively does not, else inconclusive."""
    judged = {kind: decide(CLAIMS["causal"], ev)[0] for kind, ev in evidence_by_kind.items() if ev is not None}
    if len(judged) < 2:
        return None
    numbers = "; ".join(f"{kind}: effect {evidence_by_kind[kind].estimate:+.3f} ({verdict})"
                        for kind, verdict in judged.items())
    if all(v == "holds" for v in judged.values()):
        return Evidence.categorical("holds", numbers, "the causal claim holds under every ablation kind")
    if any(v == "does not hold" for v in judged.values()):
        return Evidence.categorical("does not hold", numbers, "the causal claim does not hold under some kind")
    return Evidence.categorical("inconclusive", numbers, "some kind is undecided")


def sweep_claims(result: Any, *, seed: int = 0) -> pd.DataFrame:
    """The causal claim at every k > 0 of a k-sweep with control sets (``SweepResult``), judged by the claims
    rules with Holm over the k values (one family): what ``vrh sweep`` and ``vrh report`` print."""
    from dataclasses import replace

    from vrh_interp.evaluation.claims import judge

    kinds = [kind for kind in CONTROL_KINDS if any(c.kind == kind for c in result.conditions)]
    evidence, specs = {}, {}
    for k in sorted({c.k for c in result.conditions if c.kind == "top" and c.k > 0}):
        found = causal_evidence(result.records, result.conditions, k, kinds=kinds,
                                iou_threshold=result.iou_threshold, seed=seed) if kinds else None
        key = f"causal:k={k}"
        specs[key] = replace(CLAIMS["causal"], id=key, claim=f"k={k}: the top-{k} masked hurts more than the "
                                                            f"{', '.join(kinds) or 'no'} control sets")
        evidence[key] = found
    return judge(evidence, specs=specs)
