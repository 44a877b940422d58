"""Design-space search, sparsity and stability of head scores (paper Fig. 2, Fig. 5, Fig. 8b/c, Tab. A9).

All of these reuse ONE detection pass: the per-sample statistics hold what every design needs, so
variants differ only in aggregation, and stability resamples the stored samples instead of rerunning.

The design-space evaluation also masks ``len(random_seeds)`` (default 20) random sets of k heads, drawn
outside the union of every variant's top-k (no control masks a head some variant singles out), and each
variant's accuracy is compared with that distribution at the same k (set-level empirical p-value, see
``evaluation.statistics``): a variant's drop only counts as causal when few random sets are as harmful.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from vrh_interp.experiments.conditions import Condition, control_conditions
from vrh_interp.experiments.builtin_specs import DesignSpaceSpec, needs_reference_values
from vrh_interp.experiments.sweep import SweepResult, run_conditions
from vrh_interp.evaluation.controls import DEFAULT_RANDOM_SEEDS
from vrh_interp.core.execution.ablation_kinds import DEFAULT_ABLATION_KIND
from vrh_interp.core.description.heads import HeadGeometry, HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.data.checks import GroundingSampleLike
from vrh_interp.scoring.collect import SampleStats
from vrh_interp.scoring.design import PRESETS, ScoringDesign, design_space_variants
from vrh_interp.scoring.detect import scores_from_stats
from vrh_interp.core.execution.templates.ablation import AblationValues

if TYPE_CHECKING:
    from vrh_interp.experiments.demo_plan import DemoRun


def design_variants(include_presets: bool = True) -> dict[str, ScoringDesign]:
    variants = dict(design_space_variants())
    if include_presets:
        variants.update({f"preset:{name}": p.design for name, p in PRESETS.items()})
    return variants


def check_disjoint(stats: Sequence[SampleStats], eval_samples: Sequence[GroundingSampleLike]) -> None:
    overlap = sorted({s.sample_id for s in stats} & {s.sample_id for s in eval_samples})
    if overlap:
        raise ValueError(f"evaluation samples overlap the detection samples (e.g. {overlap[:3]}): use disjoint sets")


@dataclass(frozen=True)
class DesignSpacePlan:
    """The conditions a design-space search evaluates: the baseline, one per distinct top-k set, then the
    random sets of k heads."""

    k: int
    conditions: list[Condition]
    rankings: dict[str, HeadSet]  # variant -> its top-k heads
    key_of: dict[str, str]  # variant -> the key of the condition masking its top-k
    undefined: list[str]  # variants undefined on these statistics


def _grid(stats: Sequence[SampleStats]) -> HeadGeometry:
    """The layer x head grid of the statistics (all a random draw needs; kv heads and head_dim do not matter)."""
    layers, heads = stats[0].neg_entropy.shape
    return HeadGeometry(int(layers), int(heads), int(heads), 1)


def design_space_plan(stats: Sequence[SampleStats], *, k: int = 20, variants: dict[str, ScoringDesign] | None = None,
                      random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, ablation: str = "zero") -> DesignSpacePlan:
    """Score every variant from ``stats``; variants whose top-k sets coincide share one condition; one random
    set of k heads per seed, outside the union of all variants' top-k; every set masked with ``ablation``."""
    variants = variants or design_variants()
    rankings: dict[str, HeadSet] = {}
    undefined: list[str] = []
    for name, design in variants.items():
        try:
            rankings[name] = scores_from_stats(stats, design).ranking()[:k]
        except ValueError:  # e.g. correct_only with no correct sample: the variant is undefined on these samples
            undefined.append(name)
    conditions = [Condition("baseline", 0, None, HeadSet())]
    key_of: dict[str, str] = {}
    by_heads: dict[tuple, str] = {}
    for name, heads in rankings.items():
        signature = tuple(sorted(heads))
        if signature not in by_heads:
            cond = Condition(f"variant{len(by_heads)}", k, None, heads, ablation)
            by_heads[signature] = cond.key
            conditions.append(cond)
        key_of[name] = by_heads[signature]
    if random_seeds:
        detected = HeadSet(dict.fromkeys(h for heads in rankings.values() for h in heads))
        try:
            conditions += control_conditions(_grid(stats), detected, k, None, random_seeds, matched=False,
                                             ablation=ablation)
        except ValueError as error:
            raise ValueError(f"design space at k={k}: {error} (the union of the variants' top-{k}, {len(detected)} "
                             "heads); use a smaller k, or no random sets (random_seeds=(), --random-sets 0) to rank "
                             "the variants without a random control") from None
    return DesignSpacePlan(k, conditions, rankings, key_of, undefined)


def design_space_table(plan: DesignSpacePlan, result: SweepResult) -> pd.DataFrame:
    """Variants ranked by the accuracy drop their top-k causes, from the evaluation of ``plan.conditions``, with
    the random sets' mean accuracy at k and each variant's empirical p-value against them (``p_vs_random``;
    NaN without random sets)."""
    if [(c.key, c.heads.to_list()) for c in result.conditions] != [(c.key, c.heads.to_list()) for c in plan.conditions]:
        raise ValueError("the evaluation was run for other conditions than this plan's (different statistics, "
                         "k or variants)")
    summary = result.summary().set_index("key")
    baseline = float(summary.loc["baseline:k=0", "accuracy"])
    ablation = next((c.ablation for c in plan.conditions if c.kind != "baseline"), "zero")
    random_key = f"random:k={plan.k}:seed=all" + (f":ablation={ablation}" if ablation != DEFAULT_ABLATION_KIND else "")
    random_mean = float(summary.loc[random_key, "accuracy"]) if random_key in summary.index else float("nan")
    random_sets = int(summary.loc[random_key, "sets"]) if random_key in summary.index else 0
    rows = []
    for name, heads in plan.rankings.items():
        masked = summary.loc[plan.key_of[name]]
        rows.append({"variant": name, "k": plan.k, "top_heads": ",".join(heads.to_list()),
                     "accuracy_masked": float(masked["accuracy"]), "accuracy_ci_low": float(masked["accuracy_ci_low"]),
                     "accuracy_ci_high": float(masked["accuracy_ci_high"]), "baseline_accuracy": baseline,
                     "drop": baseline - float(masked["accuracy"]),
                     "parse_failure_rate": float(masked["parse_failure_rate"]),
                     "p_value_vs_baseline": float(masked["p_value_vs_baseline"]),
                     "random_mean_accuracy": random_mean, "random_sets": random_sets,
                     "p_vs_random": float(masked["p_vs_random"])})
    for name in plan.undefined:
        rows.append({"variant": name, "k": plan.k, "top_heads": "", "accuracy_masked": float("nan"),
                     "baseline_accuracy": baseline, "drop": float("nan")})
    return pd.DataFrame(rows).sort_values("drop", ascending=False, na_position="last").reset_index(drop=True)


def design_space_from_run(run_dir: str | Path, *, variants: dict[str, ScoringDesign] | None = None) -> pd.DataFrame:
    """The table of a design-space run folder (``run_dir/detect`` complete, ``run_dir/design_space`` complete,
    e.g. merged shards), without the model: what ``design_space`` returned for it. The random seeds are those
    the folder holds (none for a folder written before design spaces had random sets)."""
    from vrh_interp.experiments.sweep import sweep_from_run
    from vrh_interp.scoring.detect import stats_from_run

    result = sweep_from_run(Path(run_dir) / "design_space")
    masked = [c for c in result.conditions if c.kind != "baseline"]
    k = masked[0].k if masked else 0
    seeds = [c.seed for c in result.conditions if c.kind == "random"]
    plan = design_space_plan(stats_from_run(Path(run_dir) / "detect"), k=k, variants=variants, random_seeds=seeds,
                             ablation=masked[0].ablation if masked else "zero")
    return design_space_table(plan, result)


def design_space(vlm: VLM, stats: Sequence[SampleStats], eval_samples: Sequence[GroundingSampleLike], *, k: int = 20,
                 variants: dict[str, ScoringDesign] | None = None,
                 random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, batch_size: int = 8, max_new_tokens: int = 24,
                 run_dir: str | Path | None = None, progress: bool = True, ablation: str = "zero",
                 ablation_values: AblationValues | None = None) -> pd.DataFrame:
    """Mask each variant's top-k heads on ``eval_samples``; rank variants by the accuracy drop they cause.

    One unmasked baseline is shared by all variants; variants whose top-k sets coincide are evaluated once;
    ``random_seeds`` random sets of k heads are the control (module doc).
    The evaluation is stored under ``run_dir / "design_space"``. To split it across machines, run
    ``run_conditions(vlm, eval_samples, design_space_plan(stats, k=k).conditions, shard=...)`` per shard, merge
    the folders (``merge_runs``) and pass ``sweep_from_run(merged)`` to ``design_space_table``. A remote
    handle sends one request per batch per condition. Only this function runs the model: the
    plan, the table and the stability analyses work on stored statistics. ``ablation`` "mean" / "resample"
    masks with ``ablation_values`` (``evaluation.grounding.ablation_values`` on the detection samples).
    The handle's backend (``vlm.on(backend=...)``) runs the conditions.
    """
    check_disjoint(stats, eval_samples)
    plan = design_space_plan(stats, k=k, variants=variants, random_seeds=random_seeds, ablation=ablation)
    result = run_conditions(vlm, eval_samples, plan.conditions, batch_size=batch_size, max_new_tokens=max_new_tokens,
                            run_dir=None if run_dir is None else Path(run_dir) / "design_space", progress=progress,
                            ablation_values=ablation_values)
    return design_space_table(plan, result)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def topk_overlap(a: HeadSet, b: HeadSet, k: int) -> float:
    return len(set(a[:k]) & set(b[:k])) / k


def stability(stats: Sequence[SampleStats], design: ScoringDesign | str = "vrh", *, k: int = 20,
              sizes: Sequence[int] = (5, 10, 20, 50, 100, 200), resamples: int = 10, seed: int = 0) -> pd.DataFrame:
    """Top-k overlap with the all-sample ranking when scoring on n resampled samples (paper Fig. 8c)."""
    from vrh_interp.scoring.design import resolve_design

    design = resolve_design(design)
    reference = scores_from_stats(stats, design).ranking()
    rng = np.random.default_rng(seed)
    rows, every = [], {}
    for n in sizes:
        if n > len(stats):
            continue
        overlaps = []
        for _ in range(resamples):
            chosen = rng.choice(len(stats), size=n, replace=False)
            try:
                ranking = scores_from_stats([stats[i] for i in chosen], design).ranking()
            except ValueError:
                continue
            overlaps.append(topk_overlap(ranking, reference, k))
        if overlaps:
            every[n] = overlaps
            rows.append({"samples": n, "k": k, "mean_overlap": float(np.mean(overlaps)),
                         "min_overlap": float(np.min(overlaps)), "max_overlap": float(np.max(overlaps)),
                         "resamples": len(overlaps), "reference_samples": len(stats)})
    table = pd.DataFrame(rows)
    table.attrs["overlaps"] = every  # samples -> each resample's overlap (the claims' stability evidence)
    return table


def token_choice_stability(stats: Sequence[SampleStats], *, k: int = 20,
                           seeds: Sequence[int] = (0, 1, 2)) -> pd.DataFrame:
    """Top-k overlap of single-random-output-token scoring with all-output-token scoring (paper Fig. 8b)."""
    reference = scores_from_stats(stats, ScoringDesign("output", "sum", "mean")).ranking()
    rows = []
    for seed in seeds:
        design = replace(ScoringDesign("random_output", "sum", "mean"), seed=seed)
        ranking = scores_from_stats(stats, design).ranking()
        rows.append({"query_set": "random_output", "seed": seed, "k": k,
                     "overlap_with_all_output_tokens": topk_overlap(ranking, reference, k)})
    return pd.DataFrame(rows)


def run(spec: DesignSpaceSpec, vlm: VLM, folder: Path) -> Any:
    """``vrh design-space`` / a grid's cell: every variant's top-k masked against random sets, ``design_space.csv``
    in ``folder``; a shard's records. Every shard collects ALL detection statistics (they pick the heads to mask),
    or resumes from a merged ``vrh detect --shard`` folder copied to ``folder/detect``."""
    from vrh_interp.core.bookkeeping.runs import write_atomic
    from vrh_interp.data.sources import load_data
    from vrh_interp.evaluation.grounding import ablation_values
    from vrh_interp.scoring.detect import collect_detection_stats

    detect, evaluate = load_data(spec.data), load_data(spec.eval_data)
    stats = collect_detection_stats(vlm, detect, batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens,
                                    run_dir=folder / "detect", dataset=spec.data)
    values = None
    if needs_reference_values(spec.ablation):  # reference outputs from the same detection samples
        values = ablation_values(vlm, detect, batch_size=spec.batch_size, progress=spec.progress)
        values.save(folder / "ablation_values.pt")
    seeds = range(spec.random_sets)
    if spec.shard is not None:
        check_disjoint(stats, evaluate)
        plan = design_space_plan(stats, k=spec.k, random_seeds=seeds, ablation=spec.ablation)
        return run_conditions(vlm, evaluate, plan.conditions, batch_size=spec.batch_size,
                              max_new_tokens=spec.max_new_tokens, run_dir=folder / "design_space", shard=spec.shard,
                              ablation_values=values)
    table = design_space(vlm, stats, evaluate, k=spec.k, random_seeds=seeds, batch_size=spec.batch_size,
                         max_new_tokens=spec.max_new_tokens, run_dir=folder, ablation=spec.ablation,
                         ablation_values=values)
    write_atomic(folder / "design_space.csv", table.to_csv(index=False))
    return table


# ------------------------------------------------------------------------------------ its step in `vrh demo`

def demo_step(run: DemoRun) -> None:
    """Step 6: the scoring design space at k*."""
    from vrh_interp.experiments import verdicts as ev
    from vrh_interp.experiments.demo_plan import ANSWER_TOKENS
    from vrh_interp.experiments.sweep import sweep_from_run

    if not run.steps.open(6, f"design space at k={run.k_star} on the {len(run.checks)} fixed items"):
        return
    design = design_space(run.placed, run.stats, run.checks, k=run.k_star, random_seeds=run.seeds,
                          batch_size=run.batch_size, max_new_tokens=ANSWER_TOKENS, run_dir=run.out)
    design.to_csv(run.out / "design_space.csv", index=False)
    plan = design_space_plan(run.stats, k=run.k_star, random_seeds=run.seeds)
    run.evidence["design_space"] = ev.design_evidence(sweep_from_run(run.out / "design_space").records, plan.key_of,
                                                      "Q=output, Phi=sum, Omega=mean", seed=run.seed)


def sparsity_step(run: DemoRun) -> None:
    """Step 7: sparsity and stability of the scores."""
    from vrh_interp.experiments import verdicts as ev

    if not run.steps.open(7, "sparsity and stability"):
        return
    stats, out, k_star = run.stats, run.out, run.k_star
    run.scores.sparsity().to_csv(out / "sparsity.csv", index=False)
    stability(stats, k=k_star, sizes=(2, 5, 10, 20, 50, 100, 200)).to_csv(out / "stability.csv", index=False)
    token_choice_stability(stats, k=k_star).to_csv(out / "token_stability.csv", index=False)
    run.evidence["sparse"] = ev.sparse_evidence(stats, seed=run.seed)
    run.evidence["stable"] = ev.stability_evidence(stats, k_star, seed=run.seed)
