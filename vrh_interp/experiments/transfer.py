"""Comparing and cross-masking the heads of two models that share a language backbone (the paper's sec. 5.3).

Score maps. Overlap statistics come with a permutation baseline: the same statistic for random rankings
(seeded shuffles), so "3 of the top 5 heads coincide" can be read against chance (expected k^2/N).
Rank correlations are Spearman (Pearson of ranks) and Kendall tau-b (numpy, O(N^2) pairs).

Cross-masking (the paper's Fig. 7). In each model of the pair, grounding accuracy is measured at every k
with the model's OWN top-k masked, the other model's top-k carried over by ``transfer_heads``
(TRANSFERRED), and ``len(random_seeds)`` (default 20) sets of k RANDOM heads. The random sets are drawn
(``random_control``, seeded, nested in k) outside BOTH the own and the transferred top-max(k), so the
control never masks a head either ranking singles out. (No layer-matched control here: the own and the
transferred sets have different layer profiles, so there is no single set to match.) The conditions run
through ``run_conditions`` on the same evaluation samples in both models, so each masked condition has an
exact McNemar test against that model's unmasked baseline, and the own and transferred rows carry the
set-level empirical p-value against the random sets at their k (``p_vs_random``; see
``experiments.sweep``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from vrh_interp.experiments.conditions import Condition, ablation_for, control_conditions
from vrh_interp.experiments.sweep import SweepResult, run_conditions
from vrh_interp.evaluation.controls import DEFAULT_RANDOM_SEEDS
from vrh_interp.core.description.heads import HeadGeometry, HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.core.description.published import PublishedHeadSet, check_geometry
from vrh_interp.data.checks import GroundingSampleLike
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.core.execution.ablation_kinds import ablation_method
from vrh_interp.core.execution.templates.ablation import AblationValues
from vrh_interp.core.description.head_mapping import IncompatibleHeadGridError, TransferMapping, transfer_heads
from vrh_interp.evaluation.statistics import spearman, kendall_tau_b

if TYPE_CHECKING:
    from vrh_interp.experiments.demo_plan import DemoRun


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
    return (a.num_layers, a.num_heads, a.head_dim, a.num_kv_heads) == (b.num_layers, b.num_heads, b.head_dim,
                                                                       b.num_kv_heads)


def cross_conditions(own: HeadSet, transferred: HeadSet, geometry: HeadGeometry, ks: Sequence[int],
                     random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, *, ablation: str = "zero") -> list[Condition]:
    """The conditions run in one model: baseline, then per k > 0 own top-k, transferred top-k, the random sets
    (all masked with ``ablation``; the baseline masks nothing).

    ``own`` and ``transferred`` are rankings (best first) in this model's head grid.
    """
    ks = sorted(k for k in ks if k > 0)
    if len(set(ks)) != len(ks):
        raise ValueError(f"duplicate k values in {ks}")
    if ks and ks[-1] > min(len(own), len(transferred)):
        raise ValueError(f"k={ks[-1]} exceeds the rankings ({len(own)} own, {len(transferred)} transferred heads)")
    geometry.validate(own)
    geometry.validate(transferred)
    detected = own[: ks[-1]].union(transferred[: ks[-1]]) if ks else HeadSet()
    conditions = [Condition("baseline", 0, None, HeadSet())]
    for k in ks:
        conditions.append(Condition("own", k, None, own[:k], ablation))
        conditions.append(Condition("transferred", k, None, transferred[:k], ablation))
        try:
            conditions += control_conditions(geometry, detected, k, None, random_seeds, matched=False,
                                             ablation=ablation)
        except ValueError as error:
            raise ValueError(f"k={k}: {error} (the top {ks[-1]} heads of both rankings, {len(detected)} heads); "
                             "pass smaller ks") from None
    return conditions


@dataclass
class CrossMaskingResult:
    """Per masked model (by label): the ``SweepResult`` of its conditions and whose heads each kind is."""

    results: dict[str, SweepResult]
    sources: dict[str, str]  # masked model label -> label of the model whose top-k "transferred" are

    def summary(self, *, bootstrap_seed: int = 0) -> pd.DataFrame:
        """``SweepResult.summary`` rows of both models, with ``model`` (where the heads are masked) and
        ``heads_from`` (whose ranking chose them: the model itself, the other model, or '' for baseline
        and random)."""
        frames = []
        for model, result in self.results.items():
            frame = result.summary(bootstrap_seed=bootstrap_seed)
            heads_from = frame["condition"].map({"own": model, "transferred": self.sources[model]}).fillna("")
            frames.append(frame.assign(model=model, heads_from=heads_from))
        frame = pd.concat(frames, ignore_index=True)
        return frame[["model", "heads_from", *[c for c in frame.columns if c not in ("model", "heads_from")]]]


def cross_masking(vlm_a: VLM, vlm_b: VLM, scores_a: HeadScores | HeadSet, scores_b: HeadScores | HeadSet,
                  eval_samples: Sequence[GroundingSampleLike], *, ks: Sequence[int] = (0, 1, 3, 5, 10, 20),
                  random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, labels: tuple[str, str] = ("A", "B"),
                  mapping: TransferMapping = "identity", iou_threshold: float = 0.5, batch_size: int = 8,
                  max_new_tokens: int = 24, run_dir: str | Path | None = None,
                  progress: bool = True, ablation: str = "zero",
                  ablation_values: tuple[AblationValues | None, AblationValues | None] = (None, None)
                  ) -> CrossMaskingResult:
    """k-sweep of own, transferred and random heads masked in each model of a pair (the paper's Fig. 7).

    ``scores_a`` / ``scores_b`` are each model's head scores (or rankings). A's ranking is carried into B's
    grid with ``transfer_heads(..., mapping)`` and vice versa; with the default ``"identity"`` the grids
    must be equal (``IncompatibleHeadGridError`` otherwise). The evaluation samples must be disjoint from
    both models' detection samples. ``run_dir`` holds one resumable run folder per masked model
    (``masked_in_<label>``). Each model runs where its handle is placed (``vlm.on``). ``ablation`` "mean" or
    "resample" needs each model's own reference outputs, ``ablation_values=(values_a, values_b)``
    (``evaluation.grounding.ablation_values`` of each model on its detection samples). A published ranking
    (``vrh_interp.core.description.published``) is checked against its model's grid and recorded in each run folder's
    manifest (``heads_source``: ``own`` and ``transferred``).
    """
    if labels[0] == labels[1]:
        raise ValueError(f"the two models need different labels, got {labels}")
    sample_ids = {s.sample_id for s in eval_samples}
    rankings = []
    for scores, label in ((scores_a, labels[0]), (scores_b, labels[1])):
        if isinstance(scores, HeadScores):
            overlap = sorted(sample_ids & set(scores.sample_ids))
            if overlap:
                raise ValueError(f"{len(overlap)} evaluation samples were used to detect {label}'s heads (e.g. "
                                 f"{overlap[:3]}): detection and evaluation samples must be disjoint")
            rankings.append(scores.ranking())
        else:
            rankings.append(scores)
    folders = [re.sub(r"[^A-Za-z0-9_.-]+", "_", label) for label in labels]
    if folders[0] == folders[1]:
        raise ValueError(f"labels {labels} map to the same run folder name {folders[0]!r}")
    # every condition first (a grid mismatch fails before any grounding), then A's model, then B's
    plan = []
    for target, source, own, other, label, other_label, folder, values in (
            (vlm_a, vlm_b, rankings[0], rankings[1], labels[0], labels[1], folders[0], ablation_values[0]),
            (vlm_b, vlm_a, rankings[1], rankings[0], labels[1], labels[0], folders[1], ablation_values[1])):
        check_geometry(own, target.geometry)
        transferred = transfer_heads(other, source.geometry, target.geometry, mapping)
        ablation_for(ablation, values, target.geometry)  # a missing or mismatched reference fails before any run
        published = {kind: ranking.source.to_dict() for kind, ranking in (("own", own), ("transferred", other))
                     if isinstance(ranking, PublishedHeadSet)}
        plan.append((target, label, other_label, folder, values, published or None,
                     cross_conditions(own, transferred, target.geometry, ks, random_seeds, ablation=ablation)))
    results, sources = {}, {}
    needs_values = ablation_method(ablation).needs_reference_values
    for target, label, other_label, folder, values, heads_source, conditions in plan:
        results[label] = run_conditions(target, eval_samples, conditions, iou_threshold=iou_threshold,
                                        batch_size=batch_size, max_new_tokens=max_new_tokens, progress=progress,
                                        ablation_values=values if needs_values else None,
                                        run_dir=None if run_dir is None else Path(run_dir) / f"masked_in_{folder}",
                                        heads_source=heads_source)
        sources[label] = other_label
    return CrossMaskingResult(results=results, sources=sources)


def masking_drops(summary: pd.DataFrame, k: int) -> pd.DataFrame:
    """Accuracy drop from each model's baseline at one k, for own, transferred and random heads (the mean over
    the random sets), with the set-level empirical p-values of own and transferred against the random sets.
    The verdict on transfer is the claims rule on the per-item records (``experiments.verdicts.transfer_evidence``
    and ``evaluation.claims.decide(CLAIMS["shared"], ...)``), not a column here.

    ``summary`` is ``CrossMaskingResult.summary()`` (or its CSV read back); one row per masked model.
    """
    rows = []
    for model, part in summary.groupby("model", sort=False):
        base = _accuracy(part, "baseline", 0)
        source = part.loc[part["condition"] == "transferred", "heads_from"].iloc[0]
        random = part[(part["condition"] == "random") & (part["k"] == k) & (part["seed"].astype(str) == "all")]
        rows.append({"direction": f"{source}'s heads masked in {model}", "k": k, "baseline": base,
                     "own_drop": base - _accuracy(part, "own", k),
                     "transferred_drop": base - _accuracy(part, "transferred", k),
                     "random_drop": base - _accuracy(part, "random", k),
                     "random_sets": int(random["sets"].iloc[0]) if len(random) else 0,
                     "own_p_vs_random": float(_row(part, "own", k)["p_vs_random"]),
                     "transferred_p_vs_random": float(_row(part, "transferred", k)["p_vs_random"]),
                     "transferred_p_vs_baseline": float(_row(part, "transferred", k)["p_value_vs_baseline"])})
    return pd.DataFrame(rows)


def _row(part: pd.DataFrame, condition: str, k: int) -> pd.Series:
    row = part[(part["condition"] == condition) & (part["k"] == k)]
    if len(row) != 1:
        raise ValueError(f"the summary has {len(row)} {condition} rows at k={k} for one model, expected 1")
    return row.iloc[0]


def _accuracy(part: pd.DataFrame, condition: str, k: int) -> float:
    """Accuracy of one summary row (random: the seed "all" row, the mean over the random sets)."""
    row = part[(part["condition"] == condition) & (part["k"] == k)]
    if condition == "random":
        row = row[row["seed"].astype(str) == "all"]
    if len(row) != 1:
        raise ValueError(f"the summary has {len(row)} {condition} rows at k={k} for one model, expected 1")
    return float(row["accuracy"].iloc[0])


def run(spec: Any, vlm: VLM, folder: Path) -> CrossMaskingResult:
    """``vrh transfer`` / a grid's transfer cell (``builtin_specs.TransferSpec``): cross-masking of the pair on the
    evaluation samples, ``cross_masking_summary.csv`` and ``transfer_drops.csv`` (at the largest k) in ``folder``.
    The partner is loaded here, placed as ``vlm`` is."""
    from vrh_interp.core.bookkeeping.runs import write_atomic
    from vrh_interp.data.sources import load_data
    from vrh_interp.experiments.ks import parse_ks
    from vrh_interp.specs import load_spec

    partner = load_spec(spec.partner, spec.device, spec.dtype).on(vlm.placement)
    ks = parse_ks(spec.ks, vlm.geometry.total_heads)
    label_a, label_b = spec.labels.split(",")
    result = cross_masking(vlm, partner, HeadScores.load(spec.scores), HeadScores.load(spec.partner_scores),
                           load_data(spec.data), ks=ks, random_seeds=range(spec.random_sets),
                           labels=(label_a, label_b), iou_threshold=spec.iou, batch_size=spec.batch_size,
                           max_new_tokens=spec.max_new_tokens, run_dir=folder, progress=spec.progress)
    summary = result.summary()
    write_atomic(folder / "cross_masking_summary.csv", summary.to_csv(index=False))
    write_atomic(folder / "transfer_drops.csv", masking_drops(summary, max(ks)).to_csv(index=False))
    return result


# ------------------------------------------------------------------------------------ its step in `vrh demo`


def sequential_sets(run: DemoRun, folder: Path, streams: Sequence[tuple[str, str]], target: str,
                    answer: Any, first: int, block: int) -> dict[str, SweepResult] | None:
    """``designs.sequential_sets`` at k* with the demo's ``rank_sets`` and ``RANK_H``, saying what it drew."""
    from vrh_interp.experiments.designs import RANK_H, sequential_sets as drawn

    merged = drawn(streams, answer, folder, k=run.k_star, target=target, total=run.sizes.rank_sets, first=first,
                   block=block, h=RANK_H)
    for unit, result in (merged or {}).items():
        sets = {kind: sum(1 for c in result.conditions if c.kind == kind) for _, kind in streams}
        print(f"      rank test{'' if unit == 'grounding' else ' (' + unit + ')'}: "
              f"{', '.join(f'{n} {kind}' for kind, n in sets.items())} sets on "
              f"{result.records['sample_id'].nunique()} items, {len(result.records)} answers (stopped once "
              f"{RANK_H} were as harmful as the {target} set)", flush=True)
    return merged

def demo_step(run: DemoRun) -> None:
    """Step 8: transfer to the second model (cross-masking at k*), where it shares the head grid."""
    from vrh_interp.experiments import verdicts as ev
    from vrh_interp.experiments.demo_plan import ANSWER_TOKENS, SEED_STRIDE, detect_scores, load
    from vrh_interp.experiments.sweep import restrict
    from vrh_interp.experiments.designs import check_subset

    run.evidence["shared"] = None
    if not (run.transfer_ready and run.steps.open(8, f"transfer to {run.transfer_model}: cross-masking at "
                                                     f"k*={run.k_star}")):
        return
    k_star, out = run.k_star, run.out
    vlm_b = load(run.transfer_model, run.device, run.dtype)
    if same_grid(run.vlm.geometry, vlm_b.geometry):
        _, scores_b = detect_scores(vlm_b, run.detect, out / "detect_b", run.batch_size)
        scores_b.save(out / "scores-vrh-b.json")
        transfer = compare_scores(run.scores, scores_b, ks=sorted({k_star, 2 * k_star, 3 * k_star}))
        transfer.to_csv(out / "transfer.csv", index=False)
        labels = (f"A ({run.model_spec})", f"B ({run.transfer_model})")
        crossed = cross_masking(run.vlm, vlm_b, run.scores, scores_b, run.checks, ks=[0, k_star],
                                random_seeds=run.seeds, labels=labels, batch_size=run.batch_size,
                                max_new_tokens=ANSWER_TOKENS, run_dir=out / "cross")

        def answer(seeds: list[int], _kinds: set[str], folder: Path, partner: Any = vlm_b) -> dict[str, SweepResult]:
            if set(seeds) <= set(run.seeds):  # the cross-masking's own sets: answered there, on these items too
                ids = [s.sample_id for s in rank_items]
                return {label: restrict(result, ids, lambda c: c.k == k_star and (
                    c.kind == "transferred" or (c.kind == "random" and c.seed in seeds)))
                        for label, result in crossed.results.items()}
            return dict(cross_masking(run.vlm, partner, run.scores, scores_b, rank_items, ks=[0, k_star],
                                      random_seeds=seeds, labels=labels, batch_size=run.batch_size,
                                      max_new_tokens=ANSWER_TOKENS, run_dir=folder, progress=False).results)

        rank_items = check_subset(run.checks, run.sizes.rank_items)
        rank = sequential_sets(run, out / "cross_rank", [(label, "random") for label in crossed.results],
                               "transferred", answer, run.seed * SEED_STRIDE, run.sizes.random_sets)
        curves = crossed.summary()
        curves.to_csv(out / "cross_masking.csv", index=False)
        masking_drops(curves, k_star).to_csv(out / "transfer_masking.csv", index=False)
        run.evidence["shared"] = ev.transfer_evidence(crossed.results, k_star, seed=run.seed, rank=rank)
    else:
        print("      the two models do not share a head grid: transfer skipped")
    del vlm_b
