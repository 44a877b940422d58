"""Evidence for each declared claim (``evaluation.claims``) from the experiments' records, per item.

Every builder reads per-item outcomes (the run folders' records), never a summary's pooled numbers, and returns
an ``Evidence`` (estimate, the rule's two p-values, items) that ``claims.judge`` turns into the claims table. The
rules are in ``evaluation.claims`` (the causal one: ``claims.causal_test``) and the tests in
``evaluation.inference``; here is only how each claim's data are read from the records.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from vrh_interp.evaluation import inference
from vrh_interp.evaluation.claims import (BOOTSTRAP_UNITS, CLAIMS, RESAMPLES, Evidence, causal_test, intersection,
                                          item_weights, mean_evidence, statistic_evidence)
from vrh_interp.evaluation.controls import CONTROL_KINDS
from vrh_interp.evaluation.statistics import spearman


def _matrix(records: pd.DataFrame, keys: Sequence[str], column: str, ids: Sequence[str]) -> np.ndarray:
    """(keys x ids) of one per-item column, items in the order of ``ids``; NaN where a condition was not answered
    on an item (the clustered design: one set per scene, ``experiments.designs``)."""
    by_key = {key: part.set_index("sample_id")[column] for key, part in records.groupby("condition")}
    return np.array([by_key[key].reindex(list(ids)).to_numpy(dtype=float)
                     for key in keys]).reshape(len(keys), len(ids))


def _answered(controls: np.ndarray) -> np.ndarray:
    """The items a control table judges: in the clustered design (each item under one set) every item with its
    set, else (crossed) the items every set was answered on."""
    answered = np.isfinite(controls)
    if controls.shape[0] > 1 and np.all(answered.sum(axis=0) <= 1):
        return answered.any(axis=0)
    return answered.all(axis=0)


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


def _outcomes(frame: pd.DataFrame, conditions: Sequence[Any], k: int, kind: str, ablation: str, target: str,
              ids: Sequence[str] | None = None) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray] | None:
    """``(ids, baseline, target, controls)`` at ``k``: 0/1 outcomes on the items every one of them has, the
    control sets in seed order (their drawn order: the sequential rank test reads them so)."""
    top, sets = control_keys(conditions, kind, k, ablation, target)
    if top is None or not sets:
        return None
    seeds = {c.key: (c.seed if isinstance(c.seed, int) else 0) for c in conditions}
    sets = sorted(sets, key=lambda key: seeds.get(key, 0))
    keys = ["baseline:k=0", top, *sets]
    if not all((frame["condition"] == key).any() for key in keys):
        return None
    ids = list(ids) if ids is not None else _common_ids(frame, keys[:2])
    every = _matrix(frame, keys, "correct", ids)
    keep = _answered(every[2:])
    return [i for i, kept in zip(ids, keep) if kept], every[0, keep], every[1, keep], every[2:, keep]


def rank_data(rank: Any, k: int, kind: str, ablation: str, target: str,
               iou_threshold: float) -> tuple[float, np.ndarray] | None:
    """``(target accuracy, set accuracies in drawn order)`` on a rank sweep's items (``rank``: a ``SweepResult``
    whose control sets were answered on a small common item subset, all of them or, curtailed, until decided:
    ``designs.curtailed_rank``), or None where it has no such sets. A set's value counts its unanswered items as
    right, so it is at most the target's accuracy exactly when its full answers would be (the comparison was
    decided before they were skipped)."""
    if rank is None:
        return None
    frame = _correct(rank.records, iou_threshold)
    top, sets = control_keys(rank.conditions, kind, k, ablation, target)
    if top is None or not sets or not (frame["condition"] == top).any():
        return None
    seeds = {c.key: (c.seed if isinstance(c.seed, int) else 0) for c in rank.conditions}
    items = frame.loc[frame["condition"] == top, "sample_id"]
    m = len(items)
    right = frame[frame["sample_id"].isin(set(items))].groupby("condition")["correct"].agg(["sum", "size"])
    values = [(float(right.loc[key, "sum"]) + m - int(right.loc[key, "size"])) / m
              for key in sorted(sets, key=lambda key: seeds.get(key, 0)) if key in right.index]
    if not values:
        return None
    return float(right.loc[top, "sum"]) / m, np.array(values)


def causal_evidence(records: pd.DataFrame, conditions: Sequence[Any], k: int, *,
                    kinds: Sequence[str] = CONTROL_KINDS, ablation: str = "zero", target: str = "top",
                    iou_threshold: float = 0.5, seed: int = 0, rank: Any = None,
                    minimum: float | None = None, special: Evidence | None = None) -> Evidence | None:
    """The causal claim at ``k`` (``claims.causal_test`` against each control kind present, intersection-union
    over the kinds). ``rank``: a sweep of many control sets on a few items for the rank test (``vrh demo``'s
    rank step); without it the rank test reads the sets of ``records``. ``special``: evidence whose rank test
    stands for this one's (the same top-k under zero ablation, for the other ablation kinds)."""
    frame = _correct(records, iou_threshold)
    minimum = CLAIMS["causal"].minimum if minimum is None else minimum
    parts, lines, n = {}, [], 0
    for kind in kinds:
        found = _outcomes(frame, conditions, k, kind, ablation, target)
        if found is None:
            continue
        ids, base, top, sets = found
        ranked = rank_data(rank, k, kind, ablation, target, iou_threshold)
        given = special.parts.get("special") if special is not None else None
        parts[kind] = causal_test(base, top, sets, minimum=minimum, rank=ranked, special_p=given)
        n, effect = len(ids), parts[kind].extra["effect"]
        rank_sets = len(ranked[1]) if ranked is not None else len(sets)
        where = (f" over {rank_sets} sets" + (f" on {rank.records['sample_id'].nunique()} items" if ranked else "")
                 if given is None else " from the zero-ablation rank test")
        per = ", one per scene" if effect.set_unit != "control sets" else ""
        lines.append(f"{kind} ({len(sets)} sets{per}) {top.mean() + effect.estimate:.3f} "
                     f"(effect {effect.estimate:+.3f}; rank p {parts[kind].parts['special']:.2g}{where})")
        base_acc, top_acc = base.mean(), top.mean()
    if not parts:
        return None
    missing = [kind for kind in kinds if kind not in parts]
    numbers = (f"k={k}, n={n} items: baseline {base_acc:.3f}, {target} {top_acc:.3f}; " + "; ".join(lines)
               + (f"; no {', '.join(missing)} sets" if missing else ""))
    combined = intersection(parts, numbers)
    lost, gained = combined.extra.get("lost", 0), combined.extra.get("gained", 0)
    combined.numbers += f"; drop vs unmasked: {lost} items lost, {gained} gained"
    return combined


def curve_evidence(records: pd.DataFrame, conditions: Sequence[Any], *, kinds: Sequence[str] = CONTROL_KINDS,
                   ablation: str = "zero", iou_threshold: float = 0.5, seed: int = 0,
                   special: Evidence | None = None) -> Evidence | None:
    """The causal claim along the k-curve, the SEED the unit across k (a seed's sets are nested in k): per item
    the mean over every k > 0 of the top-k's outcomes against each seed's mean over the same ks; ``causal_test``
    per kind on those curves, intersection over the kinds. Specialness: the rank test at k* (``special``, the
    causal claim's evidence: the same ranking) where given, else the rank of the top curve among the seeds'."""
    frame = _correct(records, iou_threshold)
    ks = sorted({c.k for c in conditions if c.kind == "top" and c.k > 0})
    if len(ks) < 2:
        return None
    parts, n = {}, 0
    for kind in kinds:
        by_k = {k: _outcomes(frame, conditions, k, kind, ablation, "top") for k in ks}
        if any(found is None for found in by_k.values()):
            continue
        seeds_at = [{c.seed for c in conditions if c.kind == kind and c.k == k and c.ablation == ablation} for k in ks]
        common = sorted(set.intersection(*seeds_at), key=lambda s: (s if isinstance(s, int) else 0))
        if len(common) < 2:
            continue
        ids = _common_ids(frame, ["baseline:k=0"] + [f"top:k={k}" for k in ks])
        keys_of = {k: [c.key for s in common for c in conditions if c.kind == kind and c.k == k and c.seed == s
                       and c.ablation == ablation] for k in ks}
        base = _matrix(frame, ["baseline:k=0"], "correct", ids)[0]
        top = np.mean([_matrix(frame, [f"top:k={k}"], "correct", ids)[0] for k in ks], axis=0)
        curves = np.mean([_matrix(frame, keys_of[k], "correct", ids) for k in ks], axis=0)  # (seeds x items)
        keep = _answered(curves)
        base, top, curves, ids = base[keep], top[keep], curves[:, keep], [i for i, kept in zip(ids, keep) if kept]
        given = None
        if special is not None and "special" in special.parts:
            given = special.parts["special"]
        parts[kind] = causal_test(base, top, curves, minimum=CLAIMS["causal_curve"].minimum, special_p=given)
        n = len(ids)
    if not parts:
        return None
    numbers = (f"ks={ks}, n={n} items; mean effect over k (seeds as the unit): "
               + ", ".join(f"{kind} {ev.estimate:+.3f} ({ev.extra['effect'].sets} seeds)" for kind, ev in parts.items())
               + ("; specialness from the rank test at k*" if special is not None else ""))
    return intersection(parts, numbers)


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
    evidence = mean_evidence(values, numbers=numbers)
    minimum = CLAIMS["specific"].minimum  # per-item values in [-2, 2]: the betting test, valid at every n
    evidence.p_holds = inference.betting_p(values, minimum, low=-2.0, high=2.0)
    evidence.p_fails = inference.betting_p(-values, -minimum, low=-2.0, high=2.0)
    return evidence


def per_sample_scores(stats: Sequence[Any], design: Any = "vrh") -> np.ndarray:
    """(samples x heads) of each detection sample's own head scores (the design's per-sample score; the scores of
    a sample set are their mean)."""
    from vrh_interp.scoring.design import resolve_design
    from vrh_interp.scoring.detect import scores_from_stats

    design = resolve_design(design)
    return np.stack([np.nan_to_num(scores_from_stats([s], design).scores.ravel()) for s in stats])


def _top_share(mean_scores: np.ndarray, fraction: float = 0.1) -> float:
    flat = np.sort(np.asarray(mean_scores, dtype=float))[::-1]
    top = max(1, int(len(flat) * fraction))
    total = flat.sum()
    return float(flat[:top].sum() / total) if total > 0 else float("nan")


def sparse_evidence(stats: Sequence[Any], *, design: Any = "vrh", seed: int = 0, permutations: int = 999,
                    per_sample: np.ndarray | None = None) -> Evidence:
    """Share of the mean score carried by the top 10 % of heads. Holds when (a) the share beats its distribution
    under NO structure (each sample's head scores permuted on their own: heads with no consistent identity; noise
    spread over many heads already beats a flat line) and (b) its lower bound (detection samples resampled) is at
    least the minimum."""
    scores = per_sample_scores(stats, design) if per_sample is None else np.asarray(per_sample, dtype=float)
    share = _top_share(scores.mean(axis=0))
    rng = np.random.default_rng(seed)
    null = np.array([_top_share(rng.permuted(scores, axis=1).mean(axis=0)) for _ in range(permutations)])
    structure = float((1 + np.sum(null >= share - 1e-12)) / (permutations + 1))
    evidence = statistic_evidence(lambda idx: _top_share(scores[idx].mean(axis=0)), len(scores), resamples=500,
                                  seed=seed)
    evidence.estimate = share
    minimum = CLAIMS["sparse"].minimum
    enough = evidence.p_above(minimum) if len(scores) >= BOOTSTRAP_UNITS else 1.0
    evidence.p_holds, evidence.parts = max(structure, enough), {"structure": structure, "effect": enough}
    evidence.numbers = (f"top 10% of heads carry {share:.1%} of the score ({len(scores)} detection samples; under "
                        f"no structure {np.mean(null):.1%}, 95th percentile {np.quantile(null, 0.95):.1%})")
    return evidence


def stability_evidence(stats: Sequence[Any], k: int, *, samples: int = 20, resamples: int = 200, draws: int = 10,
                       seed: int = 0, per_sample: np.ndarray | None = None) -> Evidence | None:
    """The expected top-k overlap of a ``samples``-sample ranking with the all-sample ranking, and its
    uncertainty from the DETECTION SET (the stability of Meloux et al., arXiv 2510.00845): each of ``resamples``
    bootstrap copies of the detection set gets its own all-sample ranking and ``draws`` subsample rankings; the
    spread over the copies (not over the simulated subsamples, whose number only narrows the noise of the
    simulation) makes the interval."""
    scores = per_sample_scores(stats, "vrh") if per_sample is None else np.asarray(per_sample, dtype=float)
    n = len(scores)
    if n <= samples or k < 1:
        return None
    rng = np.random.default_rng(seed)

    def top(rows: np.ndarray) -> set[int]:
        return set(np.argsort(-rows.mean(axis=0), kind="stable")[:k].tolist())

    def expected_overlap(pool: np.ndarray) -> float:
        reference = top(pool)
        return float(np.mean([len(top(pool[rng.choice(len(pool), samples, replace=False)]) & reference) / k
                              for _ in range(draws)]))

    estimate = float(np.mean([expected_overlap(scores) for _ in range(5)]))
    replicates = np.array([expected_overlap(scores[rng.integers(0, n, n)]) for _ in range(resamples)])
    evidence = Evidence(estimate, replicates, n,
                        f"{samples} of {n} samples: expected top-{k} overlap {estimate:.2f} (detection set resampled "
                        f"{resamples} times, {draws} subsamples each)")
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
    # the decision: per variant, the default's per-item shortfall bounded below the margin (betting test, valid at
    # every n), intersection-union over the variants; fails where some variant's is bounded above it (Bonferroni)
    others = [i for i in range(len(keys)) if i != mine]
    gains = [outcomes[o] - outcomes[mine] for o in others]  # per item: minus the default's shortfall behind o
    p_holds = max((inference.betting_p(d, -margin, low=-1.0, high=1.0) for d in gains), default=1.0)
    p_fails = min(1.0, len(others) * min((inference.betting_p(-d, margin, low=-1.0, high=1.0) for d in gains),
                                         default=1.0))
    return Evidence(estimate, replicates, len(ids), informative=informative, p_holds=p_holds, p_fails=p_fails,
                    numbers=
                    f"n={len(ids)} items: default masked {means[mine]:.3f}, best variant ({best_names[0]}) "
                    f"{means.min():.3f}: shortfall {means[mine] - means.min():.3f} (margin {margin:g})")


def transfer_evidence(results: Mapping[str, Any], k: int, *, seed: int = 0,
                      rank: Mapping[str, Any] | None = None) -> Evidence | None:
    """Cross-masking: per direction (the other model's top-k masked in each model) the causal rule with the
    transferred set as the target against the random sets (``causal_evidence``), intersection over the two.
    ``rank``: per direction, a cross-masking of many random sets on a few items for the rank test."""
    parts, numbers = {}, []
    for label, result in results.items():
        found = causal_evidence(result.records, result.conditions, k, kinds=["random"], target="transferred",
                                iou_threshold=result.iou_threshold, seed=seed, minimum=CLAIMS["shared"].minimum,
                                rank=(rank or {}).get(label))
        if found is None:
            continue
        parts[label] = found
        numbers.append(f"masked in {label}: transferred vs random sets effect {found.estimate:+.3f} "
                       f"(rank p {found.parts['special']:.2g}, drop p {found.parts['drop']:.2g})")
    if len(parts) < len(results) or not parts:
        return None
    n = min(ev.n for ev in parts.values())
    return intersection(parts, f"k={k}, n={n} items; " + "; ".join(numbers))


def vqa_evidence(result: Any, kinds_answered: Sequence[str], k: int, *, kinds: Sequence[str] = CONTROL_KINDS,
                 seed: int = 0, special: Evidence | None = None) -> Evidence | None:
    """The causal rule on the VQA items of the question kinds the model answers (pooled, paired). ``special``:
    the grounding causal claim's evidence, whose rank test stands for this one's (the same top-k: specialness is
    tested once; here the drop and the size on VQA), else the rank test reads the VQA sweep's sets."""
    records = result.records[result.records["benchmark"].isin(list(kinds_answered))].copy()
    if records.empty:
        return None
    records["sample_id"] = records["benchmark"].astype(str) + "/" + records["sample_id"].astype(str)
    records["correct"] = records["correct"].astype(float)
    kept = set(records["condition"])  # a scene's set whose questions are all of unanswered kinds drops out
    evidence = causal_evidence(records, [c for c in result.conditions if c.key in kept], k, kinds=kinds, seed=seed,
                               special=special)
    if evidence is not None:
        evidence.numbers = f"answered kinds {', '.join(kinds_answered)}; " + evidence.numbers
    return evidence


def score_damage_evidence(scores: Sequence[float], damage: Sequence[float], *, seed: int = 0,
                          permutations: int = 1999) -> Evidence | None:
    """Spearman(score, single-head accuracy drop) over the scanned heads. Holds when the correlation is positive
    beyond chance (a permutation test of the damages over the heads) and its lower bound (heads resampled) is at
    least the minimum."""
    a, b = np.asarray(scores, dtype=float), np.asarray(damage, dtype=float)
    if len(a) < 4:
        return None

    def rho(indices: np.ndarray) -> float:
        return spearman(a[indices], b[indices])

    evidence = statistic_evidence(rho, len(a), resamples=1000, seed=seed)
    rng = np.random.default_rng(seed)
    null = np.array([spearman(a, rng.permutation(b)) for _ in range(permutations)])
    null = null[np.isfinite(null)]
    positive = float((1 + np.sum(null >= evidence.estimate - 1e-12)) / (len(null) + 1)) \
        if np.isfinite(evidence.estimate) else 1.0
    enough = evidence.p_above(CLAIMS["score_damage"].minimum) if len(a) >= BOOTSTRAP_UNITS else 1.0
    evidence.p_holds, evidence.parts = max(positive, enough), {"positive": positive, "effect": enough}
    evidence.numbers = f"Spearman {evidence.estimate:.3f} over {len(a)} heads"
    return evidence


def kinds_agree(evidence_by_kind: Mapping[str, Evidence | None]) -> Evidence | None:
    """The method check "the causal claim holds under every ablation kind": the intersection-union of the kinds'
    causal evidence (holds only where every kind's rule rejects, p the largest; does not hold where some kind is
    bounded below the minimum, Bonferroni over the kinds): one test in the method family, not three unadjusted."""
    parts = {kind: ev for kind, ev in evidence_by_kind.items() if ev is not None}
    if len(parts) < 2:
        return None
    numbers = "; ".join(f"{kind}: effect {ev.estimate:+.3f} (p {ev.p_holds:.2g})" for kind, ev in parts.items())
    return intersection(parts, numbers)


def sweep_claims(result: Any, *, seed: int = 0, rank: Mapping[int, Any] | None = None) -> pd.DataFrame:
    """The causal claim at every k > 0 of a k-sweep with control sets (``SweepResult``), judged by the claims
    rules with Bonferroni over the k values (one family): what ``vrh sweep`` and ``vrh report`` print. ``rank``:
    the rank test's sweep per k (``designs.clustered_sweep``), where the sweep's own sets are not on common items."""
    from dataclasses import replace

    from vrh_interp.evaluation.claims import judge

    kinds = [kind for kind in CONTROL_KINDS if any(c.kind == kind for c in result.conditions)]
    evidence, specs = {}, {}
    for k in sorted({c.k for c in result.conditions if c.kind == "top" and c.k > 0}):
        found = causal_evidence(result.records, result.conditions, k, kinds=kinds,
                                iou_threshold=result.iou_threshold, seed=seed,
                                rank=(rank or {}).get(k)) if kinds else None
        key = f"causal:k={k}"
        specs[key] = replace(CLAIMS["causal"], id=key, claim=f"k={k}: the top-{k} masked hurts more than the "
                                                            f"{', '.join(kinds) or 'no'} control sets")
        evidence[key] = found
    return judge(evidence, specs=specs)
